"""What a run dir says about its run: how it ended (``status.json``), its scores, its config, and
the diagnostics of its last quarter (``metrics.jsonl``).

A run with no status.json (a segadv from before it, or a start that failed) has the outcome
``unknown``; its step and scores are then read from ``metrics.jsonl`` and its ``max_steps`` from
``config.yaml``. A status still ``running`` whose run dir no process holds is ``killed`` (SIGKILL,
the OOM killer, a lost node: nothing could write the end).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from segadv.config.resume import flatten
from segadv.errors import UserError
from segadv.monitor.status import STATUS_FILE, RunStatus, Score, read_status

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metrics_records(metrics_path: Path) -> Iterator[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` that carry a step, in order (none if it is missing;
    a line that is not JSON, e.g. cut short by a crash, is skipped)."""
    if not metrics_path.is_file():
        return
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and _is_number(record.get("step")):
            yield record


@dataclass(frozen=True)
class ValScores:
    final: Optional[Score]  # the last evaluation
    best: Optional[Score]  # the best by val mIoU, the earliest of ties (what best.pt holds)


def read_val_metrics(metrics_path: Path) -> ValScores:
    """Final and best ``val/mIoU`` of a run from its metrics (a resumed run's repeated steps: the
    last record wins; a NaN is never the best)."""
    by_step = {int(r["step"]): r for r in metrics_records(metrics_path) if _is_number(r.get("val/mIoU"))}
    if not by_step:
        return ValScores(None, None)

    def score(step: int) -> Score:
        pixel_acc = by_step[step].get("val/pixel_acc")
        return Score(step=step, mIoU=by_step[step]["val/mIoU"], pixel_acc=pixel_acc if _is_number(pixel_acc) else None)

    scored = [s for s in by_step if not math.isnan(by_step[s]["val/mIoU"])]
    best = max(scored, key=lambda s: (by_step[s]["val/mIoU"], -s)) if scored else None
    return ValScores(score(max(by_step)), score(best) if best is not None else None)


# What a run's log says about why a method did or did not help (docs/experiments.md): D's loss and
# accuracies (real/fake, or source/target), the share of unlabeled pixels (AdvSemiSeg) or images
# (s4GAN) self-training took, G's supervised loss. Averaged over the last quarter of the run.
DIAGNOSTICS = ("loss_seg", "loss_d", "d_acc_real", "d_acc_fake", "d_acc_source", "d_acc_target",
               "semi_pixel_ratio", "st_image_ratio", "d_confidence_auroc", "d_mask_precision")
# Logged at evaluations under diag/ (does D know which of G's pixels are right?), the rest under train/.
DIAGNOSTIC_PREFIX = {"d_confidence_auroc": "diag", "d_mask_precision": "diag"}


def read_train_diagnostics(metrics_path: Path, keys: tuple[str, ...] = DIAGNOSTICS) -> dict[str, float]:
    """The mean of each ``train/<key>`` (``diag/<key>``, :data:`DIAGNOSTIC_PREFIX`) a run logged
    over the last quarter of its steps (steps past 3/4 of its last logged step); keys it never
    logged are left out."""
    records = list(metrics_records(metrics_path))
    if not records:
        return {}
    since = 0.75 * max(r["step"] for r in records)
    values: dict[str, list[float]] = {}
    for record in records:
        if record["step"] > since:
            for key in keys:
                value = record.get(f"{DIAGNOSTIC_PREFIX.get(key, 'train')}/{key}")
                if _is_number(value) and math.isfinite(value):
                    values.setdefault(key, []).append(value)
    return {key: statistics.fmean(values[key]) for key in keys if key in values}


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The run's saved ``config.yaml``, flattened to dotted keys ({} when it has none)."""
    path = run_dir / CONFIG_FILE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as err:
        log.warning("cannot read %s: %s", path, err)
        return {}
    return flatten(data) if isinstance(data, dict) else {}


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
    steps = [int(r["step"]) for r in metrics_records(run_dir / METRICS_FILE)]
    max_steps = config.get("train.max_steps")
    return RunSummary(run_dir, "unknown", max(steps) if steps else None,
                      max_steps if isinstance(max_steps, int) else None, scores.final, scores.best, None, config)


def _held(run_dir: Path) -> bool:
    from segadv.training.lock import is_held  # torch comes with it: only for a run that says it is running

    return is_held(run_dir)
