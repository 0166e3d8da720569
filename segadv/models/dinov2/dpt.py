"""G as UniMatch V2 builds it: a DINOv2 encoder (timm) with a DPT head (model/semseg/dpt.py).

The head reads four blocks' patch tokens (the encoder's final norm applied, class and register
tokens dropped), projects each to its width (1x1), brings them to 4x, 2x, 1x and 1/2x the patch
grid, and fuses them coarse to fine (RefineNet-style fusion blocks, bilinear with
``align_corners=True``) into logits at 8x the patch grid, which are upsampled to the input
(bilinear, ``align_corners=True``, as the reference does). The head's module names are the
reference's (``projects``, ``resize_layers``, ``scratch.layerN_rn``, ``scratch.refinenetN``,
``scratch.output_conv``), so its weights keep that layout.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from segadv.errors import UserError
from segadv.models.base import Generator
from segadv.models.features import scale_features
from segadv.models.dinov2.encoder import (PATCH, PRETRAINED_IMG_SIZE, check_input_size, check_layers, create_encoder,
                                       default_layers, embed, encoder_size, patch_tokens, set_attention)
from segadv.models.dinov2.split import Placement, split_blocks


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


class DinoV2DPT(Generator):
    """G: ``encoder`` (timm's DINOv2 ``VisionTransformer``, keys in timm's layout) and ``head``
    (the DPT head). ``forward(x)`` returns the logits (B, classes, H, W) at ``x``'s size; H and W
    must be multiples of the patch (14), a UserError naming ``input_name`` otherwise.

    ``layers``: the four blocks the head reads (default: UniMatch V2's, or evenly spaced for a
    depth-reduced encoder, :func:`~segadv.models.dinov2.encoder.default_layers`); ``features`` and
    ``out_channels``: the head's widths (default: UniMatch V2's for the encoder's size);
    ``attention``: ``fused`` or ``math`` (:func:`~segadv.models.dinov2.encoder.set_attention`);
    ``img_size``: the position embedding's grid (518, DINOv2's, for its weights to fit);
    ``encoder_overrides``: ``VisionTransformer`` arguments for tiny test models."""

    # The position embedding's resampling factors are Python floats of the input's grid, constants
    # in an ONNX trace: the exported graph takes the traced size only (segadv-export says so).
    onnx_dynamic_shapes = False

    def input_divisor(self) -> int:
        """The encoder cuts the input into patches: both sides must be multiples of the patch (14)."""
        return PATCH

    def __init__(self, encoder: str = "vit_small_patch14_dinov2", num_classes: int = 21, *,
                 in_channels: int = 3, depth: int | None = None, layers: Sequence[int] | None = None,
                 features: int | None = None, out_channels: Sequence[int] | None = None,
                 attention: str = "fused", drop_path_rate: float = 0.0, img_size: int = PRETRAINED_IMG_SIZE,
                 input_name: str = "the input", encoder_overrides: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        size = encoder_size(encoder)
        self.encoder_name = encoder
        self.input_name = input_name
        self.encoder = create_encoder(encoder, img_size=img_size, depth=depth, drop_path_rate=drop_path_rate,
                                      in_channels=in_channels, overrides=encoder_overrides)
        n = len(self.encoder.blocks)
        self.layers = check_layers(default_layers(encoder, n) if layers is None else layers, n)
        if max(self.layers) != n - 1:
            # Blocks after the last one read would never run: parameters outside the loss, which
            # DDP (find_unused_parameters=False) and weight decay should not see.
            raise UserError(f"intermediate layers {list(self.layers)} end before the encoder's last block ({n - 1}): "
                            f"read block {n - 1} last, or set the depth to {max(self.layers) + 1}")
        out_channels = tuple(size.out_channels if out_channels is None else out_channels)
        if len(out_channels) != 4:
            raise UserError(f"DPT head out_channels {list(out_channels)}: the head has exactly 4 branches")
        self.head = DPTHead(num_classes, self.encoder.embed_dim, size.features if features is None else features,
                            out_channels)
        self.attention = attention
        set_attention(self.encoder, attention)
        self.placement: Placement | None = None  # one device unless split_blocks sets it
        self._stage_devices: tuple[torch.device, ...] = ()

    def split(self, stage_devices: Sequence[torch.device], boundaries: Sequence[int] | None = None) -> None:
        """Pipeline stages (segadv/parallel/pipeline.py's protocol): the embedding on the first
        device, the blocks in even runs (or from ``boundaries``), the final norm and the head on the
        last (:func:`~segadv.models.dinov2.split.split_blocks`)."""
        split_blocks(self, stage_devices, boundaries)
        self._stage_devices = tuple(torch.device(d) for d in stage_devices)

    @property
    def pipeline_devices(self) -> tuple[torch.device, ...]:
        """Each stage's device in order after :meth:`split` (a device may repeat); () before."""
        return self._stage_devices

    def set_attention(self, kernel: str) -> None:
        set_attention(self.encoder, kernel)
        self.attention = kernel

    def stages(self) -> list[tuple[str, list[nn.Module]]]:
        """The model in pipeline order, as (name, modules): ``embed`` (patch embedding and the
        encoder's own token parameters, which live on the encoder itself), ``blocks.0`` ...
        ``blocks.N-1``, ``head`` (the final norm and the DPT head)."""
        vit = self.encoder
        embedding = [vit.patch_embed, vit.pos_drop, vit.patch_drop, vit.norm_pre]
        return ([("embed", embedding)] + [(f"blocks.{i}", [b]) for i, b in enumerate(vit.blocks)]
                + [("head", [vit.norm, self.head])])

    def checkpoint_units(self) -> list[str]:
        """The submodule names to run under activation checkpointing: each ViT block (most of the
        activation memory: the attention and the 4x-wide MLP) and the head."""
        return [f"encoder.blocks.{i}" for i in range(len(self.encoder.blocks))] + ["head"]

    def feature_channels(self) -> tuple[int, ...]:
        """The channels of the token maps the head reads, in the order ``feature_scales`` takes them
        (segadv/models/features.py)."""
        return (int(self.encoder.embed_dim),) * len(self.layers)

    def forward(self, x: torch.Tensor, feature_scales: Sequence[torch.Tensor] | None = None,
                with_unperturbed: bool = False) -> Any:
        """The logits at ``x``'s size; with ``feature_scales``, the head reads each token map
        times its (B, C) scale (UniMatch V2's complementary dropout, on the normed patch tokens as
        its DPT), with ``with_unperturbed`` beside the unscaled maps in one batch, returning
        ``(clean, perturbed)`` (segadv/models/features.py)."""
        height, width = x.shape[-2:]
        if not torch.jit.is_tracing():
            check_input_size(int(height), int(width), self.input_name)
        grid = (height // PATCH, width // PATCH)
        vit, placement = self.encoder, self.placement
        tokens = embed(vit, x if placement is None else x.to(placement.embed))
        wanted = set(self.layers)
        taken: dict[int, torch.Tensor] = {}
        for i, block in enumerate(vit.blocks):
            if placement is not None:
                tokens = tokens.to(placement.blocks[i])
            tokens = block(tokens)
            if i in wanted:
                taken[i] = tokens if placement is None else tokens.to(placement.head)
        features = [patch_tokens(vit, taken[i]) for i in self.layers]
        if feature_scales is not None:
            features = scale_features(features, feature_scales, with_unperturbed=with_unperturbed)
        logits = self.head(features, grid)
        logits = F.interpolate(logits, size=(height, width), mode="bilinear", align_corners=True)
        return logits.chunk(2) if feature_scales is not None and with_unperturbed else logits
