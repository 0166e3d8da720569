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

import logging
import math
import resource
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import torch

from segadv.parallel.placement import device_module, is_accelerator

log = logging.getLogger(__name__)

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
    """The whole run's wall time split into phases. ``earlier``: what the checkpoint a resumed
    run started from recorded (:class:`RunClock`: ``train_s`` and ``phases``), which this
    process's time adds to, so the profile and ``perf/train_seconds`` continue across resumes."""

    def __init__(self, phases: PhaseTimer, earlier: Mapping[str, Any] | None = None) -> None:
        self.phases = phases
        self.start = time.perf_counter()
        self.earlier_seconds = float(earlier["train_s"]) if earlier else 0.0
        self.earlier_phases: dict[str, float] = dict(earlier["phases"]) if earlier else {}

    def elapsed(self) -> float:
        """The training loop's seconds since step 0: the earlier attempts' and this process's."""
        return self.earlier_seconds + time.perf_counter() - self.start

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
        wall = self.elapsed()
        seconds = dict(self.earlier_phases)
        for name, value in self.phases.seconds.items():
            seconds[name] = seconds.get(name, 0.0) + value
        seconds["other"] = max(wall - sum(seconds.values()), 0.0)
        return wall, seconds


class RunClock:
    """The run's elapsed time as a checkpoint entry (key ``clock``), so that a resumed process
    continues the time instead of starting again at 0: ``train_s`` (the training loop's seconds,
    ``perf/train_seconds`` and the time profile's wall), ``wall_s`` (status.json's
    ``total_wall_s``: each attempt's start-up included) and ``phases`` (seconds per phase of the
    profile), each summed over the attempts up to the checkpoint's step. A rewind therefore
    continues from the time of the step it rewinds to, not from the abandoned future's.

    The reporter attaches the live profile and the attempt's wall clock at the loop's start;
    before that (or without a loop: segadv-plan) it holds what it loaded."""

    def __init__(self) -> None:
        self.earlier: dict[str, Any] | None = None  # the checkpoint's; None: a fresh run, or an older checkpoint
        self._profile: RunProfile | None = None
        self._attempt_wall: Callable[[], float] = lambda: 0.0

    def attach(self, profile: RunProfile, attempt_wall: Callable[[], float]) -> None:
        self._profile, self._attempt_wall = profile, attempt_wall

    def state_dict(self) -> dict[str, Any]:
        earlier = self.earlier or {"train_s": 0.0, "wall_s": 0.0, "phases": {}}
        if self._profile is None:
            return dict(earlier)
        wall, seconds = self._profile.table()  # at a save, where the loop syncs anyway
        seconds.pop("other")  # the remainder, recomputed from the totals
        return {"train_s": wall, "wall_s": earlier["wall_s"] + self._attempt_wall(), "phases": seconds}

    def load_state_dict(self, state: Any) -> None:
        try:
            loaded = {"train_s": float(state["train_s"]), "wall_s": float(state["wall_s"]),
                      "phases": {str(name): float(value) for name, value in state["phases"].items()}}
        except (TypeError, KeyError, ValueError, AttributeError):
            loaded = None
        if loaded is None or not all(math.isfinite(v) and v >= 0
                                     for v in (loaded["train_s"], loaded["wall_s"], *loaded["phases"].values())):
            # Time is a record, not training state: a clock that does not read starts again at 0.
            log.warning("the checkpoint's clock entry is not a time record: the run's time starts again at 0")
            self.earlier = None
            return
        self.earlier = loaded


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
