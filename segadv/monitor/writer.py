"""Where metrics go: TensorBoard event files and ``metrics.jsonl`` (one JSON object per event), and
the W&B / MLflow runs the config turns on (segadv/monitor/trackers.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import torch

from segadv.errors import UserError, WriteFailed
from segadv import fsutil
from segadv.fsutil import atomic_write_text
from segadv.monitor.trackers import Trackers, open_trackers
from segadv.readback import parse_json, read_bytes

if TYPE_CHECKING:
    from segadv.config import Config

log = logging.getLogger(__name__)


class GuardedRecords:
    """TensorBoard's record writer as its writer thread calls it. An OSError there (a disk that
    fills) would end the thread with its own traceback on stderr; here it is kept for the main
    thread, which raises it as :class:`WriteFailed` at its next TensorBoard call, and later records
    are dropped."""

    def __init__(self, records: object) -> None:
        self.records = records
        self.error: OSError | None = None

    def write(self, data: bytes) -> None:
        if self.error is None:
            try:
                self.records.write(data)
            except OSError as err:
                self.error = err

    def flush(self) -> None:
        if self.error is None:
            try:
                self.records.flush()
            except OSError as err:
                self.error = err

    def close(self) -> None:
        self.records.close()


def guard_event_writer(summary_writer: object) -> GuardedRecords | None:
    """Put a :class:`GuardedRecords` between the summary writer's event file and its writer thread
    (tensorboard's ``EventFileWriter._async_writer``); None, with a debug line, where a tensorboard
    version lays it out otherwise (its thread's own error handling then applies)."""
    async_writer = getattr(getattr(summary_writer._get_file_writer(), "event_writer", None), "_async_writer", None)
    worker = getattr(async_writer, "_worker", None)
    if async_writer is None or worker is None or not hasattr(worker, "_record_writer"):
        log.debug("tensorboard's event writer has another layout: its thread's errors are not guarded")
        return None
    guard = GuardedRecords(async_writer._writer)
    async_writer._writer = worker._record_writer = guard
    return guard


def read_records(path: Path) -> list[tuple[str, dict]]:
    """Every record of a ``metrics.jsonl`` as ``(line, record)``. Only the last line may be cut
    short (a crash mid-write): it is dropped. Anything else that is not a JSON record (binary
    bytes, an edit) is a UserError naming the file and the line: the file is the run's history, so
    it is never rewritten without it."""
    try:
        lines = read_bytes(path).splitlines()  # a FIFO or a link loop: UserError naming it
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror or err}") from None
    records = []
    for number, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
            record = parse_json(line)  # nesting too deep for the interpreter: a ValueError too
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not a record")
        except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            if number == len(lines) and _cut_short(raw):
                continue
            raise UserError(f"{path}: line {number} is not a metrics record ({err}): repair the file, or move it "
                            "away to go on without the run's logged history") from None
        records.append((line, record))
    return records


def _cut_short(raw: bytes) -> bool:
    """Whether a line that does not parse is the start of a record (what a crash leaves)."""
    return raw.startswith(b'{"step": ')


class MetricWriter:
    """``resume_step``: a resumed run continues the same files; whatever the interrupted run
    logged after that step is dropped so no step appears twice. A failed write (a full disk, no
    permission) raises :class:`segadv.errors.WriteFailed` naming the file; ``close()`` after one
    does not raise again."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None,
                 trackers: Trackers | None = None) -> None:
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.trackers = trackers  # W&B, MLflow (segadv/monitor/trackers.py): scalars and images, after the files
        self.tensorboard_dir = run_dir / "tensorboard"
        self.failed = False
        if resume_step is not None:
            self._drop_records_after(resume_step)
        with self._writing(self.jsonl_path):
            self._jsonl = fsutil.open_append(self.jsonl_path)  # the run dir's rule: no link followed
        self._tb = None
        self._tb_guard: GuardedRecords | None = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard hides the old run's events from this step on.
            purge = None if resume_step is None else resume_step + 1
            with self._writing(self.tensorboard_dir):
                self._tb = SummaryWriter(log_dir=str(self.tensorboard_dir), purge_step=purge)
                self._tb_guard = guard_event_writer(self._tb)

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        try:
            yield
            if path == self.tensorboard_dir and self._tb_guard is not None and self._tb_guard.error is not None:
                raise self._tb_guard.error  # the writer thread's failure, raised here
        except WriteFailed:
            self.failed = True
            raise
        except OSError as err:  # TensorBoard's writer thread re-raises its error on the next call
            self.failed = True
            raise WriteFailed(path, err) from None

    def _drop_records_after(self, step: int) -> None:
        if not self.jsonl_path.is_file():
            return
        kept = [line for line, record in read_records(self.jsonl_path)
                if not isinstance(record.get("step", 0), (int, float)) or record.get("step", 0) <= step]
        atomic_write_text(self.jsonl_path, "".join(line + "\n" for line in kept))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        record = {"step": step, "time": round(time.time(), 3), **values}
        with self._writing(self.jsonl_path):
            fsutil.write_all(self._jsonl, (json.dumps(record) + "\n").encode())
        if self._tb is not None:
            with self._writing(self.tensorboard_dir):
                for tag, value in values.items():
                    self._tb.add_scalar(tag, value, step)
        if self.trackers is not None:
            self.trackers.scalars(step, values)

    def image(self, step: int, tag: str, image_chw_uint8: torch.Tensor) -> None:
        if self._tb is not None:
            with self._writing(self.tensorboard_dir):
                self._tb.add_image(tag, image_chw_uint8, step, dataformats="CHW")
        if self.trackers is not None:
            self.trackers.image(step, tag, image_chw_uint8)

    def text(self, step: int, tag: str, markdown: str) -> None:
        """A TensorBoard text summary (its TEXT tab renders Markdown); not in metrics.jsonl."""
        if self._tb is not None:
            with self._writing(self.tensorboard_dir):
                self._tb.add_text(tag, markdown, step)

    def histogram(self, step: int, tag: str, values: torch.Tensor) -> None:
        """A TensorBoard histogram of ``values`` (any shape; copied to the CPU); not in metrics.jsonl."""
        if self._tb is not None:
            with self._writing(self.tensorboard_dir):
                self._tb.add_histogram(tag, values.detach().float().cpu(), step)

    def flush(self) -> None:
        with self._writing(self.jsonl_path):
            self._jsonl.flush()
        if self._tb is not None:
            with self._writing(self.tensorboard_dir):
                self._tb.flush()

    def close(self, outcome: str = "finished") -> None:
        """The files closed, and the trackers' runs ended as ``outcome`` ("finished", "failed",
        "killed": how the attempt ended) says."""
        if self.trackers is not None:
            trackers, self.trackers = self.trackers, None
            trackers.close(outcome)
        for path, closable in ((self.jsonl_path, self._jsonl), (self.tensorboard_dir, self._tb)):
            if closable is None:
                continue
            try:
                closable.close()
                if closable is self._tb and self._tb_guard is not None and self._tb_guard.error is not None:
                    raise self._tb_guard.error
            except OSError as err:
                if not self.failed:  # after a failure, its error has been reported already
                    self.failed = True
                    raise WriteFailed(path, err) from None


class NullWriter:
    """What ranks other than 0 write to: nothing (only rank 0 logs, writes TensorBoard and files)."""

    def __init__(self, run_dir: Path) -> None:
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.tensorboard_dir = run_dir / "tensorboard"

    def scalars(self, step: int, values: dict[str, float]) -> None:
        pass

    def image(self, step: int, tag: str, image_chw_uint8: torch.Tensor) -> None:
        pass

    def histogram(self, step: int, tag: str, values: torch.Tensor) -> None:
        pass

    def text(self, step: int, tag: str, markdown: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, outcome: str = "finished") -> None:
        pass


def open_writer(run_dir: Path, tensorboard: bool, is_main: bool,
                resume_step: int | None = None, cfg: Config | None = None) -> MetricWriter | NullWriter:
    """Rank 0's writer (``resume_step``: see :class:`MetricWriter`), with the trackers ``cfg``'s
    ``log`` section turns on (W&B, MLflow: opened first, so that one that cannot start fails the
    start before a file is touched); a :class:`NullWriter` on the others."""
    if not is_main:
        return NullWriter(run_dir)
    trackers = open_trackers(cfg, run_dir, resume_step) if cfg is not None else None
    try:
        return MetricWriter(run_dir, tensorboard=tensorboard, resume_step=resume_step, trackers=trackers)
    except BaseException:
        if trackers is not None:
            trackers.close("failed")
        raise
