"""FSDP2 per network (``parallel.<role>: fsdp``): ``torch.distributed.fsdp.fully_shard``.

Each rank keeps 1/N of a network's parameters, gradients and optimizer state; a unit's parameters
are all-gathered for its forward and again for its backward, and its gradients reduce-scattered.
The units are the network's own blocks where it names them (a Generator's ``checkpoint_units()``:
a ViT's blocks and head, a DeepLab's encoder stages and decoder), then the root, which takes what
is left (embeddings, norms, a D's convolutions): torchtitan's per-block sharding.

fully_shard changes the module in place (its class becomes an ``FSDPModule`` subclass, its
parameters DTensors sharded on dim 0), keeping every parameter name: state dicts, optimizer groups
and the strict loader see the module tree of a plain run. The gathered full state is what a
checkpoint holds (:func:`full_state`), so a checkpoint written under FSDP has DDP's keys and plain
tensors.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from segadv.errors import UserError

log = logging.getLogger(__name__)

FSDP_TORCH = (2, 6)  # fully_shard public as torch.distributed.fsdp.fully_shard


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def fsdp_available() -> bool:
    """Whether this torch has FSDP2 at its public name."""
    return torch_version() >= FSDP_TORCH


def require_fsdp(role: str) -> None:
    """``parallel.<role>=fsdp`` on a torch that has it, else a user error naming the floor."""
    if not fsdp_available():
        raise UserError(f"parallel.{role}=fsdp needs torch >= {FSDP_TORCH[0]}.{FSDP_TORCH[1]} (FSDP2's "
                        f"torch.distributed.fsdp.fully_shard); this is torch {torch.__version__}: "
                        "upgrade torch, or use parallel.{role}=ddp".replace("{role}", role))


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module`` (bare: fully_shard wraps nothing) was sharded by FSDP2."""
    if not fsdp_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def shard_units(module: nn.Module) -> list[str]:
    """The submodules sharded as their own units (each one all-gather in flight): a Generator's
    ``checkpoint_units()``, none for a network that names no blocks (a D: the root alone)."""
    from segadv.models.base import Generator

    if not isinstance(module, Generator):
        return []
    try:
        return list(module.checkpoint_units())
    except UserError:
        return []


def shard_network(module: nn.Module, mesh: Any, mp_policy: Any = None,
                  units: Sequence[str] | None = None, reshard_after_forward: bool = True) -> list[str]:
    """Shard ``module`` in place over ``mesh`` (a 1-D DeviceMesh): each of ``units`` (default
    :func:`shard_units`) its own FSDP unit, then the root. Returns the unit names.

    ``mp_policy``: a ``MixedPrecisionPolicy`` (None: parameters gathered and gradients reduced
    in their own dtype, float32). ``reshard_after_forward``: free a unit's gathered parameters
    after its forward and gather them again for the backward (ZeRO-3); False keeps them (ZeRO-2,
    one gather a step, more memory)."""
    from torch.distributed.fsdp import fully_shard

    names = shard_units(module) if units is None else list(units)
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    for name in names:
        fully_shard(module.get_submodule(name), **kwargs)
    fully_shard(module, **kwargs)
    return names


def full_tensor(value: Any) -> Any:
    """A DTensor gathered to a plain CPU tensor (a collective: every rank calls it, in the same
    order); anything else as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor().detach().cpu()
    return value


def full_state(state: Any) -> Any:
    """A (nested) state dict with every DTensor gathered to a plain CPU tensor: a module's state
    dict keeps its keys, an optimizer's its integer parameter ids, as a single-process run writes
    them. Every rank calls it (the gathers are collectives) and gets the full state."""
    if isinstance(state, Mapping):
        return type(state)((key, full_state(value)) for key, value in state.items()) \
            if not isinstance(state, dict) else {key: full_state(value) for key, value in state.items()}
    if isinstance(state, list):
        return [full_state(value) for value in state]
    if isinstance(state, tuple):
        return tuple(full_state(value) for value in state)
    return full_tensor(state)


def like_current(saved: Any, current: Any) -> Any:
    """``saved`` (a full, plain state) laid out as ``current`` (this rank's state, with DTensors):
    each plain tensor where ``current`` holds a DTensor becomes a DTensor with its mesh and
    placements, this rank's shard of it; everything else as saved. What loading a full state into
    a sharded network or its optimizer takes."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(current, DTensor) and isinstance(saved, torch.Tensor) and not isinstance(saved, DTensor):
        if tuple(saved.shape) != tuple(current.shape):
            return saved  # the strict loader names the mismatch
        local = saved.to(device=current.to_local().device, dtype=current.dtype)
        return distribute_tensor(local, current.device_mesh, current.placements, src_data_rank=None) \
            if _takes_src_data_rank() else distribute_tensor(local, current.device_mesh, current.placements)
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        return {key: like_current(value, current[key]) if key in current else value for key, value in saved.items()}
    if isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple)) and len(saved) == len(current):
        return type(saved)(like_current(a, b) for a, b in zip(saved, current))
    return saved


def _takes_src_data_rank() -> bool:
    import inspect

    from torch.distributed.tensor import distribute_tensor

    return "src_data_rank" in inspect.signature(distribute_tensor).parameters
