"""Where metrics go: TensorBoard event files and ``metrics.jsonl`` (one JSON object per event)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


class MetricWriter:
    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.tensorboard_dir = run_dir / "tensorboard"
        # Append: a resumed run continues the same file.
        self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.tensorboard_dir))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        record = {"step": step, "time": round(time.time(), 3), **values}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for tag, value in values.items():
                self._tb.add_scalar(tag, value, step)

    def image(self, step: int, tag: str, image_chw_uint8: torch.Tensor) -> None:
        if self._tb is not None:
            self._tb.add_image(tag, image_chw_uint8, step, dataformats="CHW")

    def flush(self) -> None:
        self._jsonl.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
