"""How a run ended: ``RUN/status.json`` (docs/training.md, "How a run ended: status.json").

Rank 0 writes it atomically (segadv/fsutil.py): ``running`` when the training loop starts, again
at every evaluation (with the scores so far), then the outcome when the process leaves the run:

- ``finished``: ``train.max_steps`` reached;
- ``stopped``: a SIGTERM / SIGINT / SIGHUP, the launcher's death, ``stop_at`` or D out of its band
  (``train.on_discriminator_collapse: stop``) ended it early at a checkpoint (the trainer exits 0),
  or a signal ended it at once (a second Ctrl-C: exit 130);
- ``diverged``: a non-finite loss or weight (:class:`segadv.errors.Diverged`, exit 3);
- ``failed``: any other error (a user error met mid-run, a failed write, a crash), its message
  and its exit code recorded.

The outcome is written on every way out of a run, a full disk included: where the atomic write
finds no room for its temp file (ENOSPC, EDQUOT), the record is written over the existing file in
place, in the blocks it already holds (:func:`rewrite_in_place`; the error message shortened to
fit). Where even that fails (no status.json yet, a copy-on-write file system that needs a new block
for any write), a warning says so and the outcome is the exit code and the error line alone.

Exit code 0 therefore says "finished or stopped"; this file says which. A run killed outright
(SIGKILL, OOM, power loss) cannot write: it stays ``running`` while no process holds the run dir
(:func:`segadv.training.lock.is_held`). A start that fails before its first step writes nothing into a
run dir without a status.json (there is no run to describe); into one with a status.json from an
earlier attempt it writes ``failed``, so the file never claims what the latest attempt contradicts.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, model_serializer

from segadv import __version__
from segadv.errors import Diverged, EXIT_OK, WriteFailed, exit_code_of
from segadv import fsutil
from segadv.fsutil import atomic_write_text
from segadv.readback import Unreadable, read_text
from segadv.signals import Interrupted

log = logging.getLogger(__name__)

STATUS_FILE = "status.json"
Outcome = Literal["running", "finished", "stopped", "diverged", "failed"]


class Score(BaseModel):
    """One evaluation on val: its step, val mIoU and pixel accuracy (None where not known: the
    best of a run resumed from a checkpoint whose evaluation this file never saw)."""

    step: int
    mIoU: float
    pixel_acc: Optional[float] = None
    # The label-free scores of that evaluation (proxy/<name>), where the run logs them.
    proxies: Optional[dict[str, float]] = None
    # For the best: the score that chose it (checkpoint.best_by) and its value; None: val/mIoU.
    by: Optional[str] = None
    score: Optional[float] = None

    @model_serializer(mode="wrap")
    def _written(self, handler: Any) -> dict[str, Any]:
        """The fields a run without label-free scores or checkpoint.best_by does not have are left
        out of status.json rather than written as null."""
        return {key: value for key, value in handler(self).items()
                if value is not None or key not in ("proxies", "by", "score")}


class DiscriminatorHealth(BaseModel):
    """An episode of D out of its healthy band (docs/training.md, "D's health")."""

    condition: Literal["wins", "collapsed", "unstable"]  # "D wins outright", "D collapsed", "D unstable"
    loss: str  # the D loss: loss_d, loss_d_aux
    step: int  # the log step of the warning
    since: int  # the first log step of its window
    values: dict[str, float]  # at ``step``, as logged: the D loss and D's accuracies
    until: Optional[int] = None  # the first log step back in the band; None: not back where this was written


class RunStatus(BaseModel):
    """The contents of ``status.json``. Fields a newer segadv adds are ignored when read."""

    model_config = ConfigDict(extra="ignore")

    outcome: Outcome
    step: int  # the step reached (while running: the last evaluation's, or the start step)
    max_steps: int
    start_step: int  # where this attempt started: 0, or the step it resumed from
    final: Optional[Score] = None  # the last evaluation, at or before ``step``
    best: Optional[Score] = None  # the best evaluation by checkpoint.best_by: checkpoints/best.pt
    stopped_by: Optional[str] = None  # stopped: SIGTERM, SIGINT, "launcher gone", stop_at, ...
    error: Optional[str] = None  # diverged / failed: the error's message
    # D's episodes out of its band (the last HEALTH_EPISODES), oldest first; [] where it stayed in.
    discriminator_health: list[DiscriminatorHealth] = []
    exit_code: Optional[int] = None  # the process's exit code (None while running)
    wall_s: float  # this attempt's wall time, from taking the run dir to the end
    total_wall_s: float  # summed over the attempts since step 0 (a resumed attempt adds its own)
    started_at: str  # this attempt's start, ISO 8601 in UTC
    ended_at: Optional[str] = None
    segadv_version: str


def read_status(run_dir: Path) -> Optional[RunStatus]:
    """The run's status.json; None when it has none or it cannot be read (logged: an unreadable
    file is reported, never taken for a missing one silently)."""
    path = Path(run_dir) / STATUS_FILE
    try:
        text = read_text(path, cap=1 << 20, what="a status file")  # bytes, a FIFO: segadv/readback.py
    except FileNotFoundError:
        return None
    except Unreadable as err:
        log.warning("%s: set aside", err)
        return None
    try:
        return RunStatus.model_validate_json(text)
    except ValidationError as err:
        log.warning("%s is not a segadv status file: %s", path, err.errors()[0]["msg"])
        return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def outcome_of(err: BaseException) -> Outcome:
    if isinstance(err, Diverged):
        return "diverged"
    if isinstance(err, KeyboardInterrupt):  # a second Ctrl-C: stopped at once, no checkpoint of its step
        return "stopped"
    return "failed"


class RunRecord:
    """One attempt at a run, as status.json tells it; ``enabled`` on rank 0 only.

    ``with RunRecord(run_dir, max_steps) as record:`` around the run; the loop calls :meth:`begin`
    once it starts, :meth:`evaluated` after each evaluation, :meth:`reached` when it leaves, and a
    run that returns calls :meth:`end`. An exception leaving the ``with`` is recorded as
    ``diverged`` or ``failed`` (``stopped`` for KeyboardInterrupt) and goes on unchanged: a failure
    to write the record is logged, never raised over the error it records."""

    def __init__(self, run_dir: Path, max_steps: int, enabled: bool = True) -> None:
        self.path = Path(run_dir) / STATUS_FILE
        self.max_steps = max_steps
        self.enabled = enabled
        self.started_at = _now()
        self._clock = time.monotonic()
        self.previous = read_status(run_dir) if enabled else None
        self.start_step = self.step = 0
        self.final: Optional[Score] = None
        self.best: Optional[Score] = None
        self._known: dict[int, Score] = {}  # evaluations by step: this attempt's, and the earlier ones kept
        self.d_health: list[DiscriminatorHealth] = []
        self.wall_before: float | None = None  # the wall seconds the checkpoint resumed from recorded
        self.begun = self.closed = False

    def __enter__(self) -> "RunRecord":
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if err is None or self.closed or not self.enabled or not (self.begun or self.previous is not None):
            return
        if not self.begun:  # a start that failed: the run stands where the earlier attempt left it
            self.start_step = self.step = self.previous.step
            self.final, self.best = self.previous.final, self.previous.best
            self.d_health = list(self.previous.discriminator_health)
        stopped_by = None
        if isinstance(err, KeyboardInterrupt):  # a signal that ended the run at once
            stopped_by = err.name if isinstance(err, Interrupted) else "SIGINT"
        message = None if isinstance(err, KeyboardInterrupt) else (str(err) or type(err).__name__)
        try:
            self._close(outcome_of(err), exit_code_of(err), stopped_by=stopped_by, error=message)
        except Exception as write_err:  # the error being recorded is the one to report
            log.warning("could not record the run's outcome in %s: %s; it is the exit code (%d) and the error "
                        "line alone", self.path, write_err, exit_code_of(err))

    def begin(self, step: int, best: Mapping[str, Any] | None, wall_before: float | None = None) -> None:
        """The loop starts at ``step`` (0, or the step resumed from) with the checkpoint's best
        evaluation (``{"mIoU", "step"}``) and the wall seconds it recorded up to its step
        (``wall_before``; None: it has no clock); writes ``running``."""
        self.begun = True
        self.wall_before = wall_before
        self.start_step = self.step = step
        previous = self.previous
        if previous is not None:  # what the earlier attempts measured up to where this one starts
            for score in (previous.final, previous.best):
                if score is not None and score.step <= step:
                    self._known[score.step] = score
            if previous.final is not None and previous.final.step <= step:
                self.final = previous.final
            # D's episodes up to the step resumed from (one that ended later is open again: the
            # check starts over).
            self.d_health = [episode.model_copy(update={"until": None}) if (episode.until or 0) > step else episode
                             for episode in previous.discriminator_health if episode.step <= step]
        self.best = self._best(best)
        self._write("running")

    def evaluated(self, step: int, metrics: Mapping[str, Any], best: Mapping[str, Any] | None) -> None:
        """An evaluation at ``step`` (val ``metrics``) and the best so far after it; rewrites ``running``."""
        self.step = step
        self.final = self._known[step] = Score(step=step, mIoU=float(metrics["mIoU"]),
                                                pixel_acc=float(metrics["pixel_acc"]),
                                                proxies=metrics.get("proxies") or None)
        self.best = self._best(best)
        self._write("running")

    def discriminator_health(self, event: Any) -> None:
        """D left its band, or (``event.back``) came back into it, at a log step
        (segadv/monitor/diagnostics.py's ``HealthEvent``); rewrites ``running``."""
        if event.back:
            for episode in reversed(self.d_health):
                if episode.loss == event.loss and episode.until is None:
                    episode.until = event.step
                    break
        else:
            self.d_health.append(DiscriminatorHealth(condition=event.condition, loss=event.loss, step=event.step,
                                                     since=event.since, values=event.values))
            del self.d_health[:-HEALTH_EPISODES]
        self._write("running")

    def reached(self, step: int) -> None:
        """The step the loop got to, however it left."""
        self.step = step

    def end(self, stopped_by: str | None) -> None:
        """The run returned: ``finished``, or ``stopped`` (``stopped_by``: why)."""
        self._close("stopped" if stopped_by else "finished", EXIT_OK, stopped_by=stopped_by)

    def wall(self) -> float:
        """This attempt's wall seconds so far."""
        return time.monotonic() - self._clock

    def _best(self, best: Mapping[str, Any] | None) -> Optional[Score]:
        """The checkpoint manager's best (``best.pt``), with its pixel accuracy where an evaluation
        of that step is known."""
        if best is None:
            return None
        step, miou = int(best["step"]), float(best["mIoU"])
        known = self._known.get(step)
        same = known is not None and known.mIoU == miou
        by = best.get("by")
        return Score(step=step, mIoU=miou, pixel_acc=known.pixel_acc if same else None,
                     proxies=known.proxies if same else None, by=None if by in (None, "val/mIoU") else by,
                     score=None if by in (None, "val/mIoU") else best.get("score"))

    def _close(self, outcome: Outcome, exit_code: int, **fields: Any) -> None:
        self.closed = True
        if not self.enabled:
            return
        try:
            self._write(outcome, exit_code=exit_code, ended_at=_now(), **fields)
        except WriteFailed as err:
            if err.err.errno not in NO_ROOM:
                raise
            # A full disk has no room for the temp file of an atomic write; the file written
            # before still holds its blocks, and the record is rewritten in them.
            self._write(outcome, exit_code=exit_code, ended_at=_now(), in_place=True, **fields)
            log.warning("%s: the disk is full, so the run's outcome was written over the file in place", self.path)

    def _write(self, outcome: Outcome, in_place: bool = False, **fields: Any) -> None:
        if not self.enabled:
            return
        wall = time.monotonic() - self._clock
        earlier = 0.0
        if self.start_step > 0:
            # The previous attempt's total where it ended at the step this one resumed from (its
            # shutdown included); else (a rewind, a run killed past its checkpoint, no status.json)
            # the time the checkpoint recorded up to its step.
            ended_here = self.previous is not None and self.previous.step == self.start_step
            if ended_here or self.wall_before is None:
                earlier = self.previous.total_wall_s if self.previous is not None else 0.0
            else:
                earlier = self.wall_before
        status = RunStatus(
            outcome=outcome, step=self.step, max_steps=self.max_steps, start_step=self.start_step,
            final=self.final, best=self.best, wall_s=round(wall, 1), total_wall_s=round(earlier + wall, 1),
            discriminator_health=self.d_health,
            started_at=self.started_at, segadv_version=__version__, **fields,
        )
        text = status.model_dump_json(indent=1) + "\n"
        if in_place:
            status.error = _shortened(status.error, len(text.encode()) - _room(self.path))
            rewrite_in_place(self.path, (status.model_dump_json(indent=1) + "\n").encode())
        else:
            atomic_write_text(self.path, text)


HEALTH_EPISODES = 20  # D's episodes out of its band status.json keeps, the latest

# A write that fails for want of room: a full disk or an exhausted quota.
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


def _room(path: Path) -> int:
    """The bytes ``path`` can hold without a new block: its size, or the blocks it holds (a file
    of a few hundred bytes holds a whole block of 4 KiB on most file systems); 0 for no file."""
    try:
        info = os.stat(path)
    except OSError:
        return 0
    return max(info.st_size, getattr(info, "st_blocks", 0) * 512)


def _shortened(error: Optional[str], excess: int) -> Optional[str]:
    """The error message cut by ``excess`` bytes (and a mark), so the record fits the file's room."""
    if error is None or excess <= 0:
        return error
    keep = max(0, len(error.encode()) - excess - 8)
    return error.encode()[:keep].decode(errors="ignore") + " [...]"


def rewrite_in_place(path: Path, data: bytes) -> None:
    """``data`` written over the existing file ``path`` from its start, the last resort of a
    record when there is no room for a temp file: no new file, and no new block where ``data``
    fits the blocks the file holds. A shorter record is padded with spaces to the old size (JSON
    allows them), so the file is never cut and reads whole once the write is done. Not atomic
    (a crash in the middle of it can leave a mix, which the reader sets aside); an OSError is a
    :class:`WriteFailed` naming ``path`` (no file there, or no room even for this)."""
    try:
        # no O_CREAT: a new file needs room; no O_TRUNC: keep the blocks. The run dir's rule: a link
        # is never written through, a device or FIFO there is refused (segadv/fsutil.py).
        fd = fsutil.open_run_file(path, os.O_WRONLY)
    except OSError as err:
        raise WriteFailed(path, err) from None
    try:
        size = os.fstat(fd).st_size
        if len(data) < size:
            data = data[:-1] + b" " * (size - len(data)) + b"\n"
        with os.fdopen(fd, "r+b", buffering=0, closefd=False) as fh:
            fsutil.write_all(fh, data)
        os.fsync(fd)
    except OSError as err:
        raise WriteFailed(path, err) from None
    finally:
        os.close(fd)
