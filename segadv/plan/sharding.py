"""One rank of an N-process launch (``segadv-plan --world-size N``): what ``parallel.<role>: fsdp``
and ``ddp`` change on that rank's devices.

The dry run plans the rank's own iteration (its ``data.batch_size``, its networks on its devices)
with every network unwrapped, so the activations are measured as they are; this module then
accounts the wrapper over the network's real parameters, units and optimizer state:

- **FSDP** (FSDP2's ``fully_shard`` as ``segadv/parallel/fsdp.py``'s ``shard_network`` applies it:
  each of ``shard_units`` its own unit, then the root). Every parameter is sharded on dim 0: a
  rank holds ``ceil(dim0 / N)`` rows of it (the padded shard), and so do its gradient and each of
  its optimizer state tensors of the parameter's shape (AdamW's moments; the step counts are
  scalars, kept whole). Buffers are not sharded. In flight beside them: the root's gathered
  parameters (the root's forward encloses every unit's, and its backward theirs), the unit being
  computed and the next one prefetched, and while a trained unit's backward ends its unsharded
  gradients and the reduce-scatter's input, a copy of them in float32 (FSDP2 frees the gradients
  only after the copy-in). The gathered units and their unsharded gradients are in the gather
  dtype (``NetworkState.gather_itemsize``): the parameters' own (float32) by default, as segadv's
  FSDP sets no ``MixedPrecisionPolicy`` and autocast stays inside the forward; the network's
  autocast dtype (2 bytes) where ``amp.<role>.fsdp_param_dtype: amp`` asks FSDP to gather in it
  (``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)``: the reduce-scatter's input stays
  float32, the shards and the optimizer state keep their own dtype). The largest neighbouring pair
  of units and the largest unit are taken, whichever they are: an upper bound by at most a unit's
  difference.
  The teacher of a student under FSDP is sharded like it (its forward gathers its units too).
- **DDP**: full parameters, gradients and optimizer state, and the reducer's gradient buckets: with
  torch's default ``gradient_as_bucket_view=False`` (segadv's DDP keeps it) the buckets are a copy of
  every gradient, allocated when DDP is built and held for the whole run, in each parameter's dtype.

A phase's peak (the iterations', an evaluation's, a checkpoint's) is rescaled at its own moment:
the network state live then (``DeviceMemory.at_peak``) is replaced by its shard, and what the
wrapper holds in flight is added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

import torch

# The plans this module rescales are segadv/plan/dry_run.py's DevicePlan and Plan, annotated Any:
# dry_run imports this module, and an import back, even for typing, would close a cycle.
DevicePlan = Plan = Any

STATE = ("params", "grads", "optimizer")
REDUCE_DTYPE_BYTES = 4  # FSDP2 reduce-scatters in float32 (segadv's policy: float32 reduction)


def shard_rows(dim0: int, world_size: int) -> int:
    """Rows of a dim-0 shard on the rank that holds the most (FSDP2 pads dim 0 to a multiple of N)."""
    return -(-dim0 // world_size)


@dataclass(frozen=True)
class Tensor:
    """A parameter's or a state tensor's shape and element size (fake tensors have no values)."""

    shape: tuple[int, ...]
    itemsize: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "Tensor":
        return cls(tuple(tensor.shape), tensor.element_size())

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def rest(self) -> int:
        return math.prod(self.shape[1:])

    def shard_bytes(self, world_size: int) -> int:
        """A rank's padded dim-0 shard (a 0-dim tensor is kept whole)."""
        if not self.shape:
            return self.nbytes
        return shard_rows(self.shape[0], world_size) * self.rest() * self.itemsize

    def local_bytes(self, world_size: int, rank: int) -> int:
        """What a tensor made like the rank's shard holds (AdamW's ``zeros_like`` of a sharded
        parameter): its unpadded rows, fewer on the last ranks, none where dim 0 runs out (a
        ViT's (1, tokens, dim) position embedding sits whole on rank 0)."""
        if not self.shape:
            return self.nbytes
        rows = shard_rows(self.shape[0], world_size)
        return max(0, min(rows, self.shape[0] - rank * rows)) * self.rest() * self.itemsize

    def padded_numel(self, world_size: int) -> int:
        """Elements once gathered: dim 0 padded to a multiple of N."""
        if not self.shape:
            return 1
        return shard_rows(self.shape[0], world_size) * world_size * self.rest()


@dataclass
class Param:
    tensor: Tensor
    trained: bool  # takes a gradient (not frozen: model.generator.freeze_encoder)
    unit: int | None  # the FSDP unit it belongs to (shard_units' index), None: the root's
    state: list[Tensor] = field(default_factory=list)  # its optimizer state tensors


@dataclass
class NetworkState:
    """One network's parameters, units and optimizer state as planned (every rank's are alike)."""

    role: str
    mode: str  # its wrapper on the rank: none, ddp or fsdp
    device: str  # the planned device (as the map names it) its parameters are on
    params: list[Param]
    buffers_bytes: int
    units: list[str]
    gather_itemsize: int | None  # the dtype FSDP gathers in (amp.<role>.fsdp_param_dtype: amp); None: the parameters' own
    trained: bool

    # ------------------------------------------------------------- full (unwrapped) figures
    def full(self, category: str) -> int:
        if category == "params":
            return sum(p.tensor.nbytes for p in self.params) + self.buffers_bytes
        if category == "grads":
            return sum(p.tensor.nbytes for p in self.params if p.trained) if self.trained else 0
        return sum(s.nbytes for p in self.params for s in p.state)

    # ------------------------------------------------------------- one rank's figures
    def rank(self, category: str, world_size: int, rank: int = 0) -> int:
        """Rank ``rank``'s bytes of ``category`` under its wrapper (rank 0 holds the most). FSDP2
        keeps each parameter's shard, and each unit's reduce-scattered gradients, padded to
        ``ceil(dim0 / N)`` rows on every rank; the optimizer's state is made like the shard's
        unpadded rows (``Tensor.local_bytes``)."""
        if self.mode != "fsdp":
            return self.full(category)
        if category == "params":
            return sum(p.tensor.shard_bytes(world_size) for p in self.params) + self.buffers_bytes
        if category == "grads":
            return sum(p.tensor.shard_bytes(world_size) for p in self.params if p.trained) if self.trained else 0
        return sum(s.local_bytes(world_size, rank) if s.shape == p.tensor.shape else s.nbytes
                   for p in self.params for s in p.state)

    def _gathered(self, params: Iterable[Param], world_size: int) -> int:
        return sum(p.tensor.padded_numel(world_size) * (self.gather_itemsize or p.tensor.itemsize) for p in params)

    def _unit_params(self, unit: int | None) -> list[Param]:
        return [p for p in self.params if p.unit == unit]

    def in_flight(self, world_size: int, training: bool) -> int:
        """What the wrapper holds beside the rank's state: FSDP's gathered units (and, in a
        training iteration, a unit's unsharded gradients with the reduce-scatter's input), DDP's
        buckets; nothing unwrapped."""
        if self.mode == "ddp":
            return self.full("grads")
        if self.mode != "fsdp":
            return 0
        units = [self._gathered(self._unit_params(i), world_size) for i in range(len(self.units))]
        pair = max((a + b for a, b in zip(units, units[1:])), default=max(units, default=0))
        held = self._gathered(self._unit_params(None), world_size) + pair
        if not (training and self.trained):
            return held
        grads = []
        for unit in [*range(len(self.units)), None]:
            trained = [p for p in self._unit_params(unit) if p.trained]
            numel = sum(p.tensor.padded_numel(world_size) for p in trained)
            grads.append(self._gathered(trained, world_size) + numel * REDUCE_DTYPE_BYTES)
        return held + max(grads, default=0)

    def as_json(self, world_size: int) -> dict[str, object]:
        return {"mode": self.mode, "device": self.device,
                **{f"{c}_bytes": self.rank(c, world_size) for c in STATE},
                "in_flight_bytes": self.in_flight(world_size, training=True),
                **{f"unsharded_{c}_bytes": self.full(c) for c in STATE},
                "units": len(self.units),
                # every rank's own (they differ where dim 0 does not divide: the optimizer's state)
                "ranks": [{f"{c}_bytes": self.rank(c, world_size, r) for c in STATE}
                          for r in range(world_size if self.mode == "fsdp" else 1)]}


def rescale(live: dict[tuple[str, str], int], states: list[NetworkState], world_size: int) -> int:
    """Bytes by which the state live at a peak (``live``: {(role, category): bytes}) shrinks once
    the FSDP networks' state is their rank's shards."""
    saved = 0
    for state in states:
        if state.mode != "fsdp":
            continue
        for category in STATE:
            full, rank = state.full(category), state.rank(category, world_size)
            held = live.get((state.role, category), 0)
            if full and held:
                saved += held - held * rank // full
    return saved


def rank_row(row: DevicePlan, states: list[NetworkState], world_size: int, memory: object) -> DevicePlan:
    """``row`` (the unwrapped rank's device) as it is under its networks' wrappers."""
    mine = [s for s in states if s.device == row.device]
    if not mine or all(s.mode == "none" for s in mine):
        return replace(row, networks={s.role: s.as_json(world_size) for s in mine})

    def column(category: str, largest: int) -> int:
        return max(largest - sum(s.full(category) - s.rank(category, world_size) for s in mine), 0)

    # FSDP networks run one after another (the teacher's forward, G's, D's): the most any one
    # holds gathered at once; DDP's buckets are all held throughout.
    fsdp_training = max((s.in_flight(world_size, True) for s in mine if s.mode == "fsdp"), default=0)
    fsdp_forward = max((s.in_flight(world_size, False) for s in mine if s.mode == "fsdp"), default=0)
    buckets = sum(s.in_flight(world_size, True) for s in mine if s.mode == "ddp")
    at_peak = memory.at_peak
    training_live = memory.training_at_peak()
    # a checkpoint gathers the sharded parameters themselves (their own dtype), whatever FSDP's gather dtype
    largest_tensor = max((p.tensor.padded_numel(world_size) * p.tensor.itemsize
                          for s in mine if s.mode == "fsdp" for p in s.params), default=0)
    return replace(
        row,
        params_bytes=column("params", row.params_bytes),
        grads_bytes=column("grads", row.grads_bytes),
        optimizer_bytes=column("optimizer", row.optimizer_bytes),
        peak_bytes=row.peak_bytes - rescale(training_live, mine, world_size) + fsdp_training + buckets,
        evaluation_peak_bytes=row.evaluation_peak_bytes - rescale(at_peak["evaluation"], mine, world_size)
        + fsdp_forward + buckets,
        # a checkpoint gathers the full state a tensor at a time (to the host)
        checkpoint_peak_bytes=row.checkpoint_peak_bytes - rescale(at_peak["checkpoint"], mine, world_size)
        + largest_tensor + buckets,
        wrapper_bytes=fsdp_training + buckets,
        networks={s.role: s.as_json(world_size) for s in mine},
    )


def rank_plan(plan: Plan, world_size: int, modes: dict[str, str] | None = None) -> Plan:
    """``plan``'s rank (from its unwrapped rows, ``network_states`` and ``memory``) in a launch of
    ``world_size`` processes, its networks under their wrappers (``modes``: {role: none, ddp or
    fsdp}; None: as planned). One dry run gives every world size and wrapper."""
    states = plan.network_states
    if modes is not None:
        states = [replace(s, mode=modes.get(s.role, "none")) for s in states]
    rows = {name: rank_row(row, states, world_size, plan.memory[name]) for name, row in plan.unwrapped.items()}
    return replace(plan, devices=rows, world_size=world_size, network_states=states)
