"""The DINOv3 row's section (``model.generator`` with ``arch: dinov3``): a timm DINOv3 ViT encoder
with the DPT head of segadv/models/dinov2. torch-free: the arch table (segadv/models/registry.py)
holds the row.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Optional

from pydantic import Field, field_validator

from segadv.config.generator_section import GeneratorConfig, arch_field
from segadv.models.dinov2.config import no_aux_head, no_batchnorm, shallow_to_deep

PATCH = 16  # DINOv3's patch: an input side must be a multiple of it
# timm's names; _qkvb: the variant with query and value biases (the official files that hold
# non-zero ones load into it)
SIZES = ("small", "small_plus", "base", "large", "huge_plus", "7b")
DINOV3_ENCODERS = tuple(f"vit_{size}_patch16_dinov3{qkvb}" for size in SIZES
                        for qkvb in ("", "_qkvb") if not (size == "7b" and qkvb))
Width = Annotated[int, Field(ge=1, le=4096)]


class DinoV3Config(GeneratorConfig):
    """A DINOv3 encoder (timm's ``vit_*_patch16_dinov3[_qkvb]``) and a DPT head on four of its
    blocks. No BatchNorm and no aux output; the input's sides must be multiples of the patch (16)."""

    arch: str = arch_field("dinov3")
    encoder: Literal[DINOV3_ENCODERS] = Field(  # type: ignore[valid-type]
        "vit_small_patch16_dinov3",
        description="dinov3: timm's DINOv3 encoder (small / small_plus / base / large / huge_plus / 7b; _qkvb with "
                    "query and value biases); encoder_weights: a local file in timm's or Meta's key layout")
    depth: Optional[int] = Field(
        None, ge=1, le=40, description="dinov3: encoder blocks built (null: the size's own; fewer: a depth-reduced "
                                       "encoder for tests and the CPU; its weights then do not fit)")
    layers: Optional[list[Annotated[int, Field(ge=0, le=39)]]] = Field(
        None, min_length=4, max_length=4,
        description="dinov3: the four blocks the DPT head reads, the last the encoder's last (null: Meta's "
                    "FOUR_EVEN_INTERVALS, e.g. 2, 5, 8, 11 at 12 blocks, 4, 11, 17, 23 at 24; evenly spaced at a "
                    "reduced depth)")
    head_features: Optional[Width] = Field(
        None, description="dinov3: the DPT head's fusion width (null: UniMatch V2's for the width, 64 / 128 / 256 "
                          "for S / B / L)")
    head_out_channels: Optional[list[Width]] = Field(
        None, min_length=4, max_length=4,
        description="dinov3: the DPT head's four projection widths (null: the size's)")
    drop_path_rate: float = Field(0.0, ge=0.0, lt=1.0, description="dinov3: stochastic depth of the encoder's blocks")

    pools_the_image: ClassVar[bool] = False  # LayerNorm and the head's convolutions: a batch of one trains

    @field_validator("aux_head")
    @classmethod
    def _no_aux_head(cls, value: bool) -> bool:
        return no_aux_head(value, "dinov3")

    @field_validator("layers")
    @classmethod
    def _shallow_to_deep(cls, layers: Optional[list[int]]) -> Optional[list[int]]:
        return shallow_to_deep(layers)

    @field_validator("norm")
    @classmethod
    def _no_batchnorm(cls, value: str) -> str:
        return no_batchnorm(value, "dinov3")

    @property
    def input_divisor(self) -> int:
        """The encoder cuts the input into 16-pixel patches: both sides must be multiples."""
        return PATCH

    @property
    def input_requirement(self) -> str:
        return f"DINOv3's patch size {PATCH} (model.generator.arch=dinov3)"

    def summary(self) -> dict[str, object]:
        return {"arch": self.arch, "encoder": self.encoder}
