"""G as UniMatch V2 builds it: a DINOv2 encoder (timm's ``VisionTransformer``, a learned position
embedding resampled to each input's grid, patch 14) with the DPT head (segadv/models/vit)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from segadv.models.dinov2.encoder import (PATCH, PRETRAINED_IMG_SIZE, create_encoder, default_layers, embed,
                                          encoder_size, set_attention)
from segadv.models.vit.model import ViTDPT


class DinoV2DPT(ViTDPT):
    """G: ``encoder`` (timm's DINOv2 ``VisionTransformer``, keys in timm's layout) and ``head``
    (the DPT head), as :class:`~segadv.models.vit.model.ViTDPT`; H and W multiples of 14.

    ``layers``: the four blocks the head reads (default: UniMatch V2's, or evenly spaced for a
    depth-reduced encoder, :func:`~segadv.models.dinov2.encoder.default_layers`); ``features`` and
    ``out_channels``: the head's widths (default: UniMatch V2's for the encoder's size);
    ``attention``: ``fused`` or ``math`` (:func:`~segadv.models.dinov2.encoder.set_attention`);
    ``img_size``: the position embedding's grid (518, DINOv2's, for its weights to fit);
    ``encoder_overrides``: ``VisionTransformer`` arguments for tiny test models."""

    patch = PATCH
    embedding_modules = ("patch_embed", "pos_drop", "patch_drop", "norm_pre")

    def __init__(self, encoder: str = "vit_small_patch14_dinov2", num_classes: int = 21, *,
                 in_channels: int = 3, depth: int | None = None, layers: Sequence[int] | None = None,
                 features: int | None = None, out_channels: Sequence[int] | None = None,
                 attention: str = "fused", drop_path_rate: float = 0.0, img_size: int = PRETRAINED_IMG_SIZE,
                 input_name: str = "the input", encoder_overrides: Mapping[str, Any] | None = None) -> None:
        vit = create_encoder(encoder, img_size=img_size, depth=depth, drop_path_rate=drop_path_rate,
                             in_channels=in_channels, overrides=encoder_overrides)
        super().__init__(vit, encoder_size(encoder), num_classes, layers=layers,
                         default_layers=default_layers(encoder, len(vit.blocks)), features=features,
                         out_channels=out_channels, input_name=input_name)
        self.encoder_name = encoder
        self.attention = attention
        set_attention(self.encoder, attention)

    def set_attention(self, kernel: str) -> None:
        set_attention(self.encoder, kernel)
        self.attention = kernel

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[int, int]]:
        """The position-embedded tokens; the blocks take nothing besides them."""
        height, width = x.shape[-2:]
        return embed(self.encoder, x), {}, (height // PATCH, width // PATCH)
