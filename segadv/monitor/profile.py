"""Where a run's wall time goes: seconds per phase of the training loop, without a sync per step.

Phases of an iteration (the method marks them): ``input_copy`` (the loader's batch to G's and D's
devices), ``g_fwd_bwd`` (G's forward, its losses, the frozen D pass its adversarial terms need, and
the backward through both), ``transfer`` (G's maps and the labels moved to D's device in the
forward; the backward's hop, and D's small verdicts coming back, are inside ``g_fwd_bwd``), ``d_fwd_bwd`` (D's own update, forward
and backward) and ``optimizer`` (both networks' steps, scalers and schedules). The loop adds ``data/<stream>`` (waiting for batches), ``evaluation``,
``checkpoint`` and ``logging``; ``other`` is the wall time none of them covers.

On the CPU a phase is timed with ``perf_counter`` around its work (CPU ops are synchronous). On
CUDA the host runs ahead of the device, so a phase records a pair of CUDA events on its device's
current stream; they are read when the loop syncs anyway (log time), never once per step.
``precise`` (``train.profile``) instead synchronises the phase's device before and after it: host
launch overhead included, at the cost of a sync per phase.
"""

from __future__ import annotations

import resource
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from segadv.parallel.placement import device_module, is_accelerator

STEP_PHASES = ("input_copy", "g_fwd_bwd", "transfer", "d_fwd_bwd", "optimizer")


def transfer_device(source: torch.device, target: torch.device) -> torch.device:
    """The device whose stream runs a copy: the source's for a copy from an accelerator (peer and
    device-to-host copies run on the source's current stream), else the target's."""
    return source if source.type != "cpu" else target


class PhaseTimer:
    def __init__(self, precise: bool = False) -> None:
        self.precise = precise
        self.seconds: dict[str, float] = defaultdict(float)
        self._pending: list[tuple[str, Any, Any]] = []  # (phase, begin event, end event)

    @contextmanager
    def phase(self, name: str, device: torch.device) -> Iterator[None]:
        """A phase on ``device``: CUDA events on a GPU's current stream (read at log time), host
        time elsewhere; with ``precise``, host time between two device synchronisations."""
        if not is_accelerator(device):
            start = time.perf_counter()
            yield
            self.seconds[name] += time.perf_counter() - start
            return
        module = device_module(device)
        if self.precise:
            module.synchronize(device)
            start = time.perf_counter()
            yield
            module.synchronize(device)
            self.seconds[name] += time.perf_counter() - start
        else:
            stream = module.current_stream(device)
            begin, end = module.Event(enable_timing=True), module.Event(enable_timing=True)
            begin.record(stream)
            yield
            end.record(stream)
            self._pending.append((name, begin, end))

    def add(self, name: str, seconds: float) -> None:
        """Time measured elsewhere (data waits, evaluation, ...)."""
        self.seconds[name] += seconds

    def resolve(self) -> None:
        """Reads the recorded CUDA events. Blocks until they have run: call where the loop syncs
        anyway (after reading the losses at log time)."""
        for name, begin, end in self._pending:
            end.synchronize()
            self.seconds[name] += begin.elapsed_time(end) / 1000.0
        self._pending.clear()


class RunProfile:
    """The whole run's wall time split into phases (this process's part of it: a resumed run
    profiles from its resume)."""

    def __init__(self, phases: PhaseTimer) -> None:
        self.phases = phases
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @contextmanager
    def host_phase(self, name: str) -> Iterator[None]:
        """A phase of the loop itself (evaluation, checkpoint, logging), timed on the host: each
        ends in a host read of its results, so its device work is inside."""
        start = time.perf_counter()
        yield
        self.phases.add(name, time.perf_counter() - start)

    def table(self) -> tuple[float, dict[str, float]]:
        """Total wall seconds and seconds per phase, ``other`` the remainder (never negative)."""
        self.phases.resolve()
        wall = time.perf_counter() - self.start
        seconds = dict(self.phases.seconds)
        seconds["other"] = max(wall - sum(seconds.values()), 0.0)
        return wall, seconds


def format_profile(wall: float, seconds: dict[str, float], peaks: dict[str, float]) -> str:
    lines = [f"{'phase':<22}{'seconds':>10}{'share':>8}"]
    for name, value in sorted(seconds.items(), key=lambda kv: (kv[0] == "other", -kv[1])):
        lines.append(f"{name:<22}{value:>10.2f}{value / wall if wall else 0.0:>8.1%}")
    lines.append(f"{'wall':<22}{wall:>10.2f}{1.0:>8.1%}")
    for device, gib in peaks.items():
        lines.append(f"peak memory {device}: {gib:.2f} GiB")
    return "\n".join(lines)


def profile_scalars(wall: float, seconds: dict[str, float], peaks: dict[str, float]) -> dict[str, float]:
    """``perf/time/<phase>`` (s), ``perf/share/<phase>`` (of the wall time), ``perf/peak_mem_gib/<device>``."""
    out = {"perf/time/wall": wall}
    for name, value in seconds.items():
        out[f"perf/time/{name}"] = value
        out[f"perf/share/{name}"] = value / wall if wall else 0.0
    out.update({f"perf/peak_mem_gib/{device}": gib for device, gib in peaks.items()})
    return out


def _accelerator_memory():
    """torch.accelerator's memory statistics where this torch has them (2.9+), else torch.cuda's."""
    accelerator = getattr(torch, "accelerator", None)
    return accelerator if hasattr(accelerator, "max_memory_allocated") else torch.cuda


def peak_memory_gib(devices: list[torch.device]) -> dict[str, float]:
    """Peak memory per device: an accelerator's ``max_memory_allocated``; for the CPU, the process's peak RSS."""
    peaks = {}
    for device in dict.fromkeys(devices):
        if device.type != "cpu":
            peaks[str(device)] = _accelerator_memory().max_memory_allocated(device) / 2**30
        elif device.type == "cpu":
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
            peaks["cpu"] = rss / (2**30 if sys.platform == "darwin" else 2**20)
    return peaks
