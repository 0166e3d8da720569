"""Running a grid's runs one after another, each through ``segadv-train`` in a subprocess.

A run whose ``status.json`` says ``finished`` is never repeated (a run whose row has changed since
is kept, with a warning naming what changed: delete its directory to run it again); any other run
dir continues with ``--resume auto``. Ctrl-C lets the current run stop at its next step and save
a checkpoint (the trainer, in the same process group, gets it too); a second Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Iterator, Optional

from segadv.config import config_to_dict, load_config
from segadv.config.resume import flatten
from segadv.errors import UserError
from segadv.experiment.grid import Grid, Row
from segadv.experiment.results import run_dir_for
from segadv.experiment.runs import read_run_config, summarize
from segadv.fsutil import make_dir
from segadv.monitor.status import STATUS_FILE

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
            wanted = flatten(config_to_dict(load_config(self.row.config, self.overrides)))
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


@dataclass
class _Interrupt:
    requested: bool = False


@contextlib.contextmanager
def deferred_ctrl_c() -> Iterator[_Interrupt]:
    """While a run is going, the first Ctrl-C only takes note: the trainer (same process group)
    got it too and stops at its next step with a checkpoint. A second one interrupts at once."""
    state = _Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handle(signum: int, frame: Optional[FrameType]) -> None:
        if state.requested:
            raise KeyboardInterrupt
        state.requested = True
        log.warning("Ctrl-C: letting the run stop at its next step and save a checkpoint (Ctrl-C again: stop now)")

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)


def launch(command: list[str], log_path: Path) -> tuple[int, bool]:
    """Runs the command with its output appended to ``log_path``: exit code, and whether Ctrl-C
    was pressed meanwhile."""
    with deferred_ctrl_c() as interrupt, open(log_path, "a", encoding="utf-8") as log_file:  # never an unread pipe
        code = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT).returncode
    return code, interrupt.requested


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
    if interrupted:
        log.warning("interrupted: %s (exit %d); run again to continue it", spec.label, code)
        raise KeyboardInterrupt
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
