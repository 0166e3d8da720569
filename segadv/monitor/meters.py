"""Running averages that stay on the device until log time (no per-step host sync)."""

from __future__ import annotations

import time

import torch


class LossAverager:
    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0

    def update(self, losses: dict[str, torch.Tensor]) -> None:
        for name, value in losses.items():
            total = self._sums.get(name)
            self._sums[name] = value if total is None else total + value
        self._count += 1

    def pop_means(self) -> dict[str, float]:
        """Mean of each loss since the last call; reading the values syncs with the device."""
        means = {name: float(total) / self._count for name, total in self._sums.items()}
        self._sums.clear()
        self._count = 0
        return means


class StepTimer:
    """Splits wall time per step into waiting for data and the rest (torchvision's MetricLogger)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._data = 0.0
        self._steps = 0
        self._since = time.perf_counter()

    def add_data_wait(self, seconds: float) -> None:
        self._data += seconds
        self._steps += 1

    def pop(self) -> dict[str, float]:
        """Average data and step time per step since the last call. Call after a device sync
        (reading the losses is one) so asynchronous GPU work is counted."""
        elapsed = time.perf_counter() - self._since
        steps = max(self._steps, 1)
        out = {"perf/data_time": self._data / steps, "perf/step_time": (elapsed - self._data) / steps}
        self.reset()
        return out
