"""Running a grid's runs one after another, each through ``segadv-train`` in a subprocess.

A run whose ``status.json`` says ``finished`` is never repeated (a run whose row has changed since
is kept, with a warning naming what changed: delete its directory to run it again); any other run
dir continues with ``--resume auto``. Every run's config is loaded before the first one starts
(:func:`check_runs`): a typo in the last row is found before the first has trained.

The trainer runs in a process group of its own, and SIGINT, SIGTERM and SIGHUP sent to
``segadv-experiment`` are passed on to it: it stops at its next step and saves a checkpoint, the
launcher waits for it to exit (no trainer is left running without its launcher), then stops the
grid (exit 130 for Ctrl-C, 128 + N for signal N). A second signal is passed on too: the trainer
then stops at once. A terminal's Ctrl-C reaches the trainer once, through the launcher.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Iterator, Optional, Sequence

from segadv.config import config_to_dict, load_config
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
            wanted = flatten(with_method_defaults(config_to_dict(load_config(self.row.config, self.overrides))))
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
    """Before the first run: every row's config loads with its overrides, the common ones and its
    seed (the seeds themselves are range-checked by the grid), or a UserError naming each row that
    does not, so that nothing trains before a later row's mistake is found."""
    problems, checked = [], set()
    for spec in specs:
        if spec.row.name in checked:
            continue
        checked.add(spec.row.name)
        try:
            load_config(spec.row.config, spec.overrides)
        except UserError as err:
            problems.append(f"row {spec.row.name!r}: {err}")
    if problems:
        raise UserError(f"grid {grid_name}: {len(problems)} row(s) do not load, so no run was started:\n"
                        + "\n".join(problems))


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
        return " ".join(spec.command())
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
    log.info("run: %s: %s", spec.label, " ".join(command))
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
