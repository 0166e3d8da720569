"""A run's checkpoints: what is due, saving, the best, finding what to resume, archiving a rewind's
abandoned future (torchtitan's CheckpointManager, for segadv's files).

Layout under ``RUN/checkpoints/``: ``last.pt`` (always the newest), ``step_<N>.pt`` every
``checkpoint.every`` steps (the newest ``keep_last`` kept), ``best.pt`` + ``best.json`` (the best
evaluation), with ``checkpoint.keep_best: K`` the K best evaluations as
``best_step_<N>_<score>_<value>.pt`` (:func:`ranked_name`), ``abandoned/`` (checkpoints of a
future a rewind abandoned). Every file is written
atomically, so a crash at any moment leaves the previous complete checkpoint in place; retention
deletes only after the new file is complete. A state with a NaN or an infinity is never written
(:class:`Diverged`), so every checkpoint here is finite and retention never removes the newest
finite one; a failed write is a :class:`WriteFailed` naming the last complete checkpoint. Under
DDP every rank calls :meth:`start`, :meth:`check_room`, :meth:`save` and :meth:`keep_if_best` (the
RNGs are gathered from every rank) and every rank raises together; rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

from segadv.checkpoint.io import read_checkpoint, save_checkpoint
from segadv.checkpoint.state import Attribute, Stateful, expected_bytes, nonfinite_entries, restore, snapshot
from segadv.errors import Diverged, UserError, WriteFailed
from segadv.fsutil import atomic_write_text, unwritable
from segadv.checkpoint.run_checkpoint import read_best_record
from segadv.parallel import distributed
from segadv.parallel.distributed import DistEnv
from segadv.config.resume import check_resumed_config
from segadv.config.schema import best_score_by, higher_is_better

log = logging.getLogger(__name__)

ABANDONED_DIR = "abandoned"
STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
RANKED_FILE = re.compile(r"^best_step_(\d+)_[A-Za-z_]+_-?\d+\.\d+\.pt$")  # checkpoint.keep_best's (ranked_name)
BEST_RECORD = "best.json"
# The temp file of a write of one of the names above (segadv/fsutil.py's _temp_path: ".NAME.tmp-PID").
TEMP_FILE = re.compile(r"^\.(last\.pt|best\.pt|best\.json|step_\d+\.pt|best_step_\d+_[A-Za-z_]+_-?\d+\.\d+\.pt)"
                       r"\.tmp-\d+$")
MIB = 2**20


class CheckpointManager:
    """``states``: the run's stateful parts by checkpoint key; the manager adds its own two,
    ``step`` and ``best`` (the best evaluation so far by ``best_by``, ``{"mIoU", "step"}``, with
    ``"by"`` and ``"score"`` when chosen by a label-free score, so a resumed run keeps ``best.pt`` honest),
    and with ``keep_best`` a third, ``best_kept``: the ranking of the kept ``best_step_*`` files
    (:attr:`kept`). ``config``: the run's config as a dict, saved with every checkpoint.
    ``best_by``: ``checkpoint.best_by`` (val/mIoU or a proxy/* score). ``keep_best``:
    ``checkpoint.keep_best``, how many of the best evaluations keep a file of their own (None: none,
    only best.pt). ``read_back``: each checkpoint :meth:`save` writes is read back into the states
    as a resume restores it (:meth:`read_back`; a smoke run's check, ``train.smoke``)."""

    def __init__(
        self,
        run_dir: Path,
        states: Mapping[str, Stateful] | None = None,
        *,
        every: int,
        keep_last: int | None = None,
        config: dict[str, Any] | None = None,
        env: DistEnv = DistEnv(),
        best_by: str = "val/mIoU",
        keep_best: int | None = None,
        read_back: bool = False,
    ) -> None:
        self.directory = run_dir / "checkpoints"
        self.reads_back = read_back
        self.best_by = best_by  # checkpoint.best_by: the score best.pt is chosen by
        self.every = every
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.config = config or {}
        self.env = env
        self.step = 0
        self.best: dict[str, Any] | None = None
        # The latest evaluation, {"step", "mIoU", "pixel_acc"}: what a finished run reports when resumed.
        self.evaluation: dict[str, Any] | None = None
        self.last_complete: tuple[Path, int] | None = None  # the newest complete checkpoint, its step
        # checkpoint.keep_best's ranking: {"by": best_by, "files": [{"step", "score", "mIoU", "file"}, ...]},
        # best first. Only files this run wrote here are listed, so only they are ever removed.
        self.kept: dict[str, Any] | None = None if keep_best is None else {"by": best_by, "files": []}
        self.unlisted: list[str] = []  # files the ranking left out, removed after the next checkpoint
        self.states = {"step": Attribute(self, "step"), **(states or {}), "best": Attribute(self, "best"),
                       "evaluation": Attribute(self, "evaluation"), "best_kept": Attribute(self, "kept")}

    @property
    def last_path(self) -> Path:
        return self.directory / "last.pt"

    @property
    def best_path(self) -> Path:
        """The checkpoint of the best evaluation (by ``best_by``); ``best.json`` beside it says which."""
        return self.directory / "best.pt"

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint of the run as it is now (every rank: the RNGs are gathered), with the
        number of processes that wrote it."""
        return {**snapshot(self.states, self.config), "world_size": self.env.world_size}

    # ------------------------------------------------------------------ starting a run

    def start(self, resume: str | None, trusted: bool = False) -> int:
        """Clean up after a crashed write, load ``resume`` ("auto": the newest complete checkpoint
        here, if any; else a path; None: a fresh start) and archive the checkpoints of a later,
        abandoned future. Returns the step to continue from."""
        if self.env.is_main:
            self.remove_stale_temp_files()
        resumed_from = None if resume is None else self.load(resume, trusted)
        if self.env.is_main:
            self.archive_later_checkpoints(self.step, resumed_from)
        distributed.barrier()  # everyone has read the checkpoint (and rank 0 archived) before anything is written
        if self.best is not None and best_score_by(self.best) != self.best_by:
            log.warning("best.pt was chosen by %s, this run chooses by %s (checkpoint.best_by): the next evaluation "
                        "writes a new one", best_score_by(self.best), self.best_by)
            self.best = None
        if self.best is not None and not self.best_path.is_file():
            log.warning("best.pt (val mIoU %.4f at step %d) is gone (abandoned or removed): the next evaluation "
                        "writes a new one", self.best["mIoU"], self.best["step"])
            self.best = None
        self.kept = self.resumed_ranking(self.kept)
        return self.step

    def resumed_ranking(self, kept: Any) -> dict[str, Any] | None:
        """The ``best_step_*`` ranking a run goes on with: the checkpoint's (None in a checkpoint
        written without keep_best), less the files no longer here (abandoned, removed by a later
        future, or never in this run dir: a checkpoint of another run). A ranking by another
        score, or keep_best turned off, leaves the files where they are and ranks afresh (or not)."""
        kept = kept if isinstance(kept, dict) else {}
        files = [e for e in kept.get("files", []) if listed(e)] if isinstance(kept.get("files"), list) else []
        if self.keep_best is None:
            if files:
                log.info("checkpoint.keep_best is off: %s stay as they are, no longer ranked",
                         ", ".join(e["file"] for e in files))
            return None
        if files and kept.get("by") != self.best_by:
            log.warning("%s were ranked by %s, this run ranks by %s (checkpoint.best_by): they stay as they are and "
                        "the ranking starts over", ", ".join(e["file"] for e in files), kept.get("by"), self.best_by)
            files = []
        here = [e for e in files if (self.directory / e["file"]).is_file()]
        gone = [e["file"] for e in files if e not in here]
        if gone:
            log.warning("%s, ranked among the best by the checkpoint resumed from, %s not in %s (abandoned or "
                        "removed): ranked without", ", ".join(gone), "is" if len(gone) == 1 else "are", self.directory)
        return {"by": self.best_by, "files": here}

    def load(self, resume: str, trusted: bool = False) -> Path | None:
        """Restore every state from ``resume`` ("auto" or a path); returns the file it came from
        (None: "auto" found nothing, a fresh start)."""
        if resume == "auto":
            found = self.newest_loadable(trusted)
            if found is None and (self.last_path.is_file() or self.step_files()):
                raise UserError(f"--resume auto: no checkpoint in {self.directory} loads (each is named above): "
                                "resume from a good copy with --resume PATH, or move them away to start fresh")
            if found is None:
                log.info("--resume auto: no checkpoint in %s, starting fresh", self.directory)
                return None
            path, ckpt = found
        else:
            path, ckpt = Path(resume), read_checkpoint(resume, trusted=trusted)
        self._restore(path, ckpt)
        log.info("resumed from %s at step %d", path, self.step)
        return path

    def _restore(self, path: Path, ckpt: dict[str, Any]) -> None:
        """A resume's restore of ``ckpt`` (read from ``path``): its world size and config checked
        against the run's, then every state strictly."""
        self.check_world_size(path, ckpt)
        if self.config:
            check_resumed_config(ckpt.get("config"), self.config, path)
        restore(ckpt, self.states)
        self.last_complete = (path, self.step)

    def read_back(self, path: Path) -> None:
        """``path``, just written, read on every rank (its integrity verified) and restored into the
        states as a resume restores it: they hold what they held, and a checkpoint that would not
        resume the run says so now. Every rank waits for the others to have read it."""
        self._restore(path, read_checkpoint(path))
        distributed.barrier()
        log.info("checkpoint read back: %s restores the run at step %d", path.name, self.step)

    def check_world_size(self, path: Path, ckpt: dict[str, Any]) -> None:
        """A run resumes with the number of processes that saved it: the data position is counted
        per rank, each rank has its own RNGs, and ``train.lr_scaling: linear`` scales the learning
        rate by it. At another world size the run would see samples twice or skip them, so it is
        refused, naming the two ways on."""
        saved = saved_world_size(ckpt)
        if saved == self.env.world_size:
            return
        raise UserError(
            f"{path} was saved by a run of {saved} process{'es' if saved > 1 else ''} and this run has "
            f"{self.env.world_size}: its data position and RNGs are per process, so it cannot go on at another "
            f"world size. Resume with {saved} process{'es' if saved > 1 else ''} (segadv-train --nproc-per-node "
            f"{saved}, or torchrun with nodes x processes per node = {saved}), or start a new run from its weights: "
            f"init.generator.path={path} init.discriminator.path={path}")

    def check_room(self, max_steps: int, force: bool = False) -> None:
        """Before the first step: the run dir must be writable and have room for the checkpoints
        the run keeps (its size estimated from the states, times what retention keeps, plus one
        temp file). Too little room is a UserError, or a warning with ``force``."""
        size = expected_bytes(self.states)
        problem = None
        if self.env.is_main:
            cause = unwritable(self.directory)
            problem = None if cause is None else f"cannot write checkpoints to {self.directory}: {cause}"
            if problem is None:
                problem = self._too_small(size, max_steps)
                if problem is not None and force:
                    log.warning("%s; going on (--force)", problem)
                    problem = None
        if distributed.any_rank(problem is not None):
            raise UserError(problem or "rank 0 refused the run dir (its message says why)")

    def _too_small(self, size: int, max_steps: int) -> str | None:
        """``size``: one checkpoint's expected bytes. Kept: ``keep_last`` step files (all of them
        without it), last.pt, best.pt, ``keep_best`` best_step files, and a temp file while one is
        written; the checkpoint files here already count as room (they are kept or replaced)."""
        step_files = self.keep_last if self.keep_last is not None else (
            len(self.step_files()) + max_steps // self.every - self.step // self.every)
        ranked = self.keep_best or 0
        files = step_files + 3 + ranked
        present = sum(p.stat().st_size for p in self.directory.glob("*.pt"))
        free = shutil.disk_usage(self.directory).free
        if free + present >= files * size:
            return None
        kept = (f"kept by checkpoint.keep_last={self.keep_last}" if self.keep_last is not None
                else "all kept: checkpoint.keep_last is not set")
        return (f"not enough room for this run's checkpoints in {self.directory}: {files} files of about "
                f"{size / MIB:.1f} MiB ({step_files} step_<N>.pt {kept}, last.pt, best.pt, "
                f"{f'{ranked} best_step_<N>_*.pt kept by checkpoint.keep_best, ' if ranked else ''}one temp file) "
                f"need {files * size / MIB:.1f} MiB, "
                f"and {free / MIB:.1f} MiB are free (+{present / MIB:.1f} MiB in checkpoints already there): "
                f"free space, set checkpoint.keep_last{', lower checkpoint.keep_best' if ranked else ''}, "
                "or pass --force to start anyway")

    def resume_note(self) -> str:
        """Where a stopped run can go on from, for its error message: the newest complete
        checkpoint of any kind (``best.pt`` and the best_step files included; ``--resume auto``
        picks last.pt and the step files, so those are named by path)."""
        if self.last_complete is None:
            return "no checkpoint was written before it"
        path, step = self.last_complete
        best = path.name == self.best_path.name or RANKED_FILE.match(path.name)
        how = f"--resume {path}" if best else "--resume auto"
        return f"the last complete checkpoint is {path} (step {step}; resume: {how})"

    def newest_loadable(self, trusted: bool = False) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that loads: last.pt, or a newer step file (a run dir written by
        another tool or copied in), else step files from newest to oldest. A truncated or corrupt
        file is skipped with a warning. Each file is read at most once; normally only last.pt is."""
        last = self._try_read(self.last_path, trusted) if self.last_path.is_file() else None
        last_step = int(last[1].get("step", -1)) if last else -1
        for step, path in self.step_files():
            if step <= last_step:
                break  # last.pt is at least as new as every remaining step file
            found = self._try_read(path, trusted)
            if found is not None:
                return found
        return last

    def archive_later_checkpoints(self, start_step: int, resumed_from: Path | None) -> Path | None:
        """A run starting at ``start_step`` (0 fresh, else the step of the file it resumed from)
        abandons every checkpoint here from a later step, and ``last.pt`` unless it is the file
        resumed from. They move to ``abandoned/from_step_<N>-<time>/`` (nothing is deleted), so
        ``--resume auto`` and ``keep_last`` never pick a file of the abandoned future: after a
        rewind to step 500 of a run that once reached 1000, a preemption at 700 resumes at 700.
        Returns the archive folder, or None when nothing was moved."""
        later = [path for step, path in self.step_files() if step > start_step]
        last = self.last_path
        if last.is_file() and (resumed_from is None or resumed_from.resolve() != last.resolve()):
            later.append(last)
        best_step = self.best_step()
        if self.best_path.is_file() and (best_step is None or best_step > start_step or start_step == 0):
            later += [p for p in (self.best_path, self.directory / BEST_RECORD) if p.is_file()]
        ranked, others = self.abandoned_ranked_files(start_step)
        later += ranked
        if others:
            log.warning("%s in %s: named like checkpoint.keep_best's files, but no checkpoint of this run lists %s: "
                        "left as %s", ", ".join(p.name for p in others), self.directory,
                        "it" if len(others) == 1 else "them", "it is" if len(others) == 1 else "they are")
        if not later:
            return None
        base = self.directory / ABANDONED_DIR / f"from_step_{start_step}-{time.strftime('%Y%m%d-%H%M%S')}"
        archive, n = base, 1
        while archive.exists():
            archive, n = base.with_name(f"{base.name}.{n}"), n + 1
        archive.mkdir(parents=True)
        for path in later:
            os.replace(path, archive / path.name)
        log.warning("starting at step %d: moved %s (checkpoints of an abandoned later run) to %s",
                    start_step, ", ".join(p.name for p in later), archive)
        return archive

    def abandoned_ranked_files(self, start_step: int) -> tuple[list[Path], list[Path]]:
        """The entries here named like keep_best's files from a step after ``start_step`` (every one
        on a fresh start): those of the run, which a rewind abandons, and the others, never moved
        nor removed. A ranked file is the run's when its own ranking lists it (each ranked
        checkpoint lists itself: the ranking is saved with it) at the step it holds, under this
        run's config (the resume rule); a folder, a link, or a file of the user's or of another
        run is not."""
        ours: list[Path] = []
        others: list[Path] = []
        for step, path in self.ranked_files():
            if step > start_step or start_step == 0:
                (ours if self._ranked_by_this_run(step, path) else others).append(path)
        return ours, others

    def _ranked_by_this_run(self, step: int, path: Path) -> bool:
        if path.is_symlink() or not path.is_file():
            return False  # keep_best writes regular files only
        try:
            ckpt = read_checkpoint(path)  # weights only: a file of the user's never runs code
        except UserError:
            return False
        kept = ckpt.get("best_kept")
        entries = kept.get("files") if isinstance(kept, dict) else None
        if ckpt.get("step") != step or not isinstance(entries, list) or not any(
                listed(entry) and entry["file"] == path.name and entry["step"] == step for entry in entries):
            return False
        if self.config:
            if not ckpt.get("config"):
                return False
            try:
                check_resumed_config(ckpt["config"], self.config, path)
            except UserError:
                return False  # another run's
        return True

    def remove_stale_temp_files(self) -> None:
        """Temp files of a write that a crash cut short (the checkpoint they were to replace is
        intact): safe to delete when a run starts. Only regular files named as segadv's writer
        names the temp file of a file it writes here (``.last.pt.tmp-<pid>``); anything else is
        not the run's and stays."""
        if self.directory.is_dir():
            for path in sorted(self.directory.iterdir()):
                if TEMP_FILE.match(path.name) and path.is_file() and not path.is_symlink():
                    path.unlink(missing_ok=True)
                    log.info("removed %s, left by an interrupted checkpoint write", path.name)

    # ------------------------------------------------------------------ during a run

    def due(self, step: int, final: bool = False) -> bool:
        """Whether ``step`` gets a checkpoint: every ``every`` steps, and the last step of the run
        (``final``: the end, or a stop)."""
        return final or step % self.every == 0

    def save(self, step: int) -> Path | None:
        """``last.pt``, and ``step_<N>.pt`` on a multiple of ``every``, then retention. Returns
        the newest file written (None on ranks other than 0)."""
        self.step = step
        state = self.finite_state(step)
        # last.pt first: a kill between the two writes then leaves last.pt the newest complete
        # checkpoint (and only the step file missing), never a step file ahead of last.pt.
        paths = [self.last_path]
        if step % self.every == 0:
            paths.append(self.directory / f"step_{step}.pt")
        failure = None
        if self.env.is_main:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                save_checkpoint(state, *paths)
            except OSError as err:
                failure = err if isinstance(err, WriteFailed) else WriteFailed(self.directory, err)
            else:
                log.info("checkpoint saved at step %d: %s", step, ", ".join(p.name for p in paths))
                self._apply_retention(keep=paths[-1])
                self._remove_unlisted()
        self._agree_written(failure)  # nobody races ahead of (or exits before) the write
        self.last_complete = (self.last_path, step)
        if self.reads_back:
            self.read_back(self.last_path)
        return paths[-1] if self.env.is_main else None

    def keep_if_best(self, step: int, miou: float, pixel_acc: float | None = None,
                     proxies: Mapping[str, float] | None = None) -> bool:
        """An evaluation's val mIoU and label-free ``proxies`` (``proxy/<name>``): when its
        ``best_by`` score beats the best so far (the same metrics on every rank, all-reduced, so
        every rank agrees), ``best.pt`` (a full training state), then ``best.json`` (its step,
        mIoU, and the score that chose it), each atomic: a kill between them leaves a best.json
        one evaluation behind best.pt, never ahead of it. With ``keep_best``, an evaluation among
        the K best so far also gets its own file (:func:`ranked_name`, written first, from the
        same bytes as best.pt), and the files it pushes out of the K are removed once it is
        complete. Every evaluation is recorded for the checkpoints that follow
        (:attr:`evaluation`). Returns whether it is the new best."""
        self.evaluation = {"step": step, "mIoU": float(miou),
                           "pixel_acc": None if pixel_acc is None else float(pixel_acc)}
        score = float(miou) if self.best_by == "val/mIoU" else float((proxies or {}).get(self.best_by, math.nan))
        is_best = better(score, None if self.best is None else self.best.get("score", self.best["mIoU"]),
                         higher_is_better(self.best_by))
        ranked, dropped = self._ranking_with(step, score, float(miou))
        entered = ranked is not None and any(entry["step"] == step for entry in ranked["files"])
        if ranked is not None:
            self.kept = ranked
            if self.env.is_main:
                self.unlisted += dropped  # removed once a checkpoint that no longer lists them is complete
        if not (is_best or entered):
            return False  # nothing written: the next save removes what a lowered keep_best left out
        self.step = step
        if is_best:
            self.best = {"mIoU": float(miou), "step": step}
            if self.best_by != "val/mIoU":  # by val mIoU the record stays what it always was
                self.best.update(by=self.best_by, score=score)
        state = self.finite_state(step)
        ranked_path = self.directory / ranked_name(step, self.best_by, score)
        paths = ([ranked_path] if entered else []) + ([self.best_path] if is_best else [])
        failure = None
        if self.env.is_main:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                save_checkpoint(state, *paths)
                if is_best:
                    atomic_write_text(self.directory / BEST_RECORD, json.dumps({"step": step, **self.best}) + "\n")
            except OSError as err:
                failure = err if isinstance(err, WriteFailed) else WriteFailed(self.directory, err)
            else:
                self._log_kept(step, score, float(miou), is_best, ranked_path if entered else None)
                self._remove_unlisted()
        self._agree_written(failure)
        if self.last_complete is None or self.last_complete[1] < step:
            self.last_complete = (self.best_path if is_best else ranked_path, step)
        return is_best

    def _ranking_with(self, step: int, score: float, miou: float) -> tuple[dict[str, Any] | None, list[str]]:
        """The keep_best ranking with this evaluation in it where it is among the K best (an
        equal score does not displace an earlier one; a NaN never enters), and the files it
        leaves out. (None, []) without keep_best."""
        if self.keep_best is None or self.kept is None:
            return None, []
        files = list(self.kept["files"])
        higher = higher_is_better(self.best_by)
        worst = files[self.keep_best - 1]["score"] if len(files) >= self.keep_best else None
        if better(score, worst, higher):
            files.append({"step": step, "score": score, "mIoU": miou, "file": ranked_name(step, self.best_by, score)})
        # Best first; a stable sort, so an equal score stays after the earlier evaluations it ties.
        files.sort(key=lambda entry: -entry["score"] if higher else entry["score"])
        kept, dropped = files[:self.keep_best], [entry["file"] for entry in files[self.keep_best:]]
        return {"by": self.best_by, "files": kept}, dropped

    def _remove_unlisted(self) -> None:
        """keep_best's retention: files of the ranking (this run's own, in this run dir) that fell
        out of the K best, removed once a checkpoint whose ranking no longer lists them is
        complete, so the newest checkpoint never lists a file that is gone."""
        for name in self.unlisted:
            path = self.directory / name
            if path.is_symlink() or not path.is_file():
                continue  # what stands there now is not the file the run wrote
            path.unlink(missing_ok=True)
            log.info("retention (checkpoint.keep_best=%d): removed %s", self.keep_best, name)
        self.unlisted = []

    def _log_kept(self, step: int, score: float, miou: float, is_best: bool, ranked: Path | None) -> None:
        written = ", ".join(p.name for p in (ranked, self.best_path if is_best else None) if p is not None)
        if is_best and self.best_by == "val/mIoU":
            log.info("best val mIoU so far (%.4f at step %d): %s", miou, step, written)
        elif is_best:
            log.info("best %s so far (%.4f at step %d; val mIoU %.4f): %s", self.best_by, score, step, miou, written)
        else:
            place = next(i for i, entry in enumerate(self.kept["files"], 1) if entry["step"] == step)
            log.info("%s %.4f at step %d is the %s best of the run (checkpoint.keep_best=%d): %s", self.best_by, score,
                     step, ordinal(place), self.keep_best, written)

    def finite_state(self, step: int, cause: str = "") -> dict[str, Any]:
        """The state to save, refused (:class:`Diverged` on every rank) if any rank's holds a NaN
        or an infinity. ``cause``: what led here, for the message."""
        state = self.state_dict()
        bad = nonfinite_entries(state)
        if distributed.any_rank(bool(bad)):
            raise Diverged(f"training diverged: {cause}non-finite values in {', '.join(bad) or 'another rank'} at "
                           f"step {step}, so no checkpoint of it was written; {self.resume_note()}")
        return state

    def _agree_written(self, failure: WriteFailed | None) -> None:
        """Every rank waits for rank 0's write and learns whether it failed."""
        if distributed.any_rank(failure is not None):
            if failure is None:
                failure = WriteFailed(self.directory, OSError("rank 0's write failed (its message says why)"))
            failure.after = self.resume_note()
            raise failure

    # ------------------------------------------------------------------ the files

    def best_step(self) -> int | None:
        """The step of ``best.pt`` per ``best.json`` (None: no record)."""
        record = read_best_record(self.directory)  # the one reader: a record that is not one is none
        return None if record is None else record.step

    def ranked_files(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every best_step_<N>_*.pt here (keep_best's), newest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := RANKED_FILE.match(p.name))]
        return sorted(found, reverse=True)

    def step_files(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every step_<N>.pt, newest first: regular files, as the run writes them
        (a folder or a link of that name is not one, so neither retention nor a rewind touches it)."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir()
                 if (m := STEP_FILE.match(p.name)) and p.is_file() and not p.is_symlink()]
        return sorted(found, reverse=True)

    def _apply_retention(self, keep: Path) -> None:
        if self.keep_last is None:
            return
        for _, path in self.step_files()[self.keep_last:]:
            if path != keep:
                path.unlink(missing_ok=True)
                log.info("retention (checkpoint.keep_last=%d): removed %s", self.keep_last, path.name)

    @staticmethod
    def _try_read(path: Path, trusted: bool) -> tuple[Path, dict[str, Any]] | None:
        try:
            return path, read_checkpoint(path, trusted=trusted)
        except UserError as err:
            log.warning("skipping %s: %s", path, err)
            return None


def saved_world_size(ckpt: Mapping[str, Any]) -> int:
    """The number of processes that saved a checkpoint (older files: one RNG state per rank)."""
    if "world_size" in ckpt:
        return int(ckpt["world_size"])
    rng = ckpt.get("rng")
    return len(rng) if isinstance(rng, list) else 1


def ranked_name(step: int, best_by: str, score: float) -> str:
    """keep_best's file of the evaluation at ``step``: ``best_step_<N>_<score>_<value>.pt``, the
    score named as its key's last part (``best_step_500_mIoU_0.8123.pt``,
    ``best_step_500_entropy_0.4012.pt``), its value to 4 decimals."""
    return f"best_step_{step}_{best_by.rsplit('/', 1)[-1]}_{score:.4f}.pt"


def listed(entry: Any) -> bool:
    """A ranking entry as keep_best writes it: a step, a finite score and a file name of its
    own pattern (never a path: only files of the run dir's checkpoints/ are ever removed)."""
    return (isinstance(entry, dict) and isinstance(entry.get("step"), int)
            and isinstance(entry.get("score"), float) and math.isfinite(entry["score"])
            and isinstance(entry.get("file"), str) and RANKED_FILE.match(entry["file"]) is not None)


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def better(score: float, best: float | None, higher: bool) -> bool:
    """Whether ``score`` beats ``best`` (None: nothing yet) in its direction; a NaN score never does."""
    if score != score:
        return False
    if best is None or best != best:
        return True
    return score > best if higher else score < best
