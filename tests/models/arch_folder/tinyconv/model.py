"""tinyconv's network: two convolutions, and what it offers segadv (segadv/models/base.py): any
input size, its body as the one block activation checkpointing recomputes."""

import torch
from torch import nn

from segadv.errors import UserError
from segadv.models.base import Generator
from tinyconv.config import TinyConvConfig


class TinyConv(Generator):
    def __init__(self, width: int, num_classes: int, in_channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.head = nn.Conv2d(width, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def checkpoint_units(self) -> list[str]:
        return ["body"]


def build_tiny(cfg: TinyConvConfig, num_classes: int, in_channels: int = 3) -> TinyConv:
    if cfg.aux_head:
        raise UserError("model.generator.aux_head: tinyconv has no aux output")
    return TinyConv(cfg.width, num_classes, in_channels)
