"""The dry run: segadv's own build and iteration on stand-in devices, under fake tensors.

``build_training`` (segadv/training/build.py) builds the run as segadv-train does, with the networks'
construction on ``meta`` (no values, no time) and their placement onto the stand-in devices
under ``FakeTensorMode``; then the configured method runs its iterations on stand-in batches of
the configured shape. ``measure`` runs the same iterations for real, on the map's own devices.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode

from segadv.training.build import Training, build_training
from segadv.training.role import network_settings
from segadv.training.checks import run_role_names
from segadv.config import Config
from segadv.config.roles import ROLES, role as role_spec
from segadv.data import pool_has_masks
from segadv.engine.amp_optimizer import resolve_auto
from segadv.errors import UserError
from segadv.parallel.compile import compile_enabled
from segadv.parallel.fsdp import check_gathers_in_amp, shard_units
from segadv.parallel.device_map import DeviceMap, parse_device_map
from segadv.parallel.placement import Misplaced
from segadv.plan import standin, torch_surfaces
from segadv.plan.attention import CudaAttention
from segadv.plan.accounting import DeviceMemory, DryRunMode, PlacementError, segadv_line
from segadv.plan.sharding import NetworkState, Param, Tensor, rank_plan
from segadv.plan.batches import BatchShape, FixedStream, make_batch, stream_shapes, val_size
from segadv.training.run_data import build_data, evaluate_generator, evaluate_teacher, run_state

log = logging.getLogger(__name__)


class IterationFails(UserError):
    """The method's iteration raised as segadv-train's would (a shape or batch the networks refuse)."""


@dataclass
class DevicePlan:
    device: str  # as the map names it: cuda:1, cpu
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    # Each column is its own largest over the iterations; activations_bytes: everything else
    # (activations, temporaries, the scalers' few bytes). peak_bytes: the most live at one moment.
    activations_bytes: int
    peak_bytes: int
    peak_step: int | None = None  # the step whose iteration set the peak (None: the build)
    evaluation_peak_bytes: int = 0  # the evaluation pass's own peak (G at data.val_batch_size, the panels)
    checkpoint_peak_bytes: int = 0  # a save's and a resume's load's most live at once
    measured_peak_bytes: int | None = None  # --measure: the real tensors' peak
    allocator_peak_bytes: int | None = None  # --measure: the allocator's own peak
    flops_per_iteration: int = 0  # the last planned iteration's (convolutions, matmuls; recompute included)
    # Of the last planned iteration: images through a trained G's forward with autograd recording
    # (their activations kept for a backward), on each device G spans, and that in labeled
    # batches (data.batch_size): 1 for supervised training, UniMatch V2's 3 (the labeled batch and
    # two strong views), V1's 4 (the weak view beside them; its perturbed copy is decoded in the same pass).
    gradient_images_per_iteration: int = 0
    gradient_batches_per_iteration: float = 0.0
    # What the networks' wrappers hold beside their state (segadv/plan/sharding.py): FSDP's gathered
    # units and unsharded gradients in flight, DDP's gradient buckets; counted in the peaks.
    wrapper_bytes: int = 0
    # Per network on this device: its wrapper and the rank's parameters, gradients, optimizer state
    # (sharded under FSDP) and what its wrapper holds in flight, beside the unsharded figures.
    networks: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Plan:
    devices: dict[str, DevicePlan]
    # between the map's devices (G's maps to D, gradients back, a split network's hand-overs between stages)
    transfer_bytes_per_iteration: int
    host_to_device_bytes_per_iteration: int  # the batches' copies from the host
    steps: int
    seconds: float
    notes: list[str] = field(default_factory=list)
    steps_run: list[int] = field(default_factory=list)  # the iterations' steps, in order
    world_size: int = 1  # the processes of the launch whose one rank this plans (--world-size)
    # The networks' parameters, units and optimizer state, and each device's memory record as the
    # unwrapped rank ran: what the plan for another world size is accounted from (sharding.rank_plan).
    network_states: list[NetworkState] = field(default_factory=list, repr=False)
    memory: dict[str, DeviceMemory] = field(default_factory=dict, repr=False)
    unwrapped: dict[str, DevicePlan] = field(default_factory=dict, repr=False)  # the rows as dry-run


def plan_config(cfg: Config) -> Config:
    """The run as planned: no encoder weights (their values do not matter, and nothing may be
    downloaded or read), and eager networks (``compile.*`` off: see ``compile_note``)."""
    generator = cfg.model.generator.model_copy(update={"encoder_weights": None})
    model = cfg.model.model_copy(update={"generator": generator})
    return cfg.model_copy(update={"model": model, "init": type(cfg.init)(), "compile": type(cfg.compile)()})


def compile_note(cfg: Config) -> list[str]:
    """What the plan says of ``compile.*``: the networks are planned (and measured) eager. The
    compiled graphs run the same convolutions on the same tensors, and inductor's partitioner
    usually saves fewer intermediate tensors for the backward than eager autograd does (it
    recomputes cheap pointwise ops); docs/planning.md "Compiled networks"."""
    roles = [role for role in run_role_names(cfg) if compile_enabled(cfg.compile, role)]
    if not roles:
        return []
    return [f"compile.{' and compile.'.join(roles)}: planned eager (compiled graphs usually save fewer "
            "activations for the backward; the compilation's own memory is not planned)"]


def map_devices(spec: str | None) -> DeviceMap:
    """The map as written (any CUDA index, any count: nothing needs to be visible), replica sets refused."""
    device_map = parse_device_map(spec, cuda_device_count=standin.DEVICE_COUNT)
    if spec is None or not spec.strip():
        raise UserError("segadv-plan: give the device map to plan (--device-map g:1,d:0, or cpu)")
    for role in ROLES.values():
        devices, short = device_map.devices_of(role.name), role.short
        if len(devices) > 1:
            names = "+".join(str(d) for d in devices)
            raise UserError(f"device map {spec!r}: {short}:{names} is a DataParallel replica set, which segadv-plan "
                            f"does not dry-run; plan one replica ({short}:{devices[0]}) with data.batch_size divided "
                            f"by {len(devices)}: each replica holds that, the first also the gathered outputs")
    return device_map


def without_one_device_dp(cfg: Config, device_map: DeviceMap) -> tuple[Config, list[str]]:
    """``parallel.<role>=dp`` on a single device: DataParallel over one device id runs the network
    itself there (its scatter onto the same device copies nothing), so it is planned unwrapped,
    with a note. (On the stand-in, DataParallel would look for replicas of its own.)"""
    parallel, notes = cfg.parallel, []
    for role in run_role_names(cfg):
        devices = device_map.devices_of(role)
        if network_settings(cfg, role).parallel == "dp" and len(devices) == 1:
            parallel = parallel.model_copy(update={role: "none"})
            notes.append(f"parallel.{role}=dp on one device ({devices[0]}): DataParallel runs the network itself "
                         "there; planned without the wrapper (same memory)")
    return cfg.model_copy(update={"parallel": parallel}), notes


def rank_config(cfg: Config, device_map: DeviceMap, world_size: int) -> tuple[Config, dict[str, str], list[str]]:
    """One rank of a ``world_size``-process launch: each network's wrapper as the launch gives it
    (``auto`` is ddp under a launch, as segadv-train resolves it; the teacher of a student under
    FSDP is sharded like it, else each rank holds its own copy), and the config the dry run runs,
    with every network unwrapped (``parallel.*: none``): the rank's iteration is the same, and
    sharding.py accounts the wrapper. Refused as segadv-train refuses it: a wrapper that needs a
    launch without one, a copy per process under one, FSDP over a network the map splits."""
    if world_size < 1:
        raise UserError(f"--world-size: the processes of the launch, at least 1, got {world_size}")
    parallel, modes, notes = cfg.parallel, {}, []
    names = run_role_names(cfg)
    for name in names:
        spec = role_spec(name)
        if not spec.trained:
            continue
        requested = network_settings(cfg, name).parallel
        if world_size == 1:
            if requested in ("ddp", "fsdp"):
                raise UserError(f"parallel.{name}={requested} runs under a multi-process launch: plan one rank of it "
                                f"with --world-size N (its processes, 2 or more)")
            continue
        mode = "ddp" if requested == "auto" else requested
        if mode in ("none", "dp"):
            raise UserError(f"parallel.{name}={mode} with --world-size {world_size}: every process would train its "
                            f"own copy of the {name}; use ddp or fsdp (or auto: ddp)")
        stages = device_map.stages_of(name)
        if mode == "fsdp" and len(stages) > 1:
            split = "/".join(",".join(str(d) for d in stage) for stage in stages)
            raise UserError(f"--world-size {world_size} with parallel.{name}=fsdp: the device map {cfg.device_map!r} "
                            f"splits the {name} over {split}; FSDP shards it over the processes, one device each: "
                            f"give the {name} one device, or use parallel.{name}=ddp with the split")
        if mode == "fsdp":
            from segadv.parallel.fsdp import require_fsdp

            require_fsdp(name)
        modes[name] = mode
        parallel = parallel.model_copy(update={name: "none"})
    for name in names:
        starts_as = role_spec(name).starts_as
        if name not in modes and world_size > 1:
            modes[name] = "fsdp" if starts_as is not None and modes.get(starts_as) == "fsdp" else "none"
    if world_size > 1:
        from segadv.training.checks import check_fsdp_param_dtype

        for name in names:  # amp.<role>.fsdp_param_dtype: amp under FSDP only, as segadv-train refuses it
            check_fsdp_param_dtype(cfg, name, modes[name])
    if world_size > 1:
        if cfg.parallel.sync_bn:
            # SyncBatchNorm holds what BatchNorm holds (its statistics' all-reduce is of a few floats)
            parallel = parallel.model_copy(update={"sync_bn": False})
        notes.append(f"one rank of {world_size} processes (--world-size {world_size}), data.batch_size "
                     f"{cfg.data.batch_size} a process: " + ", ".join(f"{n} {m}" for n, m in modes.items())
                     + "; the iteration planned unwrapped, each wrapper's state and what it holds in flight "
                       "accounted over the networks' own parameters and units (segadv/plan/sharding.py)")
    # The dry run runs every network unwrapped: FSDP's gather dtype is accounted (network_states), not run.
    amp = cfg.amp.model_copy(update={name: entry.model_copy(update={"fsdp_param_dtype": "float32"})
                                     for name in names if (entry := getattr(cfg.amp, name, None)) is not None})
    return cfg.model_copy(update={"parallel": parallel, "amp": amp}), modes, notes


def gathers_in_amp(cfg: Config) -> dict[str, str]:
    """Each role whose ``amp.<role>.fsdp_param_dtype`` (its own or its fallback's) asks FSDP to
    gather its parameters in its autocast dtype, with the key that asks it; read before
    ``rank_config`` clears the key."""
    from segadv.training.checks import amp_key

    return {name: amp_key(cfg, name, "fsdp_param_dtype") for name in run_role_names(cfg)
            if network_settings(cfg, name).amp.fsdp_param_dtype == "amp"}


def gather_itemsize(cfg: Config, role: str, key: str | None, mode: str) -> int | None:
    """The element size FSDP gathers ``role``'s parameters in: its autocast dtype's where ``key``
    (``gathers_in_amp``) asks it and autocast is on once ``auto`` is resolved (``cfg``: after
    ``auto_precision``), else None (the parameters' own). Under FSDP an ``auto`` resolved off is
    refused, as segadv-train refuses it."""
    if key is None:
        return None
    amp = network_settings(cfg, role).amp
    if amp.enabled is not True:
        if mode == "fsdp":
            raise UserError(f"{key}=amp gathers the {role}'s parameters in its autocast dtype, but its "
                            "enabled: auto resolved to off on this device (no bf16 compute): set enabled: true, "
                            f"or {key}=float32")
        return None
    return torch.empty((), dtype=getattr(torch, amp.dtype)).element_size()


def network_states(parts: Training, cfg: Config, modes: dict[str, str],
                   shown_as: dict[torch.device, str], gathers: dict[str, str] | None = None) -> list[NetworkState]:
    """Each network's parameters (shape, dtype, whether trained, FSDP unit), buffers and optimizer
    state as planned, one record per device it has parameters on. ``gathers``: the roles FSDP
    gathers in their autocast dtype (``gathers_in_amp``)."""
    out = []
    for net in parts.every_network():
        bare, mode = net.bare, modes.get(net.role, "none")
        key = (gathers or {}).get(net.role)
        itemsize = gather_itemsize(cfg, net.role, key, mode)
        if itemsize is not None and mode == "fsdp":
            check_gathers_in_amp(bare, key, net.role)
        units = shard_units(bare)  # FSDP's units, whichever wrapper this plan gives it (advise re-accounts)
        state = net.opt.optimizer.state if net.opt is not None else {}
        by_device: dict[torch.device, list[Param]] = {}
        for name, p in bare.named_parameters():
            unit = next((i for i, u in enumerate(units) if name.startswith(u + ".")), None)
            tensors = [Tensor.of(t) for t in state.get(p, {}).values() if isinstance(t, torch.Tensor)]
            by_device.setdefault(p.device, []).append(Param(Tensor.of(p), p.requires_grad, unit, tensors))
        buffers: dict[torch.device, int] = {}
        for b in bare.buffers():
            buffers[b.device] = buffers.get(b.device, 0) + b.numel() * b.element_size()
        for device, params in by_device.items():
            out.append(NetworkState(net.role, mode, shown_as.get(device, str(device)), params, buffers.get(device, 0),
                                    units, itemsize, net.trained))
    return out


def auto_precision(cfg: Config, device_map: DeviceMap) -> tuple[Config, list[str]]:
    """``amp.<role>.enabled: auto`` as segadv-train would resolve it on the map's own devices,
    written into the config the stand-ins run (they are no device ``resolve_auto`` knows). A CUDA
    device cannot be asked here (it need not be visible): it is planned as one with bf16 tensor
    cores (Ampere or newer), and the note says so; a CPU is this machine's CPU."""
    amp, notes = cfg.amp, []
    for role in run_role_names(cfg):
        own = network_settings(cfg, role).amp
        if not own.is_auto:
            continue
        devices = device_map.devices_of(role)
        cuda = [str(d) for d in devices if d.type == "cuda"]
        if cuda and len(cuda) == len(devices):
            resolved = own.model_copy(update={"enabled": True, "dtype": "bfloat16"})
            why = (f"{', '.join(cuda)} planned as a GPU with bf16 tensor cores (compute capability 8.0+, Ampere or "
                   "newer); on an older card auto runs float32")
        else:
            resolved, why = resolve_auto(own, devices)
        amp = amp.model_copy(update={role: resolved})
        notes.append(f"amp.{role}: auto -> {'bf16' if resolved.enabled else 'off'} ({why})")
    return cfg.model_copy(update={"amp": amp}), notes


def standin_map(device_map: DeviceMap, device_type: str) -> DeviceMap:
    return device_map.with_devices(lambda device: standin.standin_for(device, device_type))


class PlaceEmpty(TorchFunctionMode):
    """``Tensor.to(device)`` of a ``meta`` tensor gives an empty (fake) tensor on ``device``:
    the networks, built on meta, are placed by segadv's own ``place_networks``."""

    def __init__(self, modes: list[Any]) -> None:
        super().__init__()
        self.modes = modes

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.to and args[0].is_meta:
            device, dtype, memory_format = torch_surfaces.parse_to(*args[1:], **kwargs)
            if device is not None and device.type != "meta":
                tensor = args[0]
                with contextlib.ExitStack() as stack:
                    for mode in self.modes:
                        stack.enter_context(mode)
                    if memory_format is None or memory_format == torch.preserve_format:
                        # as the tensor is laid out (a split network converted to channels_last before its move)
                        return torch.empty_strided(tensor.shape, tensor.stride(), dtype=dtype or tensor.dtype,
                                                   device=device)
                    return torch.empty(tensor.shape, dtype=dtype or tensor.dtype, device=device,
                                       memory_format=memory_format)
        return func(*args, **kwargs)


class DryRunScaler(torch.amp.GradScaler):
    """GradScaler whose inf check steps as if every gradient were finite, and whose saved scale is
    the configured one: fake tensors have no values to read (the unscale and the check's tensors
    are still made, so counted)."""

    def _maybe_opt_step(self, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any],
                        *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)

    def get_scale(self) -> float:
        return self._init_scale if self._enabled else 1.0

    def _get_growth_tracker(self) -> int:
        return 0


def as_on_cuda(opt: Any, real: DeviceMap) -> None:
    """What the stand-in cannot decide as CUDA would: torch picks its multi-tensor (foreach)
    optimizer kernels for plain tensors on CUDA only, never for fake ones, so a CUDA network's
    optimizer left to torch's choice (optim.*.implementation: auto) gets foreach here; and the
    scaler steps without reading its inf check."""
    opt.scaler.__class__ = DryRunScaler
    if opt.device.type == "cpu":
        return
    for group in opt.optimizer.param_groups:
        if group.get("foreach") is None and not group.get("fused"):
            group["foreach"] = True


def networks(parts: Training) -> list[tuple[torch.nn.Module, Any]]:
    """(bare network, its AmpOptimizer) of every network trained."""
    return [(net.bare, net.opt) for net in parts.networks()]


@contextlib.contextmanager
def accounting(parts: Training, tracker: DryRunMode) -> Iterator[None]:
    """File parameters, gradients (as they are accumulated) and optimizer state (after each
    step) under their categories while the iterations run."""
    handles = []
    for net in parts.every_network():  # the untrained ones' (the teacher's) weights too
        tracker.mark([*net.bare.parameters(), *net.bare.buffers()], "params", net.role)
    for net in parts.networks():
        for p in net.bare.parameters():
            if p.requires_grad:
                handles.append(p.register_post_accumulate_grad_hook(
                    lambda p, role=net.role: tracker.mark([p.grad], "grads", role)))
    owners = {id(net.opt.optimizer): net.role for net in parts.networks()}

    def state_filed(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        tracker.mark([t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)],
                     "optimizer", owners.get(id(optimizer)))

    handles.append(register_optimizer_step_post_hook(state_filed))
    for net in parts.networks():
        if net.role == "generator":
            spans = {p.device for p in net.bare.parameters()}
            handles.append(net.bare.register_forward_pre_hook(
                lambda module, args, spans=spans: tracker.count_gradient_images(args[0], spans)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def dry_run_settings() -> Iterator[None]:
    """The autograd engine's device threads check the real device count: run backward on the
    calling thread (where the modes are). Module.to on fake tensors overwrites parameters."""
    threads = torch.autograd.set_multithreading_enabled
    try:
        threads(False)
        yield
    finally:
        threads(True)


def planned_steps(cfg: Config, schedule_steps: tuple[int, ...], steps: int) -> list[int]:
    """The steps whose iterations the plan runs, in order: the first, each step where the
    method's schedule switches a term on, then the run's last ``steps`` (every term on, the
    optimizers' state made by the first of them held by the next)."""
    first_of_last = max(cfg.train.max_steps - steps, 0)
    regimes = sorted({0, *schedule_steps} - set(range(first_of_last, cfg.train.max_steps)))
    return [s for s in regimes if s < first_of_last] + list(range(first_of_last, first_of_last + steps))


def iterate(parts: Training, cfg: Config, steps: int, tracker: DryRunMode, streams: Mapping[str, Any]) -> list[int]:
    """The method's iterations at ``planned_steps`` on ``streams`` (anything with ``next()``):
    every branch its schedule takes; the tracker's transfers are the last one's. Returns the
    steps run."""
    run = planned_steps(cfg, parts.method.schedule.switch_steps(), steps)
    with accounting(parts, tracker):
        try:
            for step in run:
                with tracker.iteration(step):
                    parts.step(streams, step)
        except ValueError as err:  # a shape or batch the networks refuse: training would stop there too
            where = segadv_line(traceback.extract_tb(err.__traceback__))
            raise IterationFails(f"the {cfg.method.name} iteration fails as segadv-train's would: {err}\n  at {where}") \
                from None
        except DataDependentOutputException as err:  # a value read on the host: fake tensors have none
            where = segadv_line(traceback.extract_tb(err.__traceback__))
            raise PlacementError(f"host read: {err.func} reads a device value on the host inside the {cfg.method.name} "
                                 f"iteration (a synchronisation on the hot path every step)\n  at {where}") from None
    return run


def standin_inputs(cfg: Config, parts: Training) -> tuple[dict[str, Any], torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """Each stream's batch of the configured shape, the method's panel images and the diagnostic
    samples, on the host."""
    shapes = stream_shapes(cfg, type(parts.method).data_streams(cfg))
    batches = {name: make_batch(shape, cfg.data.num_classes) for name, shape in shapes.items()}
    return batches, panel_images(cfg, parts, shapes), diagnostic_samples(cfg, parts, shapes)


def panel_images(cfg: Config, parts: Training, shapes: dict[str, BatchShape]) -> torch.Tensor | None:
    """The method's panel images as the loop holds them for the whole run (``log.num_images`` of
    its panel stream's), or None."""
    stream = parts.method.panel_stream
    if stream is None or not cfg.log.num_images:
        return None
    shape = shapes[stream]
    return make_batch(BatchShape(cfg.log.num_images, shape.height, shape.width, labeled=False), cfg.data.num_classes)


def diagnostic_samples(cfg: Config, parts: Training, shapes: dict[str, BatchShape]) -> tuple[torch.Tensor, ...]:
    """The images and masks the loop holds for ``diag/d_confidence_auroc`` (``log.diagnostic_images``
    of the panel stream's pool, where its masks exist), or none. Their evaluation runs the panel's
    own maps in chunks of the panel's size: the evaluation pass's panel covers its peak."""
    stream = parts.method.panel_stream
    if stream is None or not cfg.log.num_images or not cfg.log.diagnostic_images or not pool_has_masks(cfg.data):
        return ()
    shape = shapes[stream]
    return make_batch(BatchShape(cfg.log.diagnostic_images, shape.height, shape.width, labeled=True),
                      cfg.data.num_classes)


def count_inputs(tracker: DryRunMode, batches: dict[str, Any], panel: torch.Tensor | None,
                 held: tuple[torch.Tensor, ...] = ()) -> None:
    """The loop's inputs where they are: each stream's batch as its loader hands it out (on the
    host), the panel images and the diagnostic samples (``held``), counted from the start (their
    copies onto the devices are the iterations' own ops)."""
    tensors = [t for batch in batches.values() for t in (batch if isinstance(batch, tuple) else (batch,))]
    tracker.mark(tensors + ([] if panel is None else [panel]) + list(held), "other")


def evaluation_pass(parts: Training, cfg: Config, tracker: DryRunMode, panel: torch.Tensor | None,
                    as_input: Callable[[Any], Any]) -> None:
    """What an evaluation adds, through segadv's own code: ``evaluate`` on two val batches of
    ``data.val_batch_size`` (with the panel's samples copied to the host), and the method's panel
    on ``log.num_images`` of its stream's images; placement enforced, memory filed as the
    evaluation's. The metrics are never read (fake tensors have no values)."""
    val_data = cfg.target_data or cfg.data
    (h, w), label_size = val_size(val_data)  # they differ under data.val_input_size
    batch_size = cfg.data.val_batch_size
    if val_data.kind == "synthetic":  # a val set smaller than a batch is one smaller batch
        batch_size = min(batch_size, val_data.synthetic.val_size)
    shape = BatchShape(batch_size, h, w, labeled=True, label_size=label_size)

    def val_loader() -> Iterator[Any]:
        """Two batches, one at a time as a loader hands them out (the host's batch counted):
        what the first leaves behind meets the second."""
        for seed in (0, 1):
            with tracker.on_host():  # the loader's own making of the batch
                batch = as_input(make_batch(shape, cfg.data.num_classes, seed=seed))
                tracker.mark(list(batch), "other")
            yield batch

    with tracker.phase("evaluation"):  # what stays live from training counts towards it
        try:
            evaluate_generator(cfg, parts, val_loader(), val_data, num_samples=cfg.log.num_images,
                               proxies=type(parts.method).reads_unlabeled(cfg))
            evaluate_teacher(cfg, parts, val_loader(), val_data)  # a mean teacher's val/mIoU_teacher, on its device
            if panel is not None:
                parts.method.panel(panel)
        except ValueError as err:
            where = segadv_line(traceback.extract_tb(err.__traceback__))
            raise IterationFails(f"the evaluation fails as segadv-train's would: {err}\n  at {where}") from None


def checkpoint_pass(parts: Training, tracker: DryRunMode) -> None:
    """A save and a resume's load through segadv's own checkpoint states (``run.run_state``:
    each network's weights, its optimizer with GradScaler and LR schedule, the RNGs; the stream
    positions are host integers). The save copies every state tensor to the host, as
    ``torch.save`` does; the resume loads those host copies (what ``read_checkpoint``'s
    ``map_location="cpu"`` gives) onto the map's devices through each state's
    ``load_state_dict``, into optimizers that hold no state yet, as in a fresh process. Placement
    enforced; the most live per device is filed as the checkpoint's. Not run: the non-finite check
    (a host read per device), the file's serialisation and the RNGs' restore (it needs the
    generators' values; their capture runs)."""
    from torch.utils._pytree import tree_map_only

    states = run_state(parts, streams=None)
    with tracker.phase("checkpoint"):
        saved = {key: state.state_dict() for key, state in states.items()}
        on_host = tree_map_only(torch.Tensor, lambda t: t.to("cpu", copy=True), saved)
        del saved
        for _, opt in networks(parts):
            opt.optimizer.state.clear()  # a resumed process has built its optimizers, stepped none
        for key, state in states.items():
            # restoring generators (the RNGs, the mean teacher's mixing RNG) needs their values, which fake tensors lack
            if key != "rng" and not getattr(state, "restores_generator", False):
                state.load_state_dict(on_host[key])
                for net in parts.networks():  # the state a load made is the network's (FSDP shards it)
                    tracker.mark([t for s in net.opt.optimizer.state.values() for t in s.values()
                                  if isinstance(t, torch.Tensor)], "optimizer", net.role)


def transfer_totals(tracker: DryRunMode) -> tuple[int, int]:
    between = sum(n for (src, dst), n in tracker.transfers.items() if src.type != "cpu" and dst.type != "cpu")
    host = sum(n for (src, dst), n in tracker.transfers.items() if src.type == "cpu")
    return between, host


def device_rows(tracker: DryRunMode, planned: DeviceMap, real: DeviceMap, parts: Training,
                batch: int) -> dict[str, DevicePlan]:
    """One row per device a trained network is placed on (each stage's of a split one): a device
    the map names for a role the method does not train (MinEnt's d) holds nothing, and is left out."""
    used = {device for role in parts.roles for stage in parts.device_map.stages_of(role.name) for device in stage}
    rows = {}
    for device, shown in zip(planned.devices, real.devices):
        if device not in used:
            continue
        memory = tracker.memory[device]
        most = memory.training_largest
        peak, peak_step = memory.training_peak()
        rows[str(shown)] = DevicePlan(str(shown), most("params"), most("grads"), most("optimizer"), most("other"),
                                      peak, peak_step, memory.peaks["evaluation"], memory.peaks["checkpoint"],
                                      flops_per_iteration=tracker.flops[device],
                                      gradient_images_per_iteration=tracker.gradient_images[device],
                                      gradient_batches_per_iteration=tracker.gradient_images[device] / batch)
    return rows


def dry_run(cfg: Config, steps: int = 2, world_size: int = 1) -> Plan:
    """Plan ``cfg`` (its ``device_map``) by ``steps`` iterations on stand-in devices: one rank of a
    ``world_size``-process launch (each network under the wrapper the launch gives it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    compiled = compile_note(cfg)
    cfg = plan_config(cfg)
    real = map_devices(cfg.device_map)
    gathers = gathers_in_amp(cfg)
    cfg, modes, notes = rank_config(cfg, real, world_size)
    device_type = standin.register()
    planned = standin_map(real, device_type)
    cfg, single = without_one_device_dp(cfg, real)
    notes.extend(single)
    notes.extend(compiled)
    cfg, precision = auto_precision(cfg, real)
    notes.extend(precision)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = DryRunMode(planned.devices)
    # The device activate() makes current on a GPU: the map's first CUDA device.
    current = next((d.index for d in real.devices if d.type == "cuda"), 0)
    as_cuda = standin.CudaAsStandIn(device_type, current)
    with dry_run_settings():
        with torch.device("meta"), PlaceEmpty([fake, tracker]):
            try:
                parts = build_training(cfg, planned)
            except Misplaced as err:  # a network's split put a block where the map says nothing
                raise PlacementError(f"placement: {err} (after its placement by the device map)") from None
        for _, opt in networks(parts):
            as_on_cuda(opt, real)
        batches, panel, held = standin_inputs(cfg, parts)
        attention = CudaAttention(device_type)  # SDPA as CUDA's fused kernels run it (segadv/plan/attention.py)
        watched = [(net.role, net.bare) for net in parts.every_network()]
        with fake, tracker, as_cuda, attention, attention.watching(watched):
            batches = {name: _fake(fake, batch) for name, batch in batches.items()}
            panel = None if panel is None else _fake(fake, panel)
            held = tuple(_fake(fake, t) for t in held)  # live for the whole plan, as the loop holds them
            count_inputs(tracker, batches, panel, held)
            run = iterate(parts, cfg, steps, tracker, {name: FixedStream(b) for name, b in batches.items()})
            between, host = transfer_totals(tracker)
            evaluation_pass(parts, cfg, tracker, panel, lambda batch: _fake(fake, batch))
            checkpoint_pass(parts, tracker)
    notes.extend(note for note in [attention.note()] if note)
    shown_as = {device: str(real_device) for device, real_device in zip(planned.devices, real.devices)}
    rows = device_rows(tracker, planned, real, parts, cfg.data.batch_size)
    plan = Plan(rows, between, host, steps, time.perf_counter() - start, notes, run, unwrapped=rows,
                network_states=network_states(parts, cfg, modes, shown_as, gathers),
                memory={shown_as[device]: tracker.memory[device] for device in planned.devices})
    return rank_plan(plan, world_size)


def _fake(mode: Any, batch: Any) -> Any:
    if isinstance(batch, tuple):
        return tuple(mode.from_tensor(t) for t in batch)
    return mode.from_tensor(batch)


def measure(cfg: Config, plan: Plan, steps: int = 2) -> None:
    """Run the same iterations for real on the map's own devices and put, beside each device's
    plan, the real tensors' peak (counted as the dry run counts) and the allocator's own peak:
    ``torch.cuda.max_memory_allocated`` on CUDA, torch.profiler's memory events on the CPU.

    A map with a CUDA device is measured in a fresh process: the stand-in backend that the dry run
    registered (a PrivateUse1 accelerator) cannot be unregistered, and with it in the process the
    autograd engine finds no stream for CUDA's backward nodes (an internal assert, seen on an H100
    with torch 2.11)."""
    torch_surfaces.require(*torch_surfaces.MEASURE)
    cfg = plan_config(cfg)
    real = map_devices(cfg.device_map)
    missing = [d for d in real.devices if d.type == "cuda" and d.index >= torch.cuda.device_count()]
    if missing:
        raise UserError(f"--measure runs the iterations for real: {', '.join(map(str, missing))} is not here "
                        "(plan with --device-map cpu on a machine without those GPUs)")
    if any(d.type == "cuda" for d in real.devices):
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(1) as pool:
            peaks, source = pool.apply(_measured_peaks, (cfg, steps))
    else:
        peaks, source = _measured_peaks(cfg, steps)
    plan.notes.append(f"measured on {source}")
    for device, (tensor_peak, allocator_peak) in peaks.items():
        row = plan.devices.get(device)
        if row is None:  # a device no trained network is on
            continue
        row.measured_peak_bytes, row.allocator_peak_bytes = tensor_peak, allocator_peak


def _measured_peaks(cfg: Config, steps: int) -> tuple[dict[str, tuple[int, int]], str]:
    """{device: (the real tensors' peak, the allocator's peak)} over the plan's iterations run for
    real on the loader's own batches (the stand-in batches where the data cannot be read here),
    and which batches they were."""
    torch_surfaces.quiet_kineto()
    from torch.profiler import ProfilerActivity, profile

    real = map_devices(cfg.device_map)
    tracker = DryRunMode(real.devices)
    torch.manual_seed(cfg.train.seed)
    with tempfile.TemporaryDirectory() as run_dir:
        with tracker:
            parts = build_training(cfg, real)
            try:
                data = build_data(cfg, parts, Path(run_dir))
                streams, panel, source = data.streams, data.panel_images, "the loader's own batches"
            except UserError as err:
                batches, panel, held = standin_inputs(cfg, parts)  # held for the whole run, as the loop holds them
                streams = {name: FixedStream(b) for name, b in batches.items()}
                count_inputs(tracker, batches, panel, held)
                source = f"stand-in batches (the data cannot be read here: {str(err).splitlines()[0]})"
        # The iterations' peaks (the tracker's "iterations" phase): from what the build left live
        # (its own transients, e.g. a whole encoder before its unused stages are dropped, are not theirs).
        held = {device: sum(tracker.memory[device].live.values()) for device in real.devices}
        for device in real.devices:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)  # max_memory_allocated counts on from what is held
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with tracker:
                iterate(parts, cfg, steps, tracker, streams)
    peaks = {str(device): (tracker.memory[device].peaks["iterations"],
                           torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                           else held[device] + profiler_peak(prof))
             for device in real.devices}
    return peaks, source


def profiler_peak(prof: Any) -> int:
    """The CPU allocator's peak over the profiled span: its allocation events summed in order."""
    events = sorted(torch_surfaces.cpu_memory_events(prof))
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak
