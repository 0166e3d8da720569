"""The DINOv3 row's section (``model.generator`` with ``arch: dinov3``): a timm DINOv3 ViT encoder
with the DPT head of segadv/models/vit. torch-free: the arch table (segadv/models/registry.py)
holds the row.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import Field

from segadv.config.generator_section import arch_field
from segadv.models.vit.config import (Layers, ViTDPTConfig, Width, depth_field, drop_path_field, head_features_field,
                                      head_out_channels_field, layers_field)

PATCH = 16  # DINOv3's patch: an input side must be a multiple of it
# timm's names; _qkvb: the variant with query and value biases (the official files that hold
# non-zero ones load into it)
SIZES = ("small", "small_plus", "base", "large", "huge_plus", "7b")
DINOV3_ENCODERS = tuple(f"vit_{size}_patch16_dinov3{qkvb}" for size in SIZES
                        for qkvb in ("", "_qkvb") if not (size == "7b" and qkvb))


class DinoV3Config(ViTDPTConfig):
    """A DINOv3 encoder (timm's ``vit_*_patch16_dinov3[_qkvb]``) and a DPT head on four of its
    blocks. No BatchNorm and no aux output; the input's sides must be multiples of the patch (16)."""

    arch: str = arch_field("dinov3")
    encoder: Literal[DINOV3_ENCODERS] = Field(  # type: ignore[valid-type]
        "vit_small_patch16_dinov3",
        description="dinov3: timm's DINOv3 encoder (small / small_plus / base / large / huge_plus / 7b; _qkvb with "
                    "query and value biases); encoder_weights: a local file in timm's or Meta's key layout")
    depth: Optional[int] = depth_field("dinov3", "the size's own")
    layers: Layers = layers_field("dinov3", "Meta's FOUR_EVEN_INTERVALS, e.g. 2, 5, 8, 11 at 12 blocks, 4, 11, 17, 23 "
                                            "at 24")
    head_features: Optional[Width] = head_features_field("dinov3", "UniMatch V2's for the width, 64 / 128 / 256 for "
                                                                   "S / B / L")
    head_out_channels: Optional[list[Width]] = head_out_channels_field("dinov3", "the size's")
    drop_path_rate: float = drop_path_field("dinov3")

    patch: ClassVar[int] = PATCH
    family: ClassVar[str] = "DINOv3"
