"""The checkpoint a run dir stands for, where a command takes a checkpoint (``segadv-eval
--checkpoint RUN_DIR``, ``segadv-ckpt inspect RUN_DIR``): its best, ``checkpoints/best.pt`` (the
best evaluation by ``checkpoint.best_by``, which ``best.json`` names with the score that chose it); without one (no evaluation yet), its
``last.pt``, said so. Lightning's ``ckpt_path="best"``, for a directory."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from segadv.errors import UserError
from segadv.readback import check_regular, read_json, real_number, whole_number

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
BEST_RECORD = "best.json"
# Files only a run dir has: a directory with one of them is a run dir, whatever else it lacks.
RUN_FILES = ("status.json", "config.yaml", "metrics.jsonl")


@dataclass(frozen=True)
class BestRecord:
    """``best.json``, validated: the step of ``best.pt``, its val mIoU, and the score that chose it."""

    step: int
    miou: float
    by: str
    score: Optional[float]

    def text(self) -> str:
        chosen = f"val mIoU {self.miou:.4f}"
        if self.by != "val/mIoU":
            value = f" {self.score:.4f}" if self.score is not None else ""
            chosen = f"chosen by {self.by}{value}, val mIoU {self.miou:.4f}"
        return f"step {self.step}, {chosen}, per {BEST_RECORD}"


def read_best_record(directory: Path) -> Optional[BestRecord]:
    """``directory/best.json`` as a :class:`BestRecord`; None when there is none, and (with a warning
    naming why) when it is not one: unreadable (through segadv/readback.py: bytes, a FIFO), a step
    that is not a whole number, an mIoU outside 0..1, a ``by`` that is not a ``checkpoint.best_by``
    score, or such a score without its value. Every reader of best.json goes through here."""
    from segadv.config.schema import BEST_BY

    path = directory / BEST_RECORD
    try:
        record = read_json(path, cap=1 << 20)
    except FileNotFoundError:
        return None
    except (OSError, UserError) as err:
        log.warning("%s: set aside (%s)", path, err)
        return None
    problem = None
    if not isinstance(record, dict):
        problem = "it is not a JSON object"
    else:
        step, miou = whole_number(record.get("step")), real_number(record.get("mIoU"))
        by, score = record.get("by", "val/mIoU"), real_number(record.get("score"))
        if step is None:
            problem = f"its step {record.get('step')!r} is not a whole number"
        elif miou is None or not (math.isnan(miou) or 0 <= miou <= 1):
            problem = f"its mIoU {record.get('mIoU')!r} is not a score in 0..1"
        elif by not in BEST_BY:
            problem = f"its by {by!r} is not a score checkpoint.best_by chooses by ({', '.join(BEST_BY)})"
        elif by != "val/mIoU" and score is None:
            problem = f"its score {record.get('score')!r} (by {by}) is not a number"
    if problem is not None:
        log.warning("%s: %s; set aside (not reported, not used)", path, problem)
        return None
    return BestRecord(step, miou, by, score)


def checkpoint_file(path: Path) -> bool:
    """True when ``path`` is (a link to) a regular file, False when nothing is there; anything else
    standing there (a folder, a FIFO, a dangling link) is a UserError naming it, never taken for
    "no such checkpoint"."""
    if not os.path.lexists(path):
        return False
    try:
        check_regular(path)
    except FileNotFoundError:
        raise UserError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist") from None
    except UserError as err:
        raise UserError(f"checkpoint {err}") from None
    return True


@dataclass(frozen=True)
class RunCheckpoint:
    path: Path
    note: str  # one line: which of the run's checkpoints, and why (best.json's record as read)
    record: Optional[BestRecord] = None

    def checked_note(self, step: Optional[int]) -> str:
        """:attr:`note` once the checkpoint's own ``step`` is known: a best.json naming another step
        does not describe this best.pt, so it is set aside with a warning and not repeated."""
        if self.record is None or step is None or step == self.record.step:
            return self.note
        log.warning("%s names step %d, but %s is the checkpoint of step %d: best.json does not describe it "
                    "(set aside; its score is not this checkpoint's)", self.path.parent / BEST_RECORD,
                    self.record.step, self.path, step)
        return self.note.replace(f" ({self.record.text()})", f" (step {step})")


def checkpoint_of_run(path: str | Path) -> Optional[RunCheckpoint]:
    """The checkpoint ``path`` means when it is a run dir; None when it is not one (a file, an
    smp directory). A run dir without a checkpoint is a UserError naming what is missing; a
    ``best.pt`` or ``last.pt`` that is not a file (a folder) is one naming it."""
    run_dir = Path(path)
    if not run_dir.is_dir():
        return None
    directory = run_dir / CHECKPOINT_DIR
    if not directory.is_dir():
        if any((run_dir / name).is_file() for name in RUN_FILES):
            raise UserError(f"run dir {run_dir} has no {CHECKPOINT_DIR}/ directory: the run wrote no checkpoint")
        return None
    best, last = directory / "best.pt", directory / "last.pt"
    if checkpoint_file(best):
        record = read_best_record(directory)
        shown = f" ({record.text()})" if record is not None else ""
        return RunCheckpoint(best, f"run dir {run_dir}: its best checkpoint, {best}{shown}", record)
    if checkpoint_file(last):
        return RunCheckpoint(last, f"run dir {run_dir}: no best.pt (the run made no evaluation), so its last "
                                   f"checkpoint, {last}")
    raise UserError(f"run dir {run_dir} has neither {CHECKPOINT_DIR}/best.pt nor {CHECKPOINT_DIR}/last.pt: "
                    "no checkpoint was written (name a checkpoint file with a step_<N>.pt, or resume the run)")
