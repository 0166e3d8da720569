"""What a run dir says about its run: how it ended (``status.json``), its scores, its config, and
the diagnostics of its last quarter (``metrics.jsonl``).

A run with no status.json (a segadv from before it, or a start that failed) has the outcome
``unknown``; its step and scores are then read from ``metrics.jsonl`` and its ``max_steps`` from
``config.yaml``. A status still ``running`` whose run dir no process holds is ``killed`` (SIGKILL,
the OOM killer, a lost node: nothing could write the end).

Every file is read through segadv/readback.py (``config.yaml`` through the config loader and its
caps): a file that cannot be read (not UTF-8, a FIFO, an alias bomb) is set aside with a warning
naming it, and the run is described without it; a step or a score out of its range is no step or
score. These readers serve tools that read many run dirs (``segadv-experiment``, ``segadv-curves``).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from segadv.config.loading import read_yaml
from segadv.config.renamed import apply_renamed_keys
from segadv.config.resume import flatten, with_method_defaults
from segadv.errors import UserError
from segadv.methods.registry import METHODS
from segadv.monitor.status import STATUS_FILE, RunStatus, Score, read_status
from segadv.readback import Unreadable, parse_json, read_text, real_number, whole_number

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"


def score_value(value: Any) -> Optional[float]:
    """A val score (mIoU, pixel accuracy) as a float in 0..1, NaN kept (an unknown score); anything
    else (a string, inf, 1e400, 7) None."""
    number = real_number(value)
    return number if number is not None and (math.isnan(number) or 0.0 <= number <= 1.0) else None


def metrics_records(metrics_path: Path, set_aside: bool = True) -> Iterator[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` that carry a step, in order, ``step`` an int (none
    if the file is missing). A line that is not a JSON record (cut short by a crash) is skipped; a
    record whose step is not a whole number in range (``1e400``, NaN, ``"3"``) is skipped with a
    warning; a file that cannot be read (not UTF-8, not a regular file) is set aside with one
    (``set_aside`` False: its :class:`Unreadable` is raised)."""
    try:
        text = read_text(metrics_path)
    except FileNotFoundError:
        return
    except Unreadable as err:
        if not set_aside:
            raise
        log.warning("%s: set aside", err)
        return
    bad_steps = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = parse_json(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or "step" not in record:
            continue
        step = whole_number(record["step"])
        if step is None:
            bad_steps.append(number)
            continue
        yield {**record, "step": step}
    if bad_steps:
        log.warning("%s: line(s) %s set aside: their step is not a whole number from 0 to 2**63-1", metrics_path,
                    ", ".join(map(str, bad_steps[:5])) + (", ..." if len(bad_steps) > 5 else ""))


@dataclass(frozen=True)
class ValScores:
    final: Optional[Score]  # the last evaluation
    best: Optional[Score]  # the best by val mIoU, the earliest of ties (what best.pt holds)


def read_val_metrics(metrics_path: Path) -> ValScores:
    """Final and best ``val/mIoU`` of a run from its metrics (a resumed run's repeated steps: the
    last record wins; a NaN is never the best)."""
    by_step = {r["step"]: r for r in metrics_records(metrics_path) if score_value(r.get("val/mIoU")) is not None}
    if not by_step:
        return ValScores(None, None)

    def miou(step: int) -> float:
        return score_value(by_step[step]["val/mIoU"])

    def score(step: int) -> Score:
        return Score(step=step, mIoU=miou(step), pixel_acc=score_value(by_step[step].get("val/pixel_acc")))

    scored = [s for s in by_step if not math.isnan(miou(s))]
    best = max(scored, key=lambda s: (miou(s), -s)) if scored else None
    return ValScores(score(max(by_step)), score(best) if best is not None else None)


def diagnostics() -> dict[str, str]:
    """What a run's log says about why a method did or did not help (docs/experiments.md), as each
    registered method declares it (``Method.diagnostics``): key -> its logged tag (``loss_d`` ->
    ``train/loss_d``), in the registry's order."""
    return {tag.partition("/")[2]: tag for cls in METHODS.values() for tag in cls.diagnostics}


def read_train_diagnostics(metrics_path: Path, keys: tuple[str, ...] | None = None) -> dict[str, float]:
    """The mean of each diagnostic (``keys``; None: every method's, :func:`diagnostics`) a run
    logged over the last quarter of its steps (steps past 3/4 of its last logged step); keys it
    never logged are left out."""
    tags = diagnostics()
    keys = tuple(tags) if keys is None else keys
    records = list(metrics_records(metrics_path))
    if not records:
        return {}
    since = 0.75 * max(r["step"] for r in records)
    values: dict[str, list[float]] = {}
    for record in records:
        if record["step"] > since:
            for key in keys:
                value = real_number(record.get(tags.get(key, f"train/{key}")))
                if value is not None and math.isfinite(value):
                    values.setdefault(key, []).append(value)
    return {key: statistics.fmean(values[key]) for key in keys if key in values}


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The run's saved ``config.yaml`` (through the config loader and its caps), flattened to
    dotted keys ({} when it has none; one that cannot be read is set aside with a warning), its
    renamed keys at their new names and a null ``loss.lambda_adv`` at its method's default
    (``with_method_defaults``), so runs saved before a rename compare with those saved after."""
    path = run_dir / CONFIG_FILE
    try:
        data = read_yaml(path, str(path))
    except FileNotFoundError:
        return {}
    except Unreadable as err:
        log.warning("%s: set aside", err)
        return {}
    if not isinstance(data, dict):
        return {}
    return flatten(with_method_defaults(apply_renamed_keys(data, saved=True, source=str(path))))


@dataclass
class RunSummary:
    """One run dir as a table row reads it."""

    run_dir: Path
    outcome: str  # status.json's, "killed" or "unknown" (module docstring)
    step: Optional[int]
    max_steps: Optional[int]
    final: Optional[Score]
    best: Optional[Score]
    wall_s: Optional[float]  # over every attempt (status.json's total_wall_s); None: unknown
    config: dict[str, Any] = field(repr=False)  # config.yaml, flattened
    status: Optional[RunStatus] = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.outcome == "finished"

    @property
    def outcome_text(self) -> str:
        """The outcome with what says more: ``stopped (SIGTERM)``, ``failed (exit 2)``."""
        status = self.status
        if status is None or self.outcome == "killed":
            return self.outcome
        if self.outcome == "stopped" and status.stopped_by:
            return f"stopped ({status.stopped_by})"
        if self.outcome in ("failed", "diverged") and status.exit_code is not None:
            return f"{self.outcome} (exit {status.exit_code})"
        return self.outcome


def summarize(run_dir: Path) -> RunSummary:
    """What ``run_dir`` says of its run; a UserError when it holds none of a run's files."""
    run_dir = Path(run_dir)
    if not any((run_dir / name).is_file() for name in (STATUS_FILE, CONFIG_FILE, METRICS_FILE)):
        raise UserError(f"{run_dir} is not a run dir: it has none of {STATUS_FILE}, {CONFIG_FILE}, {METRICS_FILE}")
    config = read_run_config(run_dir)
    status = read_status(run_dir)
    killed = False
    if status is not None and status.outcome == "running" and not _held(run_dir):
        status = read_status(run_dir)  # read again: the run may have ended between the two looks
        killed = status is not None and status.outcome == "running"
    if status is not None:
        outcome = "killed" if killed else status.outcome
        return RunSummary(run_dir, outcome, status.step, status.max_steps, status.final, status.best,
                          status.total_wall_s, config, status)
    scores = read_val_metrics(run_dir / METRICS_FILE)
    steps = [r["step"] for r in metrics_records(run_dir / METRICS_FILE)]
    max_steps = whole_number(config.get("train.max_steps"))
    return RunSummary(run_dir, "unknown", max(steps) if steps else None, max_steps, scores.final, scores.best, None,
                      config)


def _held(run_dir: Path) -> bool:
    from segadv.training.lock import is_held  # torch comes with it: only for a run that says it is running

    return is_held(run_dir)
