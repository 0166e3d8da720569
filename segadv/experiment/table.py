"""``segadv-experiment table RUN_DIR...``: any set of run dirs side by side, grid or not: how each
ended, its steps, final and best val mIoU with their steps, wall time, and the config keys whose
values differ between them (their ``config.yaml``; ``run_dir`` left out)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from segadv.experiment.launcher import IGNORED_KEYS
from segadv.experiment.runs import RunSummary, summarize
from segadv.monitor.status import Score

MISSING = "-"


@dataclass
class RunTable:
    runs: list[RunSummary]
    keys: list[str]  # the config keys that differ between the runs

    @classmethod
    def of(cls, run_dirs: Sequence[Path]) -> "RunTable":
        runs = [summarize(Path(d)) for d in run_dirs]
        every = list(dict.fromkeys(key for run in runs for key in run.config))
        keys = [key for key in every if key not in IGNORED_KEYS
                and len({repr(run.config.get(key, MISSING)) for run in runs}) > 1]
        return cls(runs, keys)

    def to_json(self) -> dict[str, Any]:
        return {"differing_keys": self.keys, "runs": [{
            "run_dir": str(run.run_dir), "outcome": run.outcome,
            "stopped_by": run.status.stopped_by if run.status else None,
            "exit_code": run.status.exit_code if run.status else None,
            "step": run.step, "max_steps": run.max_steps,
            "final": run.final.model_dump() if run.final else None,
            "best": run.best.model_dump() if run.best else None,
            "wall_s": run.wall_s,
            "config": {key: run.config.get(key) for key in self.keys},
        } for run in self.runs]}

    def markdown(self) -> str:
        head = ["run", "outcome", "steps", "final mIoU (step)", "best mIoU (step)", "wall", *self.keys]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for run in self.runs:
            cells = [str(run.run_dir), run.outcome_text, _steps(run), _score(run.final), _score(run.best),
                     _wall(run.wall_s), *(_value(run.config.get(key, MISSING)) for key in self.keys)]
            lines.append("| " + " | ".join(cells) + " |")
        notes = []
        if any(run.outcome == "unknown" for run in self.runs):
            notes.append("unknown: no status.json (a run from before it, or a start that failed); its steps and "
                         "scores are read from metrics.jsonl.")
        if any(run.outcome == "killed" for run in self.runs):
            notes.append("killed: its status.json says running, but no process holds the run dir.")
        if not self.keys and len(self.runs) > 1:
            notes.append("The runs' configs are the same (run_dir aside).")
        return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _steps(run: RunSummary) -> str:
    if run.step is None:
        return MISSING
    return f"{run.step}/{run.max_steps}" if run.max_steps is not None else str(run.step)


def _score(score: Optional[Score]) -> str:
    if score is None:
        return MISSING
    return f"{score.mIoU:.4f} ({score.step})" + (f", chosen by {score.by}" if score.by else "")


def _wall(seconds: Optional[float]) -> str:
    if seconds is None:
        return MISSING
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 60:.1f} min"


def _value(value: Any) -> str:
    return str(value).replace("|", "\\|")
