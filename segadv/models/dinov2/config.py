"""The DINOv2 row's section (``model.generator`` with ``arch: dinov2``): a timm DINOv2 ViT encoder
with UniMatch V2's DPT head (segadv/models/dinov2). Its keys mean nothing to the DeepLab rows and
theirs nothing to it. torch-free: the arch table (segadv/models/registry.py) holds the row.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Optional

from pydantic import Field, field_validator

from segadv.config.generator_section import GeneratorConfig, arch_field

PATCH = 14  # DINOv2's patch: an input side must be a multiple of it
SIZES = ("small", "base", "large", "giant")
DINOV2_ENCODERS = tuple(f"vit_{size}_patch14{reg}_dinov2" for size in SIZES for reg in ("", "_reg4"))
Width = Annotated[int, Field(ge=1, le=4096)]


def no_aux_head(value: bool, arch: str) -> bool:
    """A ViT arch's ``aux_head`` check (dinov2, dinov3): it has no aux output."""
    if value:
        raise ValueError(f"{arch} has no aux output (multi-level adaptation needs a DeepLab arch)")
    return value


def shallow_to_deep(layers: Optional[list[int]]) -> Optional[list[int]]:
    """A DPT arch's ``layers`` check: the head fuses its four maps coarse to fine as they come
    (segadv/models/dinov2/dpt.py); read in another order, a deep block would take a shallow one's
    branch and train as it."""
    if layers is not None and any(later < earlier for earlier, later in zip(layers, layers[1:])):
        raise ValueError(f"{layers} is not in order: the head reads its four blocks shallow to deep, each index "
                         f"at least the one before, e.g. {sorted(layers)}")
    return layers


def no_batchnorm(value: str, arch: str) -> str:
    """A ViT arch's ``norm`` check: it has no BatchNorm to freeze."""
    if value != "train":
        raise ValueError(f"{arch} has no BatchNorm to freeze (its LayerNorms always train)")
    return value


class DinoV2Config(GeneratorConfig):
    """A DINOv2 encoder (timm's ``vit_*_patch14[_reg4]_dinov2``) and a DPT head on four of its
    blocks. No BatchNorm and no aux output; the input's sides must be multiples of the patch (14)."""

    arch: str = arch_field("dinov2")
    encoder: Literal[DINOV2_ENCODERS] = Field(  # type: ignore[valid-type]
        "vit_small_patch14_dinov2",
        description="dinov2: timm's DINOv2 encoder (small / base / large / giant, _reg4_ with 4 register tokens); "
                    "encoder_weights: a local file in timm's or the official DINOv2 key layout")
    depth: Optional[int] = Field(
        None, ge=1, le=40, description="dinov2: encoder blocks built (null: the size's own 12, 24 or 40; fewer: a "
                                       "depth-reduced encoder for tests and the CPU; its weights then do not fit)")
    layers: Optional[list[Annotated[int, Field(ge=0, le=39)]]] = Field(
        None, min_length=4, max_length=4,
        description="dinov2: the four blocks the DPT head reads, the last the encoder's last (null: UniMatch V2's "
                    "2, 5, 8, 11 for small and base, 4, 11, 17, 23 for large, 9, 19, 29, 39 for giant; evenly spaced "
                    "at a reduced depth)")
    attention: Literal["fused", "math"] = Field(
        "fused", description="dinov2: the attention kernel. fused: torch's scaled_dot_product_attention (flash or "
                             "memory-efficient kernels where the device has them); math: softmax(QK^T)V spelled out")
    head_features: Optional[Width] = Field(
        None, description="dinov2: the DPT head's fusion width (null: UniMatch V2's 64 / 128 / 256 / 384 for "
                          "S / B / L / g)")
    head_out_channels: Optional[list[Width]] = Field(
        None, min_length=4, max_length=4,
        description="dinov2: the DPT head's four projection widths (null: UniMatch V2's for the size)")
    drop_path_rate: float = Field(0.0, ge=0.0, lt=1.0, description="dinov2: stochastic depth of the encoder's "
                                                                   "blocks (UniMatch V2: 0)")
    img_size: int = Field(
        518, ge=PATCH, le=4096, multiple_of=PATCH,
        description="dinov2: the grid of the position embedding (518 px: DINOv2's weights); other input sizes "
                    "resample it in the forward")

    pools_the_image: ClassVar[bool] = False  # LayerNorm and the head's convolutions: a batch of one trains

    @field_validator("aux_head")
    @classmethod
    def _no_aux_head(cls, value: bool) -> bool:
        return no_aux_head(value, "dinov2")

    @field_validator("layers")
    @classmethod
    def _shallow_to_deep(cls, layers: Optional[list[int]]) -> Optional[list[int]]:
        return shallow_to_deep(layers)

    @field_validator("norm")
    @classmethod
    def _no_batchnorm(cls, value: str) -> str:
        return no_batchnorm(value, "dinov2")

    @property
    def input_divisor(self) -> int:
        """The encoder cuts the input into 14-pixel patches: both sides must be multiples."""
        return PATCH

    @property
    def input_requirement(self) -> str:
        return f"DINOv2's patch size {PATCH} (model.generator.arch=dinov2)"

    def summary(self) -> dict[str, object]:
        return {"arch": self.arch, "encoder": self.encoder}
