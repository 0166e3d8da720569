"""What a segadv training checkpoint holds: a header, the config, and one entry per stateful part
of the run (networks, optimizers with their scalers and schedules, data streams, RNGs, step, best).

A run's state is a mapping ``{file key: Stateful}``; :func:`snapshot` turns it into the file's dict
and :func:`restore` loads a file's dict back into it, every piece strictly.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Iterator, Mapping, Protocol

import torch
from torch import nn

from segadv import __version__
from segadv.config.roles import ROLES
from segadv.errors import UserError
from segadv.parallel.fsdp import full_state, is_sharded
from segadv.parallel.placement import unwrap

log = logging.getLogger(__name__)

FORMAT = "segadv"
FORMAT_VERSION = 1
# Entries a checkpoint written before them lacks, each loaded as "none yet" (a run's record of its
# best, its latest evaluation, its clock, keep_best's ranking, train.early_stop's count).
OPTIONAL = ("rng", "best", "evaluation", "clock", "best_kept", "early_stop")


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class NetworkWeights:
    """A network's weights as a Stateful: saved unwrapped (never a ``module.`` prefix), loaded by
    the one strict loader. A sharded network (FSDP) is saved as its full state, plain CPU tensors
    under a single process's keys (every rank takes part in the gathers), and loaded from one."""

    def __init__(self, role: str, module: nn.Module) -> None:
        self.role = role
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        bare = unwrap(self.module)
        return full_state(bare.state_dict()) if is_sharded(bare) else bare.state_dict()

    def state_as_held(self) -> dict[str, Any]:
        """The state without gathering a sharded network: its DTensors have the full tensors'
        shapes, so what a checkpoint of it weighs is read off without a collective or a full copy."""
        return unwrap(self.module).state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        from segadv.checkpoint.loader import load_weights  # the same strict loader as everywhere

        load_weights(state, self.module, role=self.role, name=f"checkpoint {self.role}")


class Attribute:
    """One attribute of an object as a Stateful: a plain value (the step, the best evaluation)."""

    def __init__(self, owner: object, name: str) -> None:
        self.owner = owner
        self.name = name

    def state_dict(self) -> Any:
        return getattr(self.owner, self.name)

    def load_state_dict(self, state: Any) -> None:
        setattr(self.owner, self.name, state)


def snapshot(states: Mapping[str, Stateful], config: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint file's dict. Every rank calls it: an entry may gather across ranks (RNGs)."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "segadv_version": __version__,
        "config": config,
        **{key: state.state_dict() for key, state in states.items()},
    }


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a (nested) state."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def nonfinite_entries(ckpt: Mapping[str, Any]) -> list[str]:
    """The keys of a checkpoint dict whose floating-point tensors hold a NaN or an infinity (one
    host read per entry and device: for save time, never the step)."""
    bad = []
    for key, value in ckpt.items():
        by_device: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
        for tensor in tensors_in(value):
            if tensor.is_floating_point():
                by_device[tensor.device].append(torch.isfinite(tensor).all())
        if not all(bool(torch.stack(flags).all()) for flags in by_device.values()):
            bad.append(key)
    return bad


def expected_bytes(states: Mapping[str, Stateful]) -> int:
    """The size of a checkpoint of ``states`` once training has stepped: the tensors it holds now,
    plus the optimizer state that appears at the first step (``state_bytes()``, where a state
    has one) when it does not exist yet."""
    total = 0
    for state in states.values():
        # As held (``state_as_held``, where a state has it): a sharded network's size is its full
        # tensors', without gathering them to ask.
        as_held = getattr(state, "state_as_held", state.state_dict)()
        held = sum(t.numel() * t.element_size() for t in tensors_in(as_held))
        total += max(held, getattr(state, "state_bytes", lambda: 0)())
    return total


def is_segadv_checkpoint(obj: dict[str, Any]) -> bool:
    return obj.get("format") == FORMAT


def restore(ckpt: dict[str, Any], states: Mapping[str, Stateful]) -> int:
    """Load every entry of ``states`` from ``ckpt`` strictly; returns the step it was taken at."""
    if not is_segadv_checkpoint(ckpt):
        raise UserError("not a segadv training checkpoint (no 'format': 'segadv' entry): it can "
                        "initialise weights (init.generator.path) but not resume a run")
    ignored = [name for name in ROLES if name in ckpt and name not in states]
    if ignored:
        # Written when every run trained a D (a MinEnt checkpoint of before): what the run does not
        # train is left out; a network the run trains and the file lacks is refused below.
        log.info("the checkpoint holds the %s, which this run does not train: ignored", " and the ".join(ignored))
        ckpt = {key: value for key, value in ckpt.items()
                if key not in ignored and key.removeprefix("optim_") not in ignored}
    if ckpt.get("data_streams") is None and "data_streams" in states:
        # Saved before stream positions were: every stream drew one batch a step (supervised).
        ckpt = {**ckpt, "data_streams": {name: {"batches": ckpt["step"]}
                                         for name in states["data_streams"].state_dict()}}
    missing = sorted(key for key in states if key not in ckpt and key not in OPTIONAL)
    if missing:
        raise UserError(f"the checkpoint lacks {', '.join(missing)}: not a full training state")
    for key, state in states.items():
        if key in ckpt:
            state.load_state_dict(ckpt[key])
    return int(ckpt["step"])
