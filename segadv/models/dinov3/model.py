"""G on a DINOv3 encoder (timm's ``Eva``: RoPE, a class and 4 register tokens, patch 16) with the
DPT head of segadv/models/dinov2/dpt.py: the same head, reading four blocks' patch tokens (the
encoder's final norm applied, class and register tokens dropped), its logits at 8x the patch grid
upsampled to the input (bilinear, ``align_corners=True``). Keys: ``encoder.*`` timm's DINOv3
layout, ``head.*`` UniMatch V2's.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from segadv.errors import UserError
from segadv.models.base import Generator
from segadv.models.dinov2.dpt import DPTHead
from segadv.models.dinov2.encoder import check_input_size, check_layers
from segadv.models.dinov3.encoder import PATCH, create_encoder, default_layers, embed, encoder_size
from segadv.models.features import scale_features


class DinoV3DPT(Generator):
    """G: ``encoder`` (timm's DINOv3 ``Eva``) and ``head`` (the DPT head). ``forward(x)`` returns the
    logits (B, classes, H, W) at ``x``'s size; H and W must be multiples of the patch (16), a
    UserError naming ``input_name`` otherwise. ``layers``: the four blocks the head reads (default:
    Meta's, :func:`~segadv.models.dinov3.encoder.default_layers`); ``features`` and
    ``out_channels``: the head's widths (default: the size's); ``encoder_overrides``: ``Eva``
    arguments for tiny test models."""

    # The rotary embedding is computed from Python ints of the input's grid, constants in an ONNX
    # trace: the exported graph takes the traced size only (segadv-export says so).
    onnx_dynamic_shapes = False

    def input_divisor(self) -> int:
        """The encoder cuts the input into patches: both sides must be multiples of the patch (16)."""
        return PATCH

    def __init__(self, encoder: str = "vit_small_patch16_dinov3", num_classes: int = 21, *,
                 in_channels: int = 3, depth: int | None = None, layers: Sequence[int] | None = None,
                 features: int | None = None, out_channels: Sequence[int] | None = None,
                 drop_path_rate: float = 0.0, input_name: str = "the input",
                 encoder_overrides: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        size = encoder_size(encoder)
        self.encoder_name = encoder
        self.input_name = input_name
        self.encoder = create_encoder(encoder, depth=depth, drop_path_rate=drop_path_rate, in_channels=in_channels,
                                      overrides=encoder_overrides)
        n = len(self.encoder.blocks)
        self.layers = check_layers(default_layers(encoder, n) if layers is None else layers, n)
        if max(self.layers) != n - 1:
            # Blocks after the last one read would never run: parameters outside the loss.
            raise UserError(f"intermediate layers {list(self.layers)} end before the encoder's last block ({n - 1}): "
                            f"read block {n - 1} last, or set the depth to {max(self.layers) + 1}")
        out_channels = tuple(size.out_channels if out_channels is None else out_channels)
        if len(out_channels) != 4:
            raise UserError(f"DPT head out_channels {list(out_channels)}: the head has exactly 4 branches")
        self.head = DPTHead(num_classes, self.encoder.embed_dim, size.features if features is None else features,
                            out_channels)

    def checkpoint_units(self) -> list[str]:
        """Each ViT block (most of the activation memory) and the head, recomputed in the backward."""
        return [f"encoder.blocks.{i}" for i in range(len(self.encoder.blocks))] + ["head"]

    def feature_channels(self) -> tuple[int, ...]:
        """The channels of the token maps the head reads, in the order ``feature_scales`` takes them."""
        return (int(self.encoder.embed_dim),) * len(self.layers)

    def forward(self, x: torch.Tensor, feature_scales: Sequence[torch.Tensor] | None = None,
                with_unperturbed: bool = False) -> Any:
        """The logits at ``x``'s size; ``feature_scales`` and ``with_unperturbed`` as
        :meth:`segadv.models.dinov2.dpt.DinoV2DPT.forward` (UniMatch V2's complementary dropout)."""
        height, width = x.shape[-2:]
        if not torch.jit.is_tracing():
            check_input_size(int(height), int(width), self.input_name, patch=PATCH)
        vit = self.encoder
        tokens, rope, grid = embed(vit, x)
        wanted = set(self.layers)
        taken: dict[int, torch.Tensor] = {}
        for i, block in enumerate(vit.blocks):
            tokens = block(tokens, rope=rope)
            if i in wanted:
                taken[i] = tokens
        features = [vit.norm(taken[i])[:, vit.num_prefix_tokens:] for i in self.layers]
        if feature_scales is not None:
            features = scale_features(features, feature_scales, with_unperturbed=with_unperturbed)
        logits = self.head(features, grid)
        logits = F.interpolate(logits, size=(height, width), mode="bilinear", align_corners=True)
        return logits.chunk(2) if feature_scales is not None and with_unperturbed else logits
