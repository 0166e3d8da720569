"""G on a DINOv3 encoder (timm's ``Eva``: RoPE, a class and 4 register tokens, patch 16) with the
DPT head (segadv/models/vit). Keys: ``encoder.*`` timm's DINOv3 layout, ``head.*`` UniMatch V2's.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from segadv.models.dinov3.encoder import PATCH, create_encoder, default_layers, embed, encoder_size
from segadv.models.vit.model import ViTDPT


class DinoV3DPT(ViTDPT):
    """G: ``encoder`` (timm's DINOv3 ``Eva``) and ``head`` (the DPT head), as
    :class:`~segadv.models.vit.model.ViTDPT`; H and W multiples of 16. ``layers``: the four blocks
    the head reads (default: Meta's, :func:`~segadv.models.dinov3.encoder.default_layers`);
    ``features`` and ``out_channels``: the head's widths (default: the size's);
    ``encoder_overrides``: ``Eva`` arguments for tiny test models."""

    patch = PATCH
    # The rotary embedding's periods go with the embedding stage: its forward makes the embedding
    # there, and each later stage is handed it.
    embedding_modules = ("patch_embed", "pos_drop", "rope", "norm_pre")

    def __init__(self, encoder: str = "vit_small_patch16_dinov3", num_classes: int = 21, *,
                 in_channels: int = 3, depth: int | None = None, layers: Sequence[int] | None = None,
                 features: int | None = None, out_channels: Sequence[int] | None = None,
                 drop_path_rate: float = 0.0, input_name: str = "the input",
                 encoder_overrides: Mapping[str, Any] | None = None) -> None:
        vit = create_encoder(encoder, depth=depth, drop_path_rate=drop_path_rate, in_channels=in_channels,
                             overrides=encoder_overrides)
        super().__init__(vit, encoder_size(encoder), num_classes, layers=layers,
                         default_layers=default_layers(encoder, len(vit.blocks)), features=features,
                         out_channels=out_channels, input_name=input_name)
        self.encoder_name = encoder

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[int, int]]:
        """The tokens (no position embedding) and the rotary embedding at ``x``'s grid, which every
        block takes."""
        tokens, rope, grid = embed(self.encoder, x)
        return tokens, {"rope": rope}, grid
