"""UniMatch V2's DPT head (LiheYoung/UniMatch-V2, model/semseg/dpt.py), which every ViT arch puts on
its encoder (segadv/models/vit/model.py).

The head reads four blocks' patch tokens (the encoder's final norm applied, class and register
tokens dropped), projects each to its width (1x1), brings them to 4x, 2x, 1x and 1/2x the patch
grid, and fuses them coarse to fine (RefineNet-style fusion blocks, bilinear with
``align_corners=True``) into logits at 8x the patch grid. Its module names are the reference's
(``projects``, ``resize_layers``, ``scratch.layerN_rn``, ``scratch.refinenetN``,
``scratch.output_conv``), so its weights keep that layout.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class ResidualConvUnit(nn.Module):
    """ReLU, 3x3 conv, ReLU, 3x3 conv, plus the input (the reference's ``use_bn=False``)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(features, features, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(features, features, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Not in place: x is still needed for the residual sum.
        return self.conv2(F.relu(self.conv1(F.relu(x)))) + x


class FeatureFusionBlock(nn.Module):
    """The coarser path plus the refined skip feature, refined again, resized (to ``size``, else
    2x) and mixed by a 1x1 conv."""

    def __init__(self, features: int, skip: bool = True) -> None:
        super().__init__()
        self.out_conv = nn.Conv2d(features, features, kernel_size=1)
        # The reference's names, kept for its weights. The coarsest block has no skip input: the
        # reference builds its resConfUnit1 all the same, never used (so its DDP needs
        # find_unused_parameters); here it is not built, and every parameter takes part in the loss.
        if skip:
            self.resConfUnit1 = ResidualConvUnit(features)
        self.resConfUnit2 = ResidualConvUnit(features)

    def forward(self, path: torch.Tensor, skip: torch.Tensor | None = None,
                size: Sequence[int] | None = None) -> torch.Tensor:
        if skip is not None:
            path = path + self.resConfUnit1(skip)
        path = self.resConfUnit2(path)
        if size is None:
            path = F.interpolate(path, scale_factor=2, mode="bilinear", align_corners=True)
        else:
            path = F.interpolate(path, size=tuple(size), mode="bilinear", align_corners=True)
        return self.out_conv(path)


class Scratch(nn.Module):
    """Each projected feature to the fusion width (3x3, no bias), the four fusion blocks and the
    classifier (3x3 conv, ReLU, 1x1 conv to the classes)."""

    def __init__(self, out_channels: Sequence[int], features: int, num_classes: int) -> None:
        super().__init__()
        for i, width in enumerate(out_channels, start=1):
            setattr(self, f"layer{i}_rn", nn.Conv2d(width, features, kernel_size=3, padding=1, bias=False))
        for i in range(1, 5):
            setattr(self, f"refinenet{i}", FeatureFusionBlock(features, skip=i < 4))
        self.output_conv = nn.Sequential(
            nn.Conv2d(features, features, kernel_size=3, padding=1),
            nn.ReLU(True),
            nn.Conv2d(features, num_classes, kernel_size=1),
        )


class DPTHead(nn.Module):
    """The DPT head on four token maps of ``embed_dim`` channels (UniMatch V2's ``DPTHead``)."""

    def __init__(self, num_classes: int, embed_dim: int, features: int, out_channels: Sequence[int]) -> None:
        super().__init__()
        c = list(out_channels)
        self.projects = nn.ModuleList(nn.Conv2d(embed_dim, width, kernel_size=1) for width in c)
        self.resize_layers = nn.ModuleList([
            nn.ConvTranspose2d(c[0], c[0], kernel_size=4, stride=4),  # 4x the patch grid
            nn.ConvTranspose2d(c[1], c[1], kernel_size=2, stride=2),  # 2x
            nn.Identity(),  # 1x
            nn.Conv2d(c[3], c[3], kernel_size=3, stride=2, padding=1),  # 1/2x (ceil for an odd grid)
        ])
        self.scratch = Scratch(c, features, num_classes)

    def forward(self, tokens: Sequence[torch.Tensor], grid: tuple[int, int]) -> torch.Tensor:
        """Logits at 8x ``grid`` (rows, columns of patches) from four (B, rows * columns, C) maps."""
        s = self.scratch
        maps = []
        for t, project, resize in zip(tokens, self.projects, self.resize_layers):
            x = t.transpose(1, 2).reshape(t.shape[0], t.shape[-1], grid[0], grid[1])
            maps.append(resize(project(x)))
        l1, l2, l3, l4 = (rn(x) for rn, x in zip((s.layer1_rn, s.layer2_rn, s.layer3_rn, s.layer4_rn), maps))
        path = s.refinenet4(l4, size=l3.shape[2:])
        path = s.refinenet3(path, l3, size=l2.shape[2:])
        path = s.refinenet2(path, l2, size=l1.shape[2:])
        path = s.refinenet1(path, l1)
        return s.output_conv(path)
