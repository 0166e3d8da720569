"""Running a grid's runs one after another, each through ``segadv-train`` in a subprocess.

A run whose ``status.json`` says ``finished`` is never repeated (a run whose row has changed since
is kept, with a warning naming what changed: delete its directory to run it again); any other run
dir continues with ``--resume auto``. Every run's config is loaded before the first one starts,
and each run still to run is put through its trainer's start checks, the same functions, without
building a network (:func:`check_runs`, for ``--dry-run`` too): a typo in the last row, a size its
G cannot take, or a warm start's checkpoint not made yet, is found before the first run has
trained.

The trainer runs in a process group of its own, and SIGINT, SIGTERM and SIGHUP sent to
``segadv-experiment`` are passed on to it: it stops at its next step and saves a checkpoint, the
launcher waits for it to exit (no trainer is left running without its launcher), then stops the
grid (exit 130 for Ctrl-C, 128 + N for signal N). A second signal is passed on too: the trainer
then stops at once. A terminal's Ctrl-C reaches the trainer once, through the launcher.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Iterator, Mapping, Optional, Sequence

from segadv.config import Config, config_to_dict, load_config
from segadv.config.resume import flatten, with_method_defaults
from segadv.errors import UserError
from segadv.experiment.grid import Grid, Row
from segadv.experiment.results import run_dir_for
from segadv.experiment.runs import read_run_config, summarize
from segadv.fsutil import make_dir, open_append
from segadv.monitor.status import STATUS_FILE
from segadv.signals import Terminated

log = logging.getLogger(__name__)

LOG_FILE = "experiment.log"
IGNORED_KEYS = ("run_dir",)  # where a run is says nothing of what it computes


@dataclass(frozen=True)
class RunSpec:
    """One run of a grid: a row at a seed, in its run dir."""

    row: Row
    seed: int
    run_dir: Path
    overrides: tuple[str, ...]  # the row's, the grid's common ones, then train.seed

    @classmethod
    def of(cls, grid: Grid, row: Row, seed: int, out: Path) -> "RunSpec":
        return cls(row, seed, run_dir_for(out, row, seed), (*row.overrides, *grid.common_overrides, f"train.seed={seed}"))

    @property
    def label(self) -> str:
        return f"{self.row.name}, seed {self.seed}"

    def config(self) -> Config:
        """The config its trainer runs: the row's config file and its overrides, loaded as
        ``segadv-train --config FILE OVERRIDES...`` loads them (a UserError where they do not load)."""
        return load_config(self.row.config, self.overrides)

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "segadv.cli.train", "--config", self.row.config, "--run-dir", str(self.run_dir),
                   *self.overrides]
        return command + (["--resume", "auto"] if self.run_dir.exists() else [])

    def finished(self) -> bool:
        return (self.run_dir / STATUS_FILE).is_file() and summarize(self.run_dir).finished

    def changed(self) -> Optional[str]:
        """What differs between the config the run ran with (its config.yaml) and the one its row
        gives now; None: nothing."""
        try:
            wanted = flatten(with_method_defaults(config_to_dict(self.config())))
        except UserError as err:
            return f"its row no longer loads ({err})"
        ran = read_run_config(self.run_dir)
        changes = [f"{key} {ran.get(key, '-')!r} -> {wanted.get(key, '-')!r}" for key in sorted({*wanted, *ran})
                   if key not in IGNORED_KEYS and not _same(ran.get(key), wanted.get(key))]
        if not changes:
            return None
        return "its row's config differs: " + ", ".join(changes[:5]) + (f" (+{len(changes) - 5} more)" if len(changes) > 5 else "")


def _same(a: object, b: object) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def check_runs(specs: Sequence[RunSpec], grid_name: str) -> None:
    """Before the first run, for ``segadv-experiment run`` and its ``--dry-run`` alike: every row's
    config loads with its overrides, the common ones and its seed (the seeds themselves are
    range-checked by the grid), and every run still to run passes its trainer's start checks
    (:func:`start_problems`). Otherwise one UserError names each row that does not load and each
    problem with the rows that have it, so that nothing trains before a later row's mistake is
    found."""
    configs: dict[str, Config] = {}
    broken: dict[str, UserError] = {}
    for spec in specs:
        if spec.row.name in configs or spec.row.name in broken:
            continue
        try:
            configs[spec.row.name] = spec.config()
        except UserError as err:
            broken[spec.row.name] = err
    problems = start_problems([spec for spec in specs if spec.row.name in configs], configs)
    if not broken and not problems:
        log.info("checked: %d row(s) load, and their runs still to run pass segadv-train's start checks", len(configs))
        return
    said = ([f"{len(broken)} row(s) do not load"] if broken else []) + (
        [f"{len(problems)} problem(s) their runs' starts would refuse"] if problems else [])
    every = list(dict.fromkeys(spec.row.name for spec in specs))
    to_run = [name for name in every if any(not spec.finished() for spec in specs if spec.row.name == name)]
    lines = [f"row {name!r}: {err}" for name, err in broken.items()] + [
        f"{_rows_text(rows, every, to_run)}: {message}" for message, rows in problems.items()]
    raise UserError(f"grid {grid_name}: {' and '.join(said)}, so no run was started:\n" + "\n".join(lines))


def _rows_text(rows: Sequence[str], every: Sequence[str], to_run: Sequence[str]) -> str:
    """``row 'a'``, ``rows 'a', 'b'``, ``every row (7)``, ``every row still to run (5)``."""
    if len(rows) > 1 and list(rows) == list(to_run):
        return f"every row ({len(rows)})" if list(rows) == list(every) else f"every row still to run ({len(rows)})"
    return ("row " if len(rows) == 1 else "rows ") + ", ".join(map(repr, rows))


def start_problems(specs: Sequence[RunSpec], configs: Mapping[str, Config]) -> dict[str, list[str]]:
    """What each row's trainer would refuse at its start, for the rows with a run still to run
    (``configs``: by row name, as :meth:`RunSpec.config` loads them), made by segadv-train's own
    start checks (segadv/training/preflight.py), none of them building a network: the config's
    (``check_config``: the device map, the method against the model and the data, the sizes G
    takes, ``train.early_stop``, the wrappers), the files it names (``missing_files``: warm starts
    ``init.<role>.path``, a local ``model.generator.encoder_weights``) and its data (listed,
    ``missing_data`` naming each section's problem, then ``check_data``: the batches against the
    pools, G against the images' sizes). Each problem (its message, naming the key) -> the rows
    that have it, in the grid's order. A file that lies in the run dir of a run still to run
    before the row's (a checkpoint an earlier row writes) is not missing."""
    from segadv.data.catalog import Catalog
    from segadv.methods import method_class
    from segadv.parallel import parse_device_map
    from segadv.training.preflight import check_config, check_data, missing_data, missing_files

    found: dict[str, list[str]] = {}
    listed: dict[str, Catalog | list[str]] = {}  # rows often share their data: each section pair listed once
    earlier: list[Path] = []  # the run dirs of the rows before
    for row_specs in _by_row(specs):
        row, cfg = row_specs[0].row, configs[row_specs[0].row.name]
        if not all(spec.finished() for spec in row_specs):
            problems, replicas = [], 1
            method = method_class(cfg.method.name)
            try:
                device_map = parse_device_map(cfg.device_map)  # as the trainer's one process parses it
                replicas = len(device_map.devices_of("generator"))
                check_config(cfg, device_map)
            except UserError as err:
                problems.append(str(err))
            for problem in missing_files(cfg, None, method):
                writer = _written_by(problem.path, earlier)
                if writer is not None:
                    log.info("row %r: %s is not there yet; a run before it writes it (%s)", row.name, problem.path,
                             writer)
                    continue
                problems.append(problem.message)
            data_key = json.dumps([config_to_dict(cfg)[key] for key in ("data", "target_data")], sort_keys=True,
                                  default=str)
            if data_key not in listed:
                try:
                    listed[data_key] = Catalog.open(cfg.data, cfg.target_data)
                except UserError:
                    listed[data_key] = [problem.message for problem in missing_data(cfg)]
            catalog = listed[data_key]
            if isinstance(catalog, Catalog):
                try:
                    check_data(cfg, method, 1, catalog, replicas)
                except UserError as err:
                    problems.append(str(err))
            else:
                problems += catalog
            for message in problems:
                found.setdefault(message, []).append(row.name)
        earlier += [spec.run_dir for spec in row_specs if not spec.finished()]
    return found


def _by_row(specs: Sequence[RunSpec]) -> list[list[RunSpec]]:
    rows: dict[str, list[RunSpec]] = {}
    for spec in specs:
        rows.setdefault(spec.row.name, []).append(spec)
    return list(rows.values())


def _written_by(path: Optional[str], run_dirs: Sequence[Path]) -> Optional[Path]:
    """The run dir among ``run_dirs`` that ``path`` lies in, if any."""
    if path is None or not path.strip():
        return None
    where = Path(os.path.abspath(os.path.expanduser(path)))
    return next((run_dir for run_dir in run_dirs if where.is_relative_to(Path(os.path.abspath(run_dir)))), None)


# The signals a run is stopped by; each is passed on to the trainer (module docstring).
FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
_running: list[subprocess.Popen] = []  # the trainer going on, to pass signals on to


@dataclass
class _Interrupt:
    signals: list[int]

    @property
    def requested(self) -> bool:
        return bool(self.signals)

    def stop(self) -> BaseException:
        """What ends the grid after the run the first signal stopped."""
        first = self.signals[0]
        return KeyboardInterrupt() if first == signal.SIGINT else Terminated(128 + first)


@contextlib.contextmanager
def forwarded_signals() -> Iterator[_Interrupt]:
    """While a run is going, SIGINT, SIGTERM and SIGHUP are passed on to the trainer and noted;
    the launcher goes on waiting for it. With no trainer process (nothing to wait for), a second
    signal interrupts at once."""
    state = _Interrupt([])
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handle(signum: int, frame: Optional[FrameType]) -> None:
        state.signals.append(signum)
        for child in _running:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)
        name = signal.Signals(signum).name
        if len(state.signals) > 1:
            if not _running:
                raise state.stop()
            log.warning("%s again: the run stops now", name)
            return
        log.warning("%s: letting the run stop at its next step and save a checkpoint (again: stop now)", name)

    previous = {signum: signal.signal(signum, handle) for signum in FORWARDED}
    try:
        yield state
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_trainer(command: list[str], stdout: object = None, stderr: object = None) -> subprocess.CompletedProcess:
    """``subprocess.run`` for the trainer: in a process group of its own, reachable by the signals
    passed on (:func:`forwarded_signals`, whose handler never raises while it runs), and waited for."""
    with subprocess.Popen(command, stdout=stdout, stderr=stderr, start_new_session=True) as child:
        _running.append(child)
        try:
            code = child.wait()
        finally:
            _running.remove(child)
    return subprocess.CompletedProcess(command, code)


def launch(command: list[str], log_path: Path) -> tuple[int, Optional[_Interrupt]]:
    """Runs the command with its output appended to ``log_path``: exit code, and the signals
    received meanwhile (None: none)."""
    # Never an unread pipe; opened by the run dir's rule (segadv/fsutil.py: a link there is replaced).
    with forwarded_signals() as interrupt, \
            io.TextIOWrapper(open_append(log_path), encoding="utf-8", write_through=True) as log_file:
        code = run_trainer(command, stdout=log_file, stderr=subprocess.STDOUT).returncode
    return code, interrupt if interrupt.requested else None


def log_tail(run_dir: Path, lines: int = 20) -> str:
    text = (run_dir / LOG_FILE).read_text(encoding="utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def dry_run_line(spec: RunSpec) -> str:
    if not spec.finished():
        return shlex.join(spec.command())  # quoted as a shell needs it: a line to paste
    changed = spec.changed()
    return f"done (but {changed})" if changed else "done"


def run_one(spec: RunSpec) -> bool:
    """Runs (or continues) one run; True when it is finished (now or before)."""
    if spec.finished():
        changed = spec.changed()
        if changed:
            log.warning("skip (done, but %s; delete %s to run it again): %s", changed, spec.run_dir, spec.label)
        else:
            log.info("skip (done): %s", spec.label)
        return True
    command = spec.command()
    make_dir(spec.run_dir)
    log.info("run: %s: %s", spec.label, shlex.join(command))
    code, interrupted = launch(command, spec.run_dir / LOG_FILE)
    if interrupted is not None:
        log.warning("interrupted: %s (exit %d); run again to continue it", spec.label, code)
        raise interrupted.stop()
    summary = summarize(spec.run_dir) if (spec.run_dir / STATUS_FILE).is_file() else None
    if summary is not None and summary.finished:
        final, best = summary.final, summary.best
        log.info("done: %s in %.0f s: final mIoU %.4f, best %.4f (step %s)", spec.label, summary.wall_s or math.nan,
                 final.mIoU if final else math.nan, best.mIoU if best else math.nan, best.step if best else "-")
        return True
    if summary is not None and summary.outcome == "stopped":
        log.error("%s at step %s/%s: %s; run again to continue it", summary.outcome_text, summary.step,
                  summary.max_steps, spec.label)
    else:
        ended = summary.outcome_text if summary is not None else f"failed (exit {code}, no {STATUS_FILE})"
        log.error("%s: %s; last lines of %s:\n%s", ended, spec.label, spec.run_dir / LOG_FILE, log_tail(spec.run_dir))
    return False
