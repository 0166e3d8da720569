"""What a run dir is, and the one rule every start of ``segadv-train`` follows in it
(docs/checkpoints.md "The run dir").

- A run dir's identity is its checkpoint: a resume compares the config it is given with the one
  stored in the checkpoint it loads, and any difference outside ``RESUME_MAY_CHANGE``
  (``segadv/config/resume.py``) is refused naming the key. Without ``--config``, a resume reads ``config.yaml``; a missing or empty
  one is rebuilt from the checkpoint, an unreadable one set aside.
- A fresh start needs a run dir holding none of a run's files (:data:`RUN_FILES`): a second run
  never appends to the first one's metrics or TensorBoard, nor replaces its ``config.yaml``.
- A start that fails before the first step removes what it created there (:class:`StartCleanup`).
- Every file in it is written through segadv's one writer (segadv/fsutil.py), the log (``train.log``)
  and the lock (``.segadv.lock``) included: a file there that is a symbolic link is replaced by a
  regular file, never written through (the file it points at is left as it was); a device, FIFO,
  socket or directory where a file belongs, or a link to one, is refused before anything is written
  (:func:`check_run_paths`, exit 2 naming it). Its folders (``checkpoints``, ``tensorboard``, and the
  trackers' ``wandb`` and ``mlruns``, whose files their libraries write) may be
  links to folders, as the run dir itself may: where a folder lies is the user's to choose.
- A resumed run that already reached ``train.max_steps`` says so and trains nothing; a
  ``train.max_steps`` below the checkpoint's step is refused.
- A run that keeps nothing (``train.smoke``) runs in a throwaway run dir of its own
  (:func:`throwaway_run_dir`), removed at its end: the run dir the config names is neither made
  nor read.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from segadv.checkpoint.run_checkpoint import checkpoint_file
from segadv.config import Config, config_from_dict, load_config
from segadv.config.loading import read_yaml
from segadv.config.resume import check_resumed_config
from segadv.config.schema import best_score_by
from segadv.errors import UserError, WriteFailed
from segadv.fsutil import check_output, check_output_dir, unwritable, user_path
from segadv.monitor.writer import read_records
from segadv.parallel import distributed
from segadv.parallel.distributed import DistEnv
from segadv.readback import Unreadable, os_reason
from segadv.signals import Interrupted, deferred

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
# What segadv-train writes in a run dir; a fresh start refuses a dir holding any of them.
RUN_FILES = ("config.yaml", "metrics.jsonl", "tensorboard", "checkpoints", "data_split.json", "skipped.json",
             "status.json", "train.log", "trackers.json", "wandb", "mlruns")

def check_steps(step: int, max_steps: int, checkpoint: Path | None) -> None:
    """A resume at ``step`` with ``train.max_steps``: below it nothing could train."""
    if step > max_steps:
        raise UserError(f"train.max_steps={max_steps} is below the step of {checkpoint} ({step}): nothing would "
                        f"train. Resume with train.max_steps above {step} to train on, or evaluate it with "
                        f"segadv-eval --checkpoint {checkpoint}")


# ------------------------------------------------------------------ where the run is


def run_dir_for(cfg: Config, config_name: str) -> Path:
    """The run dir ``cfg`` names (``run_dir``, ``~`` expanded), or a new ``runs/<config>-<time>``."""
    if cfg.run_dir is not None:
        return user_path(cfg.run_dir, "run_dir")
    return Path("runs") / f"{config_name}-{time.strftime('%Y%m%d-%H%M%S')}"


THROWAWAY_PREFIX = "segadv-smoke-"


@contextlib.contextmanager
def throwaway_run_dir(env: DistEnv) -> Iterator[Path]:
    """The run dir of a run that keeps nothing (``train.smoke``): a new folder in the system's temp
    dir (``TMPDIR``: under a launch on several nodes, give one every node shares), made by rank 0
    and named to every rank (the process group is up), removed with everything in it when the run
    ends, whatever the end (rank 0; every rank has read what it reads by then: the checkpoint
    manager's read-back waits for all)."""
    made = tempfile.mkdtemp(prefix=THROWAWAY_PREFIX) if env.is_main else None
    path = Path(str(distributed.from_rank_zero(made)))
    try:
        yield path
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
            log.info("removed the throwaway run dir %s", made)


def run_files(run_dir: Path) -> list[str]:
    """The names of a run's files present in ``run_dir`` (empty folders do not count)."""
    found = []
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            if any(path.iterdir()):
                found.append(name + "/")
        elif path.exists():
            found.append(name)
    return found


def check_start(run_dir: Path, resume: str | None, config_path: Path | None = None) -> None:
    """Before anything is written: ``run_dir`` must be a directory (or not exist) and writable,
    and a fresh start (``resume`` None) needs one that holds no run's files."""
    check_reachable(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run dir {run_dir} exists and is not a directory")
    check_run_paths(run_dir)
    if resume is not None or not run_dir.is_dir():
        return
    saved = run_dir / CONFIG_FILE
    if config_path is not None and saved.exists() and _same_file(config_path, saved):
        raise UserError(f"--run-dir {run_dir} holds the input config {config_path}, which the run would write over: "
                        "choose another --run-dir (or pass --resume auto if it is that run's own config.yaml)")
    present = run_files(run_dir)
    if present:
        raise UserError(f"run dir {run_dir} already holds a run ({', '.join(present)}): continue it with "
                        f"segadv-train --run-dir {run_dir} --resume auto, or start a new run in another --run-dir")


# The run dir's files and folders segadv writes at fixed names (besides the step checkpoints, which
# the writer checks as it writes them).
RUN_DIR_FILES = ("config.yaml", "metrics.jsonl", "data_split.json", "skipped.json", "status.json", "train.log",
                 ".segadv.lock", "experiment.log", "trackers.json")
CHECKPOINT_FILES = ("last.pt", "best.pt", "best.json")
RUN_DIR_FOLDERS = ("checkpoints", "tensorboard", "wandb", "mlruns")  # wandb/, mlruns/: log.wandb, log.mlflow


def check_run_paths(run_dir: Path) -> None:
    """Before anything is written: each name segadv writes in ``run_dir`` holds a regular file, a
    link (replaced by the file when written), or nothing; each of its folders a folder or nothing.
    Anything else (a device, FIFO, socket, a link to one, a link loop) is a :class:`NotAFile`
    naming it (exit 2)."""
    if not run_dir.is_dir():
        return
    for name in RUN_DIR_FILES:
        check_output(run_dir / name)
    for name in RUN_DIR_FOLDERS:
        check_output_dir(run_dir / name, f"run dir {run_dir}: its folder")
    for name in CHECKPOINT_FILES:
        check_output(run_dir / CHECKPOINT_DIR / name)


def check_reachable(run_dir: Path) -> None:
    """A run dir that is a link leading nowhere (dangling, or a loop) is a UserError naming it:
    neither a directory to use nor a name ``mkdir`` can take."""
    if not run_dir.is_symlink():
        return
    try:
        os.stat(run_dir)
    except OSError as err:
        target = os.readlink(run_dir)
        what = "a symbolic link loop" if err.errno == errno.ELOOP else f"a symbolic link to {target}, which does not exist"
        raise UserError(f"run dir {run_dir} is {what} ({os_reason(err)}): remove the link or give another --run-dir") \
            from None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_writable(run_dir: Path) -> None:
    cause = unwritable(run_dir)
    if cause is not None:
        raise UserError(f"cannot write to run dir {run_dir}: {cause}")


class StartCleanup:
    """``with StartCleanup(run_dir, env) as start:`` ... ``start.done()`` once the run is under way.
    Until then, an exception removes what the start created in ``run_dir`` (the dir too, if it
    made it and it is empty then): a start that fails leaves nothing behind. Rank 0 removes."""

    def __init__(self, run_dir: Path, env: DistEnv = DistEnv()) -> None:
        self.run_dir = run_dir
        self.env = env
        self.existed = run_dir.is_dir()
        self.before = set(os.listdir(run_dir)) if self.existed else set()
        self.checkpoints_before = self._listing(run_dir / CHECKPOINT_DIR)
        self.kept = {name: kept for name in RUN_DIR_FILES
                     if (kept := KeptFile.of(run_dir / name)) is not None} if env.is_main else {}
        self.started = False

    @staticmethod
    def _listing(directory: Path) -> set[str] | None:
        return set(os.listdir(directory)) if directory.is_dir() else None

    def done(self) -> None:
        self.started = True

    @contextlib.contextmanager
    def entering(self, manager: Any) -> Iterator[Any]:
        """``with start.entering(RunDirLock(...)):`` a context entered before this clean-up (the lock,
        held while it removes): a write that fails entering it (a full disk writing the lock file,
        which held the lock then), or a signal once the run dir is this start's (the manager's
        ``ours``), removes what the start created all the same. Any other failure (the run dir in
        use by another run) touches nothing: the run dir is not this start's."""
        try:
            entered = manager.__enter__()
        except BaseException as err:
            if isinstance(err, WriteFailed) or (isinstance(err, Interrupted) and getattr(manager, "ours", False)):
                with deferred():
                    self.__exit__(type(err), err, err.__traceback__)
                    manager.__exit__(type(err), err, err.__traceback__)  # the lock, let go once the clean-up is done
            raise
        try:
            yield entered
        except BaseException:
            if not manager.__exit__(*sys.exc_info()):
                raise
        else:
            manager.__exit__(None, None, None)

    def __enter__(self) -> "StartCleanup":
        return self

    def remove_made_dir(self) -> None:
        """A start that failed before its clean-up was entered (the run dir's write probe, the
        lock refused): the run dir goes if the start made it and nothing is in it."""
        if self.existed or not self.env.is_main:
            return
        with contextlib.suppress(OSError):
            self.run_dir.rmdir()  # only an empty one

    def __exit__(self, exc_type: type | None, *_: object) -> None:
        if exc_type is None or self.started or not self.env.is_main or not self.run_dir.is_dir():
            return
        try:
            self._remove_new_entries()
        except OSError as err:
            log.warning("could not remove what the failed start wrote in %s: %s", self.run_dir, err)

    def _remove_new_entries(self) -> None:
        ckpt_dir = self.run_dir / CHECKPOINT_DIR
        if self.checkpoints_before is not None and ckpt_dir.is_dir():
            for name in set(os.listdir(ckpt_dir)) - self.checkpoints_before:
                _remove(ckpt_dir / name)
        for name in set(os.listdir(self.run_dir)) - self.before:
            _remove(self.run_dir / name)
        for kept in self.kept.values():  # a resume's status.json, train.log, lock: as they were
            kept.restore()
        if not self.existed and not any(self.run_dir.iterdir()):
            self.run_dir.rmdir()
        log.info("the start failed: removed what it wrote in %s", self.run_dir)


@dataclass
class KeptFile:
    """A run dir file as it was before a start (its bytes, or for a large append-only log its
    length, and its times), put back when the start fails or is interrupted: a refused or
    interrupted start of a resume leaves status.json, train.log, the lock, config.yaml and
    metrics.jsonl byte for byte and time for time as they were."""

    path: Path
    data: bytes | None  # None: a large file, only ever appended to at the start (train.log)
    size: int
    times: tuple[int, int]  # atime, mtime (ns)

    LARGE = 1 << 20

    @classmethod
    def of(cls, path: Path) -> "KeptFile | None":
        try:
            if path.is_symlink() or not path.is_file():
                return None
            stat = path.stat()
            data = path.read_bytes() if stat.st_size <= cls.LARGE else None
        except OSError:
            return None
        return cls(path, data, stat.st_size, (stat.st_atime_ns, stat.st_mtime_ns))

    def unchanged(self) -> bool:
        try:
            stat = self.path.stat()
        except OSError:
            return False
        return not self.path.is_symlink() and stat.st_size == self.size and stat.st_mtime_ns == self.times[1]

    def restore(self) -> None:
        if self.unchanged():
            return
        if self.data is not None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                os.ftruncate(fd, 0)
                with os.fdopen(fd, "wb", closefd=False) as fh:
                    fh.write(self.data)
                os.fsync(fd)
            finally:
                os.close(fd)
        elif self.path.stat().st_size >= self.size:
            os.truncate(self.path, self.size)  # what the start appended, taken off
        else:
            log.warning("%s changed during the failed start and cannot be put back", self.path)
            return
        os.utime(self.path, ns=self.times)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


# ------------------------------------------------------------------ the config a run resumes with


def saved_config_problem(path: Path) -> str | None:
    """What is wrong with a run dir's ``config.yaml`` before it is validated: "missing", "empty",
    or why it cannot be read (through the config loader and its caps: bytes, nesting, aliases);
    None when it reads as a mapping."""
    try:
        data = read_yaml(path, str(path))
    except FileNotFoundError:
        return "missing"
    except Unreadable as err:
        return err.reason.removeprefix("is ")
    if data is None or data == {}:
        return "empty"
    if not isinstance(data, dict):
        return f"not a mapping of keys (a YAML {type(data).__name__})"
    return None


def resume_config(run_dir: Path, resume: str, overrides: list[str], trusted: bool = False,
                  set_aside: bool = True) -> Config:
    """The config a resume without ``--config`` runs with: the run dir's ``config.yaml`` with
    ``overrides``. A missing or empty one is rebuilt from the config stored in the checkpoint the
    resume loads (one log line; the run writes it back); an unreadable one is set aside, with a
    warning, when a checkpoint holds the config, else a UserError naming it. Without any
    checkpoint (``--resume auto`` in a run dir that has none) the run starts fresh: from the
    embedded default config when there is no config.yaml. ``set_aside`` False (``--print-config``):
    an unreadable one is left where it is, nothing on disk changes."""
    check_reachable(run_dir)
    saved = run_dir / CONFIG_FILE
    problem = saved_config_problem(saved)
    if problem is None:
        return load_config(saved, overrides, saved=True)  # written by segadv: read as segadv/config/renamed.py says
    found = stored_config(run_dir, resume, trusted)
    if found is None:
        if problem in ("missing", "empty"):
            return load_config(None, overrides)
        raise UserError(f"{saved} is {problem}, and no checkpoint in {run_dir / CHECKPOINT_DIR} holds the run's "
                        "config: repair or remove it, or pass --config")
    checkpoint, config = found
    if problem not in ("missing", "empty") and set_aside:
        aside = saved.with_name(f"{saved.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(saved, aside)
        log.warning("%s is %s: moved it to %s", saved, problem, aside.name)
    log.info("%s is %s: rebuilt from the config stored in %s", saved, problem if problem in ("missing", "empty")
             else "set aside", checkpoint)
    return config_from_dict(config, overrides, source=f"the config stored in {checkpoint}")


# --resume's names for a run dir's own checkpoints (besides "auto", the newest that loads).
RESUME_NAMES = {"last": "last.pt", "best": "best.pt"}


def named_checkpoint(resume: str | None, run_dir: str | Path | None) -> str | None:
    """``--resume last`` / ``--resume best`` as the path of the run dir's ``checkpoints/last.pt`` /
    ``checkpoints/best.pt``; any other value as it is. A user error without a run dir, or when the
    file is not there (naming it and what to pass instead)."""
    if resume not in RESUME_NAMES:
        return resume
    if run_dir is None:
        raise UserError(f"--resume {resume} needs --run-dir: the run whose checkpoints/{RESUME_NAMES[resume]} "
                        "to continue")
    path = Path(run_dir) / CHECKPOINT_DIR / RESUME_NAMES[resume]
    try:
        present = checkpoint_file(path)  # a folder (a FIFO) there is named as one, never "does not exist"
    except UserError as err:
        raise UserError(f"--resume {resume}: {err}") from None
    if not present:
        why = ("best.pt is written at the run's first evaluation" if resume == "best"
               else "last.pt is written every checkpoint.every steps")
        raise UserError(f"--resume {resume}: {path} does not exist ({why}); --resume auto continues from the "
                        "newest checkpoint the run dir holds, or starts fresh in a run dir that holds none")
    return str(path)


def checkpoint_to_resume(run_dir: Path, resume: str, trusted: bool = False) -> tuple[Path, dict[str, Any]] | None:
    """``(path, checkpoint)`` that ``resume`` loads ("auto": the newest that loads in ``run_dir``,
    None when there is none; else the file it names)."""
    from segadv.checkpoint.io import read_checkpoint
    from segadv.checkpoint.manager import CheckpointManager

    if resume == "auto":
        return CheckpointManager(run_dir, every=1).newest_loadable(trusted)
    path = user_path(resume, "--resume")
    return path, read_checkpoint(path, trusted=trusted)


def stored_config(run_dir: Path, resume: str, trusted: bool = False) -> tuple[Path, dict[str, Any]] | None:
    """``(checkpoint, its config)`` for the checkpoint ``resume`` loads, or None when there is
    none or it holds no config."""
    found = checkpoint_to_resume(run_dir, resume, trusted)
    if found is None or not isinstance(found[1].get("config"), dict) or not found[1]["config"]:
        return None
    return found[0], found[1]["config"]


def save_config(cfg: Config, run_dir: Path, only_if_missing: bool = False) -> None:
    """``config.yaml``: the run's resolved config, without ``run_dir`` (a copy of the file used
    elsewhere must never point back into this run)."""
    from segadv.config import dump_config

    path = run_dir / CONFIG_FILE
    if only_if_missing and path.exists():
        return
    dump_config(cfg.model_copy(update={"run_dir": None}), path)


# ------------------------------------------------------------------ the checkpoint a run resumes from


@dataclass
class ResumePoint:
    """The checkpoint a resume will load: its path, step, best and latest evaluations."""

    path: Path
    step: int
    best: dict[str, Any] | None
    last_evaluation: dict[str, Any] | None
    early_stop: Any = None  # the checkpoint's train.early_stop count (segadv/training/early_stop.py)

    def finished(self, max_steps: int) -> bool:
        """Whether the run already reached ``max_steps`` (a UserError when it went past it)."""
        check_steps(self.step, max_steps, self.path)
        return self.step == max_steps

    def evaluation(self, run_dir: Path) -> dict[str, Any] | None:
        return stored_evaluation(self.last_evaluation, run_dir, self.step)


def resume_point(run_dir: Path, resume: str | None, config: Mapping[str, Any],
                 trusted: bool = False) -> ResumePoint | None:
    """Before anything is built or written: the checkpoint ``resume`` names ("auto": the newest
    that loads in ``run_dir``; None or nothing there: None, a fresh start), its config checked
    against ``config`` (:func:`check_resumed_config`). The checkpoint manager reads it again when
    it restores the run; a config that does not fit never gets to write a file."""
    if resume is None:
        return None
    found = checkpoint_to_resume(run_dir, resume, trusted)
    if found is None:
        return None
    path, ckpt = found
    if not isinstance(ckpt.get("step"), int):
        return None  # not a training state: the manager's restore says so
    check_resumed_config(ckpt.get("config"), config, path)
    if (run_dir / METRICS_FILE).is_file():
        read_records(run_dir / METRICS_FILE)  # a garbled history is refused before anything is written
    return ResumePoint(path, ckpt["step"], ckpt.get("best"), ckpt.get("evaluation"), ckpt.get("early_stop"))


# ------------------------------------------------------------------ a finished run


def stored_evaluation(evaluation: dict[str, Any] | None, run_dir: Path, step: int) -> dict[str, Any] | None:
    """The final evaluation of a run at ``step``: the checkpoint's record, or (a checkpoint
    written before it held one) the last ``val/mIoU`` of ``metrics.jsonl`` at that step."""
    if evaluation is not None and evaluation.get("step") == step:
        return evaluation
    try:
        records = read_records(run_dir / METRICS_FILE)
    except UserError:
        return None
    found = None
    for _, record in records:
        if record.get("step") == step and "val/mIoU" in record:
            found = {"step": step, "mIoU": record["val/mIoU"], "pixel_acc": record.get("val/pixel_acc")}
    return found


def finished_line(run_dir: Path, step: int, evaluation: dict[str, Any] | None, best: dict[str, Any] | None,
                  checkpoint: Path, early_stop: str | None = None, max_steps: int | None = None) -> str:
    """What a resume of a finished run says instead of training; ``early_stop``: why
    train.early_stop ended it (at ``step`` of ``max_steps``), where it did."""
    if evaluation is None:
        final = "its final evaluation is not recorded"
    else:
        accuracy = evaluation.get("pixel_acc")
        final = f"final val mIoU {evaluation['mIoU']:.4f}" + (
            f", pixel accuracy {accuracy:.4f}" if accuracy is not None else "")
    best_text = f"; best val mIoU {best['mIoU']:.4f} at step {best['step']}" if best else ""
    if best and best_score_by(best) != "val/mIoU":
        best_text += f" (chosen by {best['by']})"
    if early_stop is not None:  # its reason gives best.pt's best
        return (f"{run_dir} stopped early: step {step} of train.max_steps={max_steps}, {early_stop}; nothing to "
                f"train; {final} (checkpoint: {checkpoint}). To train on, resume with a larger "
                "train.early_stop.patience, or train.early_stop.monitor=null")
    return (f"{run_dir} is finished: step {step} of train.max_steps={step}, nothing to train; {final}{best_text} "
            f"(checkpoint: {checkpoint}). To train on, resume with a larger train.max_steps")
