"""Where a network's blocks are cut into pipeline stages (the device map's ``g:0/1``): the
boundaries' rule, shared by the networks that split themselves (segadv/models/vit) and by the
placement that asks them to (segadv/parallel/pipeline.py). torch-free."""

from __future__ import annotations

from typing import Sequence

from segadv.errors import UserError


def check_boundaries(boundaries: Sequence[int], blocks: int, stages: int) -> tuple[int, ...]:
    """``boundaries`` as :meth:`Splittable.split` takes them, checked: ``stages - 1`` increasing
    block indices in ``1..blocks-1`` (every stage at least one block)."""
    bounds = tuple(int(b) for b in boundaries)
    if len(bounds) != stages - 1 or any(b <= a for a, b in zip((0, *bounds), (*bounds, blocks))):
        raise UserError(f"pipeline boundaries {list(bounds)}: {stages} stages of {blocks} blocks need {stages - 1} "
                        f"increasing block indices between 1 and {blocks - 1}")
    return bounds


def balanced_boundaries(sizes: Sequence[int], stages: int) -> tuple[int, ...]:
    """Where to cut ``len(sizes)`` blocks of ``sizes`` (parameter counts) into ``stages`` stages of
    about equal size: each boundary where the running total first reaches its share (every stage
    keeps at least one block)."""
    if stages > len(sizes):
        raise UserError(f"{stages} pipeline stages of a network of {len(sizes)} blocks: give it at most "
                        f"{len(sizes)} stages")
    total, blocks = sum(sizes), len(sizes)
    running = [sum(sizes[:i]) for i in range(blocks + 1)]  # running[i]: the blocks before block i
    bounds: list[int] = []
    for stage in range(1, stages):
        lowest = bounds[-1] + 1 if bounds else 1
        highest = blocks - (stages - stage)  # the later stages keep a block each
        bounds.append(next((i for i in range(lowest, highest) if running[i] * stages >= stage * total), highest))
    return check_boundaries(bounds, len(sizes), stages)
