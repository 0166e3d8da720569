"""A toy generator that can be split into pipeline stages (segadv/parallel/pipeline.py's
protocol), for the tests of ``g:0/1``: a stem, a stack of conv blocks and a 1x1 head, at the
input's resolution. ``use_toy_generator(monkeypatch)`` makes segadv build it as G."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from segadv.models.base import Generator
from segadv.parallel.pipeline import balanced_boundaries, check_boundaries, hand_over

WIDTH, BLOCKS = 8, 4


class ToySplitG(Generator):
    def __init__(self, num_classes: int, width: int = WIDTH, blocks: int = BLOCKS) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()) for _ in range(blocks))
        self.head = nn.Conv2d(width, num_classes, 1)
        self._block_devices: tuple[torch.device, ...] = ()  # each block's stage device, once split
        self._stages: tuple[torch.device, ...] = ()

    def split(self, stage_devices: Sequence[torch.device], boundaries: Sequence[int] | None = None) -> None:
        stages = [torch.device(d) for d in stage_devices]
        sizes = [sum(p.numel() for p in block.parameters()) for block in self.blocks]
        bounds = check_boundaries(boundaries, len(sizes), len(stages)) if boundaries is not None \
            else balanced_boundaries(sizes, len(stages))
        stage_of = [sum(i >= b for b in bounds) for i in range(len(self.blocks))]
        self.stem.to(stages[0])
        for block, stage in zip(self.blocks, stage_of):
            block.to(stages[stage])
        self.head.to(stages[-1])
        self._block_devices = tuple(stages[s] for s in stage_of)
        self._stages = tuple(stages)

    @property
    def pipeline_devices(self) -> tuple[torch.device, ...]:
        return self._stages

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._stages:
            x = hand_over(x, self._stages[0])
        x = self.stem(x)
        for i, block in enumerate(self.blocks):
            if self._block_devices:
                x = hand_over(x, self._block_devices[i])
            x = block(x)
        if self._stages:
            x = hand_over(x, self._stages[-1])
        return self.head(x)


class ToyUnsplittableG(ToySplitG):
    """The same network without the protocol (as smp's DeepLab generators are)."""

    split = None  # type: ignore[assignment]


def use_toy_generator(monkeypatch, cls: type = ToySplitG) -> None:
    """segadv builds ``cls`` as G (the real generator's builder replaced where the run is assembled)."""
    from segadv.training import role

    monkeypatch.setattr(role, "build_generator", lambda cfg, num_classes, *a, **k: cls(num_classes))
