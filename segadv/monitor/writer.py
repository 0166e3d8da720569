"""Where metrics go: TensorBoard event files and ``metrics.jsonl`` (one JSON object per event)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Iterator

import torch

from segadv.errors import WriteFailed
from segadv.fsutil import atomic_write_text


class MetricWriter:
    """``resume_step``: a resumed run continues the same files; whatever the interrupted run
    logged after that step is dropped so no step appears twice. A failed write (a full disk, no
    permission) raises :class:`segadv.errors.WriteFailed` naming the file; ``close()`` after one
    does not raise again."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None) -> None:
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.tensorboard_dir = run_dir / "tensorboard"
        self.failed = False
        if resume_step is not None:
            self._drop_records_after(resume_step)
        with self._writing(self.jsonl_path):
            self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard hides the old run's events from this step on.
            purge = None if resume_step is None else resume_step + 1
            with self._writing(self.tensorboard_dir):
                self._tb = SummaryWriter(log_dir=str(self.tensorboard_dir), purge_step=purge)

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        try:
            yield
        except WriteFailed:
            self.failed = True
            raise
        except OSError as err:  # TensorBoard's writer thread re-raises its error on the next call
            self.failed = True
            raise WriteFailed(path, err) from None

    def _drop_records_after(self, step: int) -> None:
        if not self.jsonl_path.is_file():
            return
        kept = []
        for line in self.jsonl_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if record.get("step", 0) <= step:
                kept.append(line)
        atomic_write_text(self.jsonl_path, "".join(line + "\n" for line in kept))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        record = {"step": step, "time": round(time.time(), 3), **values}
        with self._writing(self.jsonl_path):
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            with self._writing(self.tensorboard_dir):
                for tag, value in values.items():
                    self._tb.add_scalar(tag, value, step)

    def image(self, step: int, tag: str, image_chw_uint8: torch.Tensor) -> None:
        if self._tb is not None:
            with self._writing(self.tensorboard_dir):
                self._tb.add_image(tag, image_chw_uint8, step, dataformats="CHW")

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

    def close(self) -> None:
        for path, closable in ((self.jsonl_path, self._jsonl), (self.tensorboard_dir, self._tb)):
            if closable is None:
                continue
            try:
                closable.close()
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

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
