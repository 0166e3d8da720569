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
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

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


# ---------------------------------------------------------------------------- wrapping a network

def device_mesh(device: torch.device) -> Any:
    """The 1-D mesh of every rank of the process group (already joined: segadv/parallel/
    distributed.py), on ``device``'s type: one shard per rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (dist.get_world_size(),))


def broadcast_state(module: nn.Module, src: int = 0) -> None:
    """Every rank's parameters and buffers made ``src``'s, before sharding. Each rank builds its
    network from its own seed (segadv/training/loop.py seeds ``train.seed + rank``); DDP
    broadcasts rank 0's initial state in its constructor, fully_shard keeps each rank's own slice
    of its own tensors. Without this a rank's shard would be cut from another initialisation
    than its neighbour's, and the run would not be DDP's or a single process's."""
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src)


def broadcast_buffers_in_forward(module: nn.Module) -> None:
    """Rank 0's floating buffers (BatchNorm's running statistics) given to every rank at the start
    of each training forward, as DDP's ``broadcast_buffers`` does: FSDP shards parameters only,
    so without it each rank's statistics would follow its own batches and the ranks would
    evaluate (and rank 0 save) different models."""
    import torch.distributed as dist

    buffers = [b for b in module.buffers() if b.is_floating_point()]
    if not buffers:
        return

    def hook(mod: nn.Module, args: Any) -> None:
        if mod.training:  # as DDP: every forward in train mode
            for buffer in buffers:
                dist.broadcast(buffer, 0)

    module.register_forward_pre_hook(hook)


def mixed_precision(amp: Any) -> Any:
    """The ``MixedPrecisionPolicy`` ``amp`` (a network's resolved ``amp.<role>`` entry) asks for:
    with ``fsdp_param_dtype: amp`` and autocast on, parameters gathered in its dtype and gradients
    reduce-scattered in float32 (torchtitan's ``mixed_precision_param`` / ``mixed_precision_reduce``);
    else None (gathered and reduced in the parameters' own dtype, float32)."""
    if amp is None or getattr(amp, "fsdp_param_dtype", "float32") != "amp" or amp.enabled is not True:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=getattr(torch, amp.dtype), reduce_dtype=torch.float32)


def check_gathers_in_amp(module: nn.Module, key: str, role: str) -> None:
    """``key`` (``amp.<role>.fsdp_param_dtype``) set to amp for ``module``: refused where it has
    BatchNorm layers. FSDP casts the parameters it gathers and never the buffers, so a BatchNorm
    would get a bf16 weight beside float32 running statistics, which its kernel refuses (FSDP1
    kept BatchNorm out of its mixed precision for that; FSDP2 has no such exception)."""
    norms = [name for name, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        raise UserError(f"{key}=amp: the {role} has BatchNorm layers ({norms[0]}"
                        f"{f' and {len(norms) - 1} more' if len(norms) > 1 else ''}), whose running statistics FSDP "
                        f"keeps float32 beside a gathered bf16/fp16 weight, which BatchNorm refuses; set {key}=float32 "
                        "(autocast still runs the forward in the amp dtype)")


def shard(module: nn.Module, device: torch.device, *, broadcast_buffers: bool, amp: Any = None) -> list[str]:
    """``parallel.<role>=fsdp``: ``module`` (placed on ``device``, checkpointed and compiled as
    asked) made rank 0's and sharded in place over every rank, per unit then the root.

    By default no ``MixedPrecisionPolicy``: parameters are gathered and gradients reduce-scattered
    in float32, and ``amp.<role>`` stays autocast inside the forward, exactly as under DDP or a
    single process. Gathering bf16 parameters halves the all-gather, but autocast keeps some ops in
    float32 (norms, softmax, the losses): those then see bf16-rounded weights and return bf16
    gradients for them, a different computation from the autocast path this run is checked
    against (docs/distributed.md "FSDP"). So it is the user's choice: ``amp`` (the network's
    resolved ``amp.<role>`` entry) with ``fsdp_param_dtype: amp`` gathers in its dtype and
    reduce-scatters in float32 (:func:`mixed_precision`); the sharded parameters, their gradients
    and the optimizer state stay float32, and autocast stays on around the forward.
    ``reshard_after_forward``: True, the root too (ZeRO-3,
    torchtitan's default for the blocks): every forward gathers again, so a network used in no_grad
    forwards (the teacher, D's view in G's loss) never keeps its full weights between calls."""
    broadcast_state(module)
    if broadcast_buffers and any(p.requires_grad for p in module.parameters()):  # trained: a copy follows its own rule
        broadcast_buffers_in_forward(module)
    mesh = device_mesh(device)
    policy = mixed_precision(amp)
    units = shard_network(module, mesh, mp_policy=policy)
    log.info("fsdp: %s sharded over %d ranks, units: %s; parameters gathered in %s, gradients reduced in float32",
             type(module).__name__, mesh.size(), ", ".join(units) if units else "the root alone",
             str(policy.param_dtype).removeprefix("torch.") if policy is not None else "float32")
    return units


def fsdp_modules(module: nn.Module) -> list[nn.Module]:
    """Every FSDP unit of ``module`` (the root last: ``modules()`` order reversed), none when it is
    not sharded."""
    if not is_sharded(module):
        return []
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)][::-1]


def reshard(module: nn.Module) -> None:
    """Each unit's sharded parameters registered again (its gathered ones freed). Where a forward
    left them gathered (a root that does not reshard after forward on torch before the explicit
    flag, an evaluation), the module's parameters are the gathered copies, which an in-place update
    of the shards would not reach."""
    for unit in fsdp_modules(module):
        unit.reshard()


@contextmanager
def no_gradient_sync(modules: Sequence[nn.Module]) -> Iterator[None]:
    """The sharded ``modules`` accumulate their gradients unreduced (FSDP2's equivalent of DDP's
    ``no_sync``): every micro-batch but the last, so the gradients are reduce-scattered once, in
    the last one's backward."""
    sharded = [m for m in modules if is_sharded(m)]
    for module in sharded:
        module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        for module in sharded:
            module.set_requires_gradient_sync(True)


@contextmanager
def gathered(modules: Sequence[nn.Module]) -> Iterator[None]:
    """The sharded ``modules`` with their full parameters on every rank for the block (one
    all-gather per unit on entering, every rank together) and kept between forwards: inside it
    a forward is no collective, so ranks may evaluate val shards of different lengths and rank 0
    alone may draw its panels. Resharded on leaving. Costs the full weights on each rank while an
    evaluation runs (no gradients, no optimizer state)."""
    sharded = [m for m in modules if is_sharded(m)]
    for module in sharded:
        # The root's lazy initialisation (which FSDP runs in its first forward) first: unsharded
        # before it, the first forward would initialise and gather again, a collective that a
        # rank evaluating alone would wait in forever. FSDP exposes no public call for it.
        lazy_init = getattr(module._get_fsdp_state(), "_lazy_init", None)
        if lazy_init is not None:
            lazy_init()
        for unit in fsdp_modules(module):
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
    try:
        yield
    finally:
        for module in sharded:
            for unit in fsdp_modules(module):
                unit.set_reshard_after_forward(True, recurse=False)
            reshard(module)
            forget_forwards(module)


def forget_forwards(module: nn.Module) -> None:
    """FSDP's record of the forwards run since the last backward, cleared (``module``: a sharded
    root, between iterations). FSDP prefetches each unit's all-gather in the backward from the
    order of the forwards before it, so forwards that only some ranks ran (an evaluation's uneven
    val shards, rank 0's panels) would have the ranks gather different units in the next backward:
    a hang, or, where the units have the same shapes (a ViT's blocks), weights silently mixed from
    two blocks. A network that never runs a backward (the teacher) would otherwise keep a record
    that grows each step."""
    reset = getattr(module, "reset_iter_state", None)  # public in recent torch
    if reset is not None:
        reset()
        return
    state = module._get_fsdp_state()  # older torch: the same record, cleared by hand
    state._comm_ctx.post_forward_order.clear()
    for each in state._state_ctx.all_states:
        groups = getattr(each, "_fsdp_param_groups", None) or [getattr(each, "_fsdp_param_group", None)]
        for group in groups:
            if group is not None:
                group._post_forward_indices.clear()


def local_tensors(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each DTensor as this rank's shard (a view sharing its storage: writing it writes the
    parameter), every other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def local_bytes(tensor: torch.Tensor) -> int:
    """The bytes ``tensor`` holds on this rank: its shard's for a DTensor."""
    if fsdp_available():
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            tensor = tensor.to_local()
    return tensor.numel() * tensor.element_size()


def holds_dtensors(state: Any) -> bool:
    """Whether a (nested) state holds any DTensor."""
    if not fsdp_available():
        return False
    from torch.distributed.tensor import DTensor

    if isinstance(state, DTensor):
        return True
    if isinstance(state, Mapping):
        return any(holds_dtensors(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return any(holds_dtensors(value) for value in state)
    return False


def optimizer_state_like(saved: Mapping[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A full, plain optimizer state dict (integer parameter ids, as a single process writes it)
    laid out for ``optimizer`` over sharded parameters: each state tensor shaped like its
    parameter becomes that parameter's DTensor shard, the rest (Adam's scalar ``step``) as saved.
    The optimizer may not have stepped yet (a resume starts with empty state), so the layout is
    taken from the parameters, not from the current state."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entry in saved.get("state", {}).items():
        param = params[int(index)] if 0 <= int(index) < len(params) else None
        if not isinstance(param, DTensor):
            state[index] = entry
            continue
        state[index] = {
            key: distribute_tensor(value.to(device=param.to_local().device, dtype=value.dtype),
                                   param.device_mesh, param.placements,
                                   **({"src_data_rank": None} if _takes_src_data_rank() else {}))
            if isinstance(value, torch.Tensor) and not isinstance(value, DTensor)
            and tuple(value.shape) == tuple(param.shape) else value
            for key, value in entry.items()}
    return {**saved, "state": state}
