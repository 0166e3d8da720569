"""Running averages that stay on the device until log time (no per-step host sync)."""

from __future__ import annotations

import time

import torch

# An iteration's ``empty/<loss>``: 1 where a term of <loss> averaged over no pixel (segadv/engine/
# losses.py), so its mean over the steps since the last log line, train/empty/<loss>, is the share
# of them. Usually 0: the console's line shows one only when it is not.
EMPTY_PREFIX = "empty/"


def console_losses(means: dict[str, float]) -> dict[str, float]:
    """The means a log line shows: every one but an ``empty/<loss>`` of 0."""
    return {name: value for name, value in means.items() if not (name.startswith(EMPTY_PREFIX) and value == 0)}


class LossAverager:
    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0

    def update(self, losses: dict[str, torch.Tensor]) -> None:
        for name, value in losses.items():
            total = self._sums.get(name)
            self._sums[name] = value if total is None else total + value
        self._count += 1

    @property
    def steps(self) -> int:
        """Steps averaged since the last pop."""
        return self._count

    def means(self) -> dict[str, float]:
        """Mean of each loss since the last pop; reading the values syncs with the device."""
        return {name: float(total) / self._count for name, total in self._sums.items()}

    def pop_means(self) -> dict[str, float]:
        """:meth:`means`, and start over."""
        means = self.means()
        self._sums.clear()
        self._count = 0
        return means


class StepTimer:
    """Splits wall time per step into waiting for data and the rest (torchvision's MetricLogger).

    Data waits come per stream (a method may draw from several); ``perf/data_time`` is their
    sum, and with more than one stream each also shows as ``perf/data_time/<stream>``.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._data: dict[str, float] = {}
        self._steps = 0
        self._since = time.perf_counter()

    def add_data_wait(self, seconds: float | dict[str, float]) -> None:
        """One step's wait for data: seconds, or seconds per stream."""
        waits = seconds if isinstance(seconds, dict) else {"data": seconds}
        for name, value in waits.items():
            self._data[name] = self._data.get(name, 0.0) + value
        self._steps += 1

    def pop(self) -> dict[str, float]:
        """Average data and step time per step since the last call. Call after a device sync
        (reading the losses is one) so asynchronous GPU work is counted."""
        elapsed = time.perf_counter() - self._since
        steps = max(self._steps, 1)
        data = sum(self._data.values())
        out = {"perf/data_time": data / steps, "perf/step_time": (elapsed - data) / steps}
        if len(self._data) > 1:
            out.update({f"perf/data_time/{name}": value / steps for name, value in self._data.items()})
        self.reset()
        return out
