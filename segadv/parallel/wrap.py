"""Wrapping each network on its own in DataParallel or DistributedDataParallel, or sharding it
with FSDP2 (``fully_shard``, segadv/parallel/fsdp.py).

mmengine's separate-DDP idea for GANs: G and D each get their own wrapper, so D's update never
syncs G's gradients and vice versa, and G's adversarial forward can go through D's bare module
(under FSDP the bare module is the sharded one: its forward gathers D's weights, and with D
frozen its backward reduces nothing).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from segadv.config.schema import CompileConfig, NetworkAmpConfig
from segadv.errors import UserError
from segadv.parallel.activation_checkpoint import apply_activation_checkpointing
from segadv.parallel.compile import compile_network
from segadv.parallel.distributed import DistEnv
from segadv.parallel.fsdp import check_gathers_in_amp, mixed_precision, require_fsdp, shard
from segadv.parallel.pipeline import is_split

log = logging.getLogger(__name__)
_DDP_PARAMS = inspect.signature(DistributedDataParallel.__init__).parameters


class AutocastForward(nn.Module):
    """Runs a network's forward under autocast inside the forward itself.

    Autocast state is thread-local and DataParallel runs each replica in its own thread, so an
    autocast block around the call does not reach the replicas (they would run in float32 with
    AMP on); this one travels with every replica. Its ``module.`` prefix is removed by ``unwrap`` like any wrapper's.
    """

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module
        self.device_type = device_type
        self.dtype = dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(*args, **kwargs)


def resolve_mode(requested: str, role: str, devices: tuple[torch.device, ...], env: DistEnv) -> str:
    """The wrapper a network gets, validated against the device map and the launch."""
    mode = requested
    if mode == "auto":
        mode = "ddp" if env.distributed else ("dp" if len(devices) > 1 else "none")
    key = f"parallel.{role}"
    if mode == "fsdp":
        check_fsdp(key, role, devices, env)
        return mode
    if env.distributed and mode != "ddp":
        raise UserError(f"{key}={mode}: this is a {env.world_size}-process launch, so every process would "
                        f"train its own copy of the {role}; use ddp, fsdp (or auto)")
    if mode == "ddp" and not env.distributed:
        raise UserError(f"{key}=ddp needs a multi-process launch: torchrun --nproc-per-node N -m segadv.cli.train ... "
                        "or segadv-train --nproc-per-node N ...")
    if mode == "ddp" and len(devices) > 1:
        raise UserError(f"{key}=ddp takes one device per process, but the device map gives the {role} "
                        f"{len(devices)}; launch more processes instead of a replica set")
    if mode == "none" and len(devices) > 1:
        raise UserError(f"the device map gives the {role} a replica set of {len(devices)} devices: "
                        f"set {key}=dp (or auto)")
    if mode == "dp" and devices[0].type != "cuda" and torch.cuda.is_available():
        raise UserError(f"{key}=dp replicates over CUDA devices, but the {role} is on {devices[0]}")
    return mode


def check_fsdp(key: str, role: str, devices: tuple[torch.device, ...], env: DistEnv) -> None:
    """``parallel.<role>=fsdp`` against this torch, the launch and the device map: each process
    holds 1/N of the network on one device, so it needs N processes and one device each."""
    require_fsdp(role)
    if not env.distributed:
        raise UserError(f"{key}=fsdp shards the {role} over the processes of a multi-process launch: torchrun "
                        "--nproc-per-node N -m segadv.cli.train ... or segadv-train --nproc-per-node N ...")
    if len(devices) > 1:
        raise UserError(f"{key}=fsdp takes one device per process, but the device map gives the {role} "
                        f"{len(devices)} ({'+'.join(map(str, devices))}: a DataParallel replica set); launch more "
                        "processes instead")


def parallelize_network(
    module: nn.Module,
    mode: str,
    devices: tuple[torch.device, ...],
    amp: NetworkAmpConfig,
    *,
    broadcast_buffers: bool,
    activation_checkpointing: bool = False,
    compile_config: CompileConfig | None = None,
    role: str = "network",
) -> nn.Module:
    """One placed network made ready to train, in the order the wrappers need (as torchtitan's
    ``parallelize_*``): activation checkpointing of its blocks, then ``torch.compile`` of its
    forward (in place: ``compile_config``, None for eager), then its wrapper (none, DataParallel or DDP)
    or FSDP's sharding (in place: fully_shard wraps nothing). Returns the module as trained."""
    if mode == "fsdp" and is_split(module):
        raise UserError(f"parallel.{role}=fsdp: the device map splits the {role} into pipeline stages, and FSDP "
                        f"shards a network held on one device per process; drop the split (each rank then holds "
                        f"1/N of the {role}) or set parallel.{role}=ddp")
    if mode == "dp" and is_split(module):
        raise UserError(f"parallel.{role}=dp: the device map splits the {role} into pipeline stages, and "
                        "DataParallel cannot replicate a split network; set parallel."
                        f"{role}=none (or auto), or launch processes (torchrun) that each hold a split {role}")
    if mode == "fsdp" and mixed_precision(amp) is not None:
        check_gathers_in_amp(module, f"amp.{role}.fsdp_param_dtype", role)
    if activation_checkpointing:
        units = apply_activation_checkpointing(module)
        log.info("activation checkpointing: %s", ", ".join(units))
    if compile_config is not None:
        compile_network(module, compile_config, role)
    return wrap_network(module, mode, devices, amp, broadcast_buffers=broadcast_buffers)


def wrap_network(
    module: nn.Module,
    mode: str,
    devices: tuple[torch.device, ...],
    amp: NetworkAmpConfig,
    *,
    broadcast_buffers: bool,
) -> nn.Module:
    if mode == "none":
        return module
    if mode == "fsdp":
        shard(module, devices[0], broadcast_buffers=broadcast_buffers, amp=amp)
        return module
    if mode == "dp":
        inner = AutocastForward(module, devices[0].type, getattr(torch, amp.dtype)) if amp.enabled else module
        if devices[0].type != "cuda":
            log.warning("DataParallel on %s runs the network as it is (it replicates over CUDA devices only)", devices[0])
            return HostDataParallel(inner)
        ids = [d.index for d in devices]
        return nn.DataParallel(inner, device_ids=ids, output_device=ids[0])
    # A network split over stages spans devices: DDP takes it with device_ids=None (each process
    # holds its own split network; the gradient buckets are reduced on each stage's device).
    device_ids = [devices[0].index] if devices[0].type == "cuda" and not is_split(module) else None
    # Newer torch renames broadcast_buffers to forward_sync_buffers (same meaning in forward).
    sync_key = "forward_sync_buffers" if "forward_sync_buffers" in _DDP_PARAMS else "broadcast_buffers"
    # find_unused_parameters=False: every parameter of each network takes part in its own loss.
    return DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=False,
                                   **{sync_key: broadcast_buffers})


class HostDataParallel(nn.DataParallel):
    """``parallel.*=dp`` for a network on the host: DataParallel's own fall-through (no replicas,
    the module called as it is), whatever accelerator the process has. ``nn.DataParallel`` falls
    through only when there is none: with another one (an XPU, segadv-plan's stand-in) it would
    move the network there, onto a device the map never named."""

    def __init__(self, module: nn.Module) -> None:
        nn.Module.__init__(self)
        self.module = module
        self.device_ids: list[int] = []


def check_batch_for_replicas(batch_size: int, replicas: int, role: str) -> None:
    if replicas <= 1:
        return
    if batch_size < replicas:
        raise UserError(f"data.batch_size={batch_size} is smaller than the {replicas} replicas of the {role}: "
                        "some devices would get no samples")
    if batch_size % replicas:
        log.warning("data.batch_size=%d does not divide over the %d replicas of the %s: uneven chunks",
                    batch_size, replicas, role)
