"""A method's own random generator (the mean teacher's mixing, UniMatch's views) as the run saves
and restores it: a Stateful, every rank's state gathered, this rank's restored."""

from __future__ import annotations

from typing import Any

import torch

from segadv.parallel import distributed


class MixingRNG:
    """The generator as a Stateful: every rank's state (a list by rank under DDP, as the rank
    RNGs: ``state_dict`` gathers, so every rank calls it), this rank's restored."""

    restores_generator = True  # segadv-plan saves it but cannot restore it (a fake state has no values)

    def __init__(self, generator: torch.Generator, rank: int) -> None:
        self.generator = generator
        self.rank = rank

    def state_dict(self) -> Any:
        return distributed.gather_objects(self.generator.get_state())

    def load_state_dict(self, state: Any) -> None:
        self.generator.set_state(state[self.rank] if isinstance(state, list) else state)


def this_rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0
