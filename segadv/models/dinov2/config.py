"""The DINOv2 row's section (``model.generator`` with ``arch: dinov2``): a timm DINOv2 ViT encoder
with UniMatch V2's DPT head (segadv/models/dinov2). Its keys mean nothing to the DeepLab rows and
theirs nothing to it. torch-free: the arch table (segadv/models/registry.py) holds the row.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import Field

from segadv.config.generator_section import arch_field
from segadv.models.vit.config import (Layers, ViTDPTConfig, Width, depth_field, drop_path_field, head_features_field,
                                      head_out_channels_field, layers_field)

PATCH = 14  # DINOv2's patch: an input side must be a multiple of it
SIZES = ("small", "base", "large", "giant")
DINOV2_ENCODERS = tuple(f"vit_{size}_patch14{reg}_dinov2" for size in SIZES for reg in ("", "_reg4"))


class DinoV2Config(ViTDPTConfig):
    """A DINOv2 encoder (timm's ``vit_*_patch14[_reg4]_dinov2``) and a DPT head on four of its
    blocks. No BatchNorm and no aux output; the input's sides must be multiples of the patch (14)."""

    arch: str = arch_field("dinov2")
    encoder: Literal[DINOV2_ENCODERS] = Field(  # type: ignore[valid-type]
        "vit_small_patch14_dinov2",
        description="dinov2: timm's DINOv2 encoder (small / base / large / giant, _reg4_ with 4 register tokens); "
                    "encoder_weights: a local file in timm's or the official DINOv2 key layout")
    depth: Optional[int] = depth_field("dinov2", "the size's own 12, 24 or 40")
    layers: Layers = layers_field("dinov2", "UniMatch V2's 2, 5, 8, 11 for small and base, 4, 11, 17, 23 for large, "
                                            "9, 19, 29, 39 for giant")
    attention: Literal["fused", "math"] = Field(
        "fused", description="dinov2: the attention kernel. fused: torch's scaled_dot_product_attention (flash or "
                             "memory-efficient kernels where the device has them); math: softmax(QK^T)V spelled out")
    head_features: Optional[Width] = head_features_field("dinov2", "UniMatch V2's 64 / 128 / 256 / 384 for "
                                                                   "S / B / L / g")
    head_out_channels: Optional[list[Width]] = head_out_channels_field("dinov2", "UniMatch V2's for the size")
    drop_path_rate: float = drop_path_field("dinov2", " (UniMatch V2: 0)")
    img_size: int = Field(
        518, ge=PATCH, le=4096, multiple_of=PATCH,
        description="dinov2: the grid of the position embedding (518 px: DINOv2's weights); other input sizes "
                    "resample it in the forward")

    patch: ClassVar[int] = PATCH
    family: ClassVar[str] = "DINOv2"
