"""The DeepLab rows' sections (``model.generator`` with arch deeplabv3, deeplabv3plus,
deeplabv3plus_unimatch or deeplabv2): the keys the four share, each checked against its arch's
limits (``DeepLabLimits``).

torch-free: the arch table (segadv/models/registry.py) holds the rows, the builder is
this folder's ``model.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from segadv.config.generator_section import GeneratorConfig, arch_field

ENCODER_STAGES = 5  # smp's encoders: 5 stride-2 stages (depth limits 1..5)


@dataclass(frozen=True)
class DeepLabLimits:
    """What an architecture's decoder takes from its encoder: the least ``encoder_depth`` (smp's
    encoders have 5 stages), the number of ASPP dilations and the encoder layouts it builds."""

    min_encoder_depth: int
    atrous_rates: int | None  # None: decoder_atrous_rates does not apply
    layouts: tuple[str, ...] = ("smp",)


class DeepLabConfig(GeneratorConfig):
    """A DeepLab G on an smp encoder: the keys its three archs share."""

    limits: ClassVar[DeepLabLimits]
    divisible_input: ClassVar[bool] = True  # smp's models check their input's sides against the encoder's stride

    encoder: str = Field("resnet18", min_length=1, description="smp encoder name, e.g. resnet18, resnet101, mobilenet_v2")
    encoder_depth: int = Field(
        5, ge=1, le=ENCODER_STAGES,
        description="encoder stages used (1..5; deeplabv3plus needs 3 or more); fewer: a smaller, coarser G")
    output_stride: Literal[8, 16] = Field(16, description="the encoder's output stride (dilated last stages): 8 or 16")
    layout: Literal["smp", "caffe"] = Field(
        "smp",
        description="the ResNet encoder's layout. smp: torchvision's (stride in a Bottleneck's 3x3 conv), what smp's "
                    "ImageNet weights fit. caffe (deeplabv2 only): the references' Res_Deeplab / DeeplabMulti (stride "
                    "in the 1x1 conv, max-pool ceil_mode; 41x41 logits at 321 px), what their weights fit")
    # (12, 24, 36) suit ~512 px crops; on small images the feature map is only a few cells wide
    # and large rates sample mostly padding.
    decoder_atrous_rates: list[Annotated[int, Field(ge=1, le=256)]] = Field(
        [12, 24, 36],
        description="deeplabv3/deeplabv3plus(_unimatch): ASPP dilation rates, three positive integers (feature-map "
                    "cells)")
    decoder_channels: int = Field(
        256, gt=0, le=1024,
        description="deeplabv3/deeplabv3plus(_unimatch): width of the decoder (ASPP and DeepLabV3+'s fusion); smp's "
                    "and UniMatch's default 256")
    aspp_v2_rates: Union[Literal["paper", "early_return"], list[Annotated[int, Field(ge=1, le=256)]]] = Field(
        "paper", min_length=1,
        description="deeplabv2: its classifier's dilation rates, one 3x3 convolution to the classes per rate, "
                    "the outputs summed. paper: 6, 12, 18, 24 (DeepLab-v2's ASPP-L; ADVENT's code). "
                    "early_return: 6, 12, what AdaptSegNet's, AdvSemiSeg's and s4GAN's code "
                    "computes (its loop returns after the second branch). Or a list of rates")

    def summary(self) -> dict[str, Any]:
        return {"arch": self.arch, "encoder": self.encoder, "output_stride": self.output_stride}

    @property
    def encoder_stride(self) -> int:
        """The encoder's last map's stride: 2 per stage up to ``output_stride`` (dilated beyond) or
        ``encoder_depth`` stages (smp's ``encoder.output_stride``)."""
        return min(2 ** self.encoder_depth, self.output_stride)

    @property
    def input_divisor(self) -> int:
        """smp's DeepLabV3 and V3+ take sides divisible by the encoder's stride (their forward's
        ``check_input_shape``); DeepLab-v2 any size."""
        return self.encoder_stride if self.divisible_input else 1

    @property
    def input_requirement(self) -> str:
        return (f"the encoder's stride {self.input_divisor}, which smp's {self.arch} needs (model.generator.arch="
                f"{self.arch}, encoder_depth={self.encoder_depth}, output_stride={self.output_stride})")

    def deepest_map(self, height: int, width: int) -> tuple[int, int]:
        """The encoder's last map: each stride-2 step halves a side rounding up (smp's padded
        convolutions), up to :attr:`encoder_stride`; the caffe layout's max-pool rounds up from one
        pixel less (``ceil_mode``, no padding)."""
        stride = self.encoder_stride

        def side(n: int) -> int:
            if self.layout != "caffe":
                return -(-n // stride)
            n = -(-n // 2)  # conv1
            if stride >= 4:
                n = -(-(n - 1) // 2) + 1  # the max-pool, ceil_mode
            for _ in range(stride.bit_length() - 3):  # the stages after it that stride
                n = -(-n // 2)
            return n

        return side(height), side(width)

    @field_validator("aspp_v2_rates", mode="wrap")
    @classmethod
    def _rates_named_or_listed(cls, value: Any, handler: Any) -> Any:
        """One message for the union (a name or a list), not one per member."""
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(
                "aspp_v2_rates", "expected 'paper', 'early_return' or a non-empty list of rates (integers >= 1)"
            ) from None

    @field_validator("encoder_depth")
    @classmethod
    def _depth_fits_arch(cls, depth: int, info: ValidationInfo) -> int:
        least = cls.limits.min_encoder_depth
        if depth < least:
            raise ValueError(f"{info.data.get('arch')} needs an encoder depth of {least}..{ENCODER_STAGES}, got {depth}")
        return depth

    @field_validator("layout")
    @classmethod
    def _layout_fits_arch(cls, layout: str, info: ValidationInfo) -> str:
        layouts = cls.limits.layouts
        if layout not in layouts:
            raise ValueError(f"{info.data.get('arch')} builds its encoder in layout {' or '.join(layouts)}, not "
                             f"{layout} (the caffe layout is the references' DeepLab-v2: arch deeplabv2)")
        return layout

    @field_validator("decoder_atrous_rates")
    @classmethod
    def _rates_fit_arch(cls, rates: list[int], info: ValidationInfo) -> list[int]:
        count = cls.limits.atrous_rates
        if count is not None and len(rates) != count:
            raise ValueError(f"{info.data.get('arch')}'s ASPP takes {count} dilation rates, e.g. [12, 24, 36]; "
                             f"got {len(rates)}")
        return rates


class DeepLabV3Config(DeepLabConfig):
    arch: str = arch_field("deeplabv3")
    limits: ClassVar[DeepLabLimits] = DeepLabLimits(min_encoder_depth=1, atrous_rates=3)


class DeepLabV3PlusConfig(DeepLabConfig):
    arch: str = arch_field("deeplabv3plus")
    limits: ClassVar[DeepLabLimits] = DeepLabLimits(min_encoder_depth=3, atrous_rates=3)  # fuses the stride-4 stage


class DeepLabV3PlusUniMatchConfig(DeepLabConfig):
    """UniMatch's DeepLabV3+ head (segadv/models/deeplab/unimatch.py): plain ASPP without dropout, two
    3x3 fuse convolutions, maps resized to fit (any input size)."""

    arch: str = arch_field("deeplabv3plus_unimatch")
    limits: ClassVar[DeepLabLimits] = DeepLabLimits(min_encoder_depth=3, atrous_rates=3)  # fuses the stride-4 stage
    divisible_input: ClassVar[bool] = False

    @field_validator("aux_head")
    @classmethod
    def _no_aux_head(cls, value: bool) -> bool:
        if value:
            raise ValueError("deeplabv3plus_unimatch has no aux output (multi-level adaptation: deeplabv2, deeplabv3 "
                             "or deeplabv3plus)")
        return value


class DeepLabV2Config(DeepLabConfig):
    arch: str = arch_field("deeplabv2")
    # its own rates (aspp_v2_rates); the references' Caffe layout: any input size, their weights
    limits: ClassVar[DeepLabLimits] = DeepLabLimits(min_encoder_depth=1, atrous_rates=None, layouts=("smp", "caffe"))
    pools_the_image: ClassVar[bool] = False  # a classifier of dilated convolutions, no image pooling
    divisible_input: ClassVar[bool] = False  # any size (segadv/models/deeplab/deeplabv2.py)


# smp init kwarg -> the config key that sets it (an smp save_pretrained directory's config.json);
# smp's defaults hold for every other kwarg.
SMP_CONFIG_KEYS = {
    "encoder_name": "model.generator.encoder",
    "encoder_depth": "model.generator.encoder_depth",
    "encoder_output_stride": "model.generator.output_stride",
    "decoder_channels": "model.generator.decoder_channels",
    "decoder_atrous_rates": "model.generator.decoder_atrous_rates",
    "classes": "data.num_classes",
}
