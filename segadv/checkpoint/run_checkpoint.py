"""The checkpoint a run dir stands for, where a command takes a checkpoint (``segadv-eval
--checkpoint RUN_DIR``, ``segadv-ckpt inspect RUN_DIR``): its best, ``checkpoints/best.pt`` (the
best evaluation by ``checkpoint.best_by``, which ``best.json`` names with the score that chose it); without one (no evaluation yet), its
``last.pt``, said so. Lightning's ``ckpt_path="best"``, for a directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from segadv.errors import UserError
from segadv.readback import read_json, real_number, whole_number

CHECKPOINT_DIR = "checkpoints"
# Files only a run dir has: a directory with one of them is a run dir, whatever else it lacks.
RUN_FILES = ("status.json", "config.yaml", "metrics.jsonl")


@dataclass(frozen=True)
class RunCheckpoint:
    path: Path
    note: str  # one line: which of the run's checkpoints, and why


def _best_record(directory: Path) -> str:
    try:  # through segadv/readback.py: bytes, a FIFO, a step of 1e400 are no record
        record = read_json(directory / "best.json", cap=1 << 20)
        step, miou = whole_number(record["step"]), real_number(record["mIoU"])
    except (OSError, UserError, KeyError, TypeError):
        return ""
    if step is None or miou is None:
        return ""
    by, score = record.get("by", "val/mIoU"), record.get("score")
    chosen = f"val mIoU {miou:.4f}"
    if by != "val/mIoU" and isinstance(by, str):
        value = real_number(score) if score is not None else None
        chosen = f"chosen by {by}" + (f" {value:.4f}" if value is not None else "") + f", val mIoU {miou:.4f}"
    return f" (step {step}, {chosen}, per best.json)"


def checkpoint_of_run(path: str | Path) -> Optional[RunCheckpoint]:
    """The checkpoint ``path`` means when it is a run dir; None when it is not one (a file, an
    smp directory). A run dir without a checkpoint is a UserError naming what is missing."""
    run_dir = Path(path)
    if not run_dir.is_dir():
        return None
    directory = run_dir / CHECKPOINT_DIR
    if not directory.is_dir():
        if any((run_dir / name).is_file() for name in RUN_FILES):
            raise UserError(f"run dir {run_dir} has no {CHECKPOINT_DIR}/ directory: the run wrote no checkpoint")
        return None
    best, last = directory / "best.pt", directory / "last.pt"
    if best.is_file():
        return RunCheckpoint(best, f"run dir {run_dir}: its best checkpoint, {best}{_best_record(directory)}")
    if last.is_file():
        return RunCheckpoint(last, f"run dir {run_dir}: no best.pt (the run made no evaluation), so its last "
                                   f"checkpoint, {last}")
    raise UserError(f"run dir {run_dir} has neither {CHECKPOINT_DIR}/best.pt nor {CHECKPOINT_DIR}/last.pt: "
                    "no checkpoint was written (name a checkpoint file with a step_<N>.pt, or resume the run)")
