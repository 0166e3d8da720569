"""The dry run's dispatch mode: live storage bytes per device, bytes crossing devices, and the
device map enforced on every op.

Every op's outputs are seen as they are made (fake or real tensors alike): a storage not seen
before is counted on its tensor's device until it is freed (a finalizer on the storage), so the
peak is the peak of live tensor bytes, as ``torch.cuda.max_memory_allocated`` counts them less
the allocator's rounding. Bytes are filed under parameters, gradients, optimizer state or other
(activations, temporaries) when the plan marks them, and counted per phase (the build, the
iterations, an evaluation pass, a checkpoint's save and load), which the tracker enters as the
plan runs them (``DryRunMode.phase``, ``DryRunMode.iteration``).
"""

from __future__ import annotations

import contextlib
import os
import traceback
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from segadv.errors import UserError
from segadv.parallel.device_map import shown

CATEGORIES = ("params", "grads", "optimizer", "other")
# What the tracker counts apart, in order: building the networks and making the inputs, the
# method's iterations, an evaluation pass, a checkpoint's save and load (``DryRunMode.phase``).
PHASES = ("build", "iterations", "evaluation", "checkpoint")
# Ops that move data between devices on purpose (the step's to_device, autograd's way back).
COPIES = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default, torch.ops.aten._copy_from.default,
          torch.ops.aten._copy_from_and_resize.default}
# Ops that CUDA runs with CPU index tensors among their inputs (``logits[torch.arange(n)]``).
INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
            torch.ops.aten._index_put_impl_.default}
SEGADV_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN_DIR = os.path.dirname(os.path.abspath(__file__))


class PlacementError(UserError):
    """A tensor the device map does not place: made on a device the map does not name, or an op
    mixing devices. Names the op and the segadv source line."""


@dataclass
class DeviceMemory:
    """One device's live bytes by category, and per phase (``PHASES``) the most live at once and
    each category's own most, counted from what was live when the phase began."""

    live: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    peaks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    largest: dict[str, dict[str, int]] = field(
        default_factory=lambda: {phase: dict.fromkeys(CATEGORIES, 0) for phase in PHASES})
    peak_step: int | None = None  # the iteration (its step) during which peaks["iterations"] was reached
    # Live bytes of each network's parameters, gradients and optimizer state ({(role, category): bytes}),
    # and a copy of them at each phase's peak: what a wrapper that shards them (FSDP) or adds to
    # them (DDP's buckets) changes at that moment (segadv/plan/sharding.py).
    by_role: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    at_peak: dict[str, dict[tuple[str, str], int]] = field(default_factory=lambda: {phase: {} for phase in PHASES})

    def enter(self, phase: str) -> None:
        """``phase`` begins: what is live already counts towards its peak."""
        live = sum(self.live.values())
        if live >= self.peaks[phase]:
            self.peaks[phase] = live
            self.at_peak[phase] = dict(self.by_role)
        for category, nbytes in self.live.items():
            self.largest[phase][category] = max(self.largest[phase][category], nbytes)

    def add(self, category: str, nbytes: int, phase: str, step: int | None = None) -> None:
        self.live[category] += nbytes
        live = sum(self.live.values())
        self.largest[phase][category] = max(self.largest[phase][category], self.live[category])
        if live > self.peaks[phase]:
            self.peaks[phase] = live
            self.at_peak[phase] = dict(self.by_role)
            if phase == "iterations":
                self.peak_step = step

    def training_at_peak(self) -> dict[tuple[str, str], int]:
        """Each network's live state bytes at ``training_peak``'s moment."""
        return self.at_peak["iterations" if self.peaks["iterations"] > self.peaks["build"] else "build"]

    def training_peak(self) -> tuple[int, int | None]:
        """The most live at once while the run builds and trains, and the iteration that reached
        it (None: the build)."""
        if self.peaks["iterations"] > self.peaks["build"]:
            return self.peaks["iterations"], self.peak_step
        return self.peaks["build"], None

    def training_largest(self, category: str) -> int:
        return max(self.largest["build"][category], self.largest["iterations"][category])


def segadv_line(frames: traceback.StackSummary | None = None) -> str:
    """The innermost segadv source line (outside this package) on the stack, or in ``frames``."""
    for frame in reversed(traceback.extract_stack() if frames is None else frames):
        path = os.path.abspath(frame.filename)
        if path.startswith(SEGADV_DIR) and not path.startswith(PLAN_DIR):
            return f"{os.path.relpath(path, os.path.dirname(SEGADV_DIR))}:{frame.lineno}: {(frame.line or '').strip()}"
    return "(no segadv frame on the stack)"


class DryRunMode(TorchDispatchMode):
    """Counts storages per device, per phase; inside a phase other than the build, checks every
    op against ``allowed``.

    ``allowed``: the devices the map names. A CPU tensor is allowed as well when it is 0-dim (a
    host scalar, e.g. an optimizer's step count), made from CPU tensors only (the loader's batch
    handled on the host before its copy), or an integer tensor made from nothing (``arange``: an
    index, which CUDA's indexing ops take from the host; in any other op it mixes devices), or
    copied there on purpose (``.cpu()``: a panel's samples; any later op mixing it with a device's
    tensors is caught as mixing), or drawn from an explicit host ``torch.Generator`` (the mean
    teacher's mixing RNG, whose draws are copied to G's device pinned and non_blocking).
    """

    def __init__(self, allowed: Iterable[torch.device]) -> None:
        super().__init__()
        self.allowed = set(allowed)
        self.memory: dict[torch.device, DeviceMemory] = defaultdict(DeviceMemory)
        self._storages: dict[int, tuple[torch.device, int, str]] = {}
        self._owners: dict[int, str] = {}  # storage -> the role whose parameter, gradient or state it is
        # Bytes copied between devices during the last iteration (its transfers: G's maps to D,
        # gradients back, the batches from the host).
        self.transfers: dict[tuple[torch.device, torch.device], int] = defaultdict(int)
        # Floating-point operations per device (torch's FlopCounterMode formulas: convolutions and
        # matrix products, forward and backward, a checkpoint's recompute included) of the last iteration.
        self.flops: dict[torch.device, int] = defaultdict(int)
        # Images entering a trained G's forward while autograd records (whose activations are kept
        # for a backward), on each device G spans, of the last iteration.
        self.gradient_images: dict[torch.device, int] = defaultdict(int)
        self._phase = "build"
        self._step: int | None = None  # the iteration running
        self._enforce = False

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Memory inside is filed as ``name``'s (one of ``PHASES``, from what is live on entering),
        and placement is enforced."""
        if name not in PHASES:
            raise KeyError(f"no phase {name!r}; phases are {', '.join(PHASES)}")
        outer = self._phase, self._enforce
        self._phase, self._enforce = name, True
        for memory in self.memory.values():
            memory.enter(name)
        try:
            yield
        finally:
            self._phase, self._enforce = outer

    def count_gradient_images(self, images: torch.Tensor, devices: Iterable[torch.device]) -> None:
        """A trained G's forward on ``images`` (N, C, H, W) inside an iteration: with autograd
        recording, its N images carry a gradient on each of G's ``devices`` (a split G's stages
        each keep their part of the activations)."""
        if self._step is not None and torch.is_grad_enabled():
            for device in devices:
                self.gradient_images[device] += int(images.shape[0])

    @contextlib.contextmanager
    def iteration(self, step: int) -> Iterator[None]:
        """The method's iteration at ``step``: the ``iterations`` phase, with this iteration's own
        transfers and operations counted."""
        self.transfers.clear()
        self.flops.clear()
        self.gradient_images.clear()
        self._step = step
        try:
            with self.phase("iterations"):
                yield
        finally:
            self._step = None

    @contextlib.contextmanager
    def on_host(self) -> Iterator[None]:
        """Placement not enforced inside (counting goes on): a loader making its batch on the host."""
        enforce, self._enforce = self._enforce, False
        try:
            yield
        finally:
            self._enforce = enforce

    # ---------------------------------------------------------------- accounting
    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._storages:
            return
        device, nbytes = tensor.device, storage.nbytes()
        self._storages[key] = (device, nbytes, "other")
        weakref.finalize(storage, self._free, key)
        self.memory[device].add("other", nbytes, self._phase, self._step)

    def _free(self, key: int) -> None:
        device, nbytes, category = self._storages.pop(key)
        memory = self.memory[device]
        memory.live[category] -= nbytes
        owner = self._owners.pop(key, None)
        if owner is not None:
            memory.by_role[owner, category] -= nbytes

    def mark(self, tensors: Iterable[torch.Tensor], category: str, role: str | None = None) -> None:
        """File these tensors' storages under ``category`` from now on (as ``role``'s, where given:
        a network's parameters, gradients or optimizer state)."""
        for tensor in tensors:
            key = tensor.untyped_storage()._cdata
            if key not in self._storages:
                self._track(tensor)
            device, nbytes, old = self._storages[key]
            memory = self.memory[device]
            owner = self._owners.get(key)
            if old == category and owner == role:
                continue
            if owner is not None:
                memory.by_role[owner, old] -= nbytes
                del self._owners[key]
            if role is not None:
                self._owners[key] = role
                memory.by_role[role, category] += nbytes
            if old != category:
                self._storages[key] = (device, nbytes, category)
                memory.live[old] -= nbytes
                memory.add(category, nbytes, self._phase, self._step)
            if sum(memory.live.values()) == memory.peaks[self._phase]:
                # filed at the peak's own moment (what a resume's load made, filed once loaded)
                memory.at_peak[self._phase] = dict(memory.by_role)

    # ---------------------------------------------------------------- enforcement
    def _check_inputs(self, func: Any, inputs: list[torch.Tensor]) -> None:
        if func in COPIES:
            return
        host_ok = func in INDEXING  # CUDA indexes with CPU index tensors (it copies them over)
        devices = {t.device for t in inputs
                   if not (t.device.type == "cpu" and (t.dim() == 0 or (host_ok and not t.is_floating_point())))}
        if len(devices) > 1:
            raise PlacementError(f"placement: {func} mixes devices "
                                 f"{', '.join(sorted(shown(d) for d in devices))}\n  at {segadv_line()}")

    def _check_outputs(self, func: Any, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                       host_generator: bool = False) -> None:
        host_inputs_only = (bool(inputs) or host_generator) and all(t.device.type == "cpu" for t in inputs)
        for out in outputs:
            on_host_ok = (out.dim() == 0 or host_inputs_only or (not inputs and not out.is_floating_point())
                          or func in COPIES)  # a deliberate copy to the host (a panel's samples, a logged value)
            if out.device in self.allowed or (out.device.type == "cpu" and on_host_ok):
                continue  # host scalars, the host batch's own ops, index tensors made on the host
            named = ", ".join(sorted(shown(d) for d in self.allowed))
            where = shown(out.device)
            if out.device.type == "cuda":  # the plan's devices stand in for CUDA ones: this one bypassed the map
                where += " (named in the code, not taken from the device map)"
            raise PlacementError(
                f"placement: {func} made a tensor of shape {tuple(out.shape)} on {where}, "
                f"which the device map does not name ({named})\n  at {segadv_line()}")

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if self._enforce:
            self._check_inputs(func, inputs)
        result = func(*args, **kwargs)
        outputs = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
        if self._enforce:
            generator = kwargs.get("generator")
            self._check_outputs(func, inputs, outputs,
                                host_generator=isinstance(generator, torch.Generator) and generator.device.type == "cpu")
        if func in COPIES and inputs and outputs:
            source, target = (inputs[1], inputs[0]) if func is torch.ops.aten.copy_.default else (inputs[0], outputs[0])
            if source.device != target.device:
                self.transfers[(source.device, target.device)] += target.numel() * target.element_size()
        if self._phase == "iterations" and func._overloadpacket in flop_registry and outputs:
            self.flops[outputs[0].device] += int(flop_registry[func._overloadpacket](*args, **kwargs, out_val=result))
        for out in outputs:
            self._track(out)
        return result
