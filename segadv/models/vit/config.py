"""The section every ViT arch's ``model.generator`` extends (segadv/models/dinov2/config.py,
segadv/models/dinov3/config.py): the checks of the keys every arch takes that a ViT with a DPT head
decides (no aux output, no BatchNorm, its blocks read shallow to deep) and the input rule of its
patch. An arch's section declares its own keys (their descriptions name it) and its patch.
torch-free, as the arch table that holds the rows."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Optional

from pydantic import Field, field_validator

from segadv.config.generator_section import GeneratorConfig

Width = Annotated[int, Field(ge=1, le=4096)]  # a DPT head's width
Layers = Optional[list[Annotated[int, Field(ge=0, le=39)]]]


# The fields of the keys every ViT arch declares, each described for ``arch`` with its own defaults
# (a field of its own: the key's description names the arch, as --help-config lists it).

def depth_field(arch: str, null: str) -> Any:
    return Field(None, ge=1, le=40, description=f"{arch}: encoder blocks built (null: {null}; fewer: a depth-reduced "
                                                "encoder for tests and the CPU; its weights then do not fit)")


def layers_field(arch: str, null: str) -> Any:
    return Field(None, min_length=4, max_length=4,
                 description=f"{arch}: the four blocks the DPT head reads, the last the encoder's last (null: {null}; "
                             "evenly spaced at a reduced depth)")


def head_features_field(arch: str, null: str) -> Any:
    return Field(None, description=f"{arch}: the DPT head's fusion width (null: {null})")


def head_out_channels_field(arch: str, null: str) -> Any:
    return Field(None, min_length=4, max_length=4, description=f"{arch}: the DPT head's four projection widths "
                                                               f"(null: {null})")


def drop_path_field(arch: str, reference: str = "") -> Any:
    return Field(0.0, ge=0.0, lt=1.0, description=f"{arch}: stochastic depth of the encoder's blocks{reference}")


class ViTDPTConfig(GeneratorConfig):
    """A ViT encoder and a DPT head on four of its blocks. No BatchNorm and no aux output; the
    input's sides must be multiples of the patch. A subclass sets ``patch`` and ``family`` (the
    name its messages give it, ``DINOv2``) and declares ``layers``."""

    patch: ClassVar[int]
    family: ClassVar[str]
    pools_the_image: ClassVar[bool] = False  # LayerNorm and the head's convolutions: a batch of one trains

    @classmethod
    def arch_name(cls) -> str:
        return cls.model_fields["arch"].default

    @field_validator("aux_head")
    @classmethod
    def _no_aux_head(cls, value: bool) -> bool:
        if value:
            raise ValueError(f"{cls.arch_name()} has no aux output (multi-level adaptation needs a DeepLab arch)")
        return value

    # check_fields=False: the field is each arch's own, declared with its description
    @field_validator("layers", check_fields=False)
    @classmethod
    def _shallow_to_deep(cls, layers: Optional[list[int]]) -> Optional[list[int]]:
        """The head fuses its four maps coarse to fine as they come (segadv/models/vit/head.py); read
        in another order, a deep block would take a shallow one's branch and train as it."""
        if layers is not None and any(later < earlier for earlier, later in zip(layers, layers[1:])):
            raise ValueError(f"{layers} is not in order: the head reads its four blocks shallow to deep, each index "
                             f"at least the one before, e.g. {sorted(layers)}")
        return layers

    @field_validator("norm")
    @classmethod
    def _no_batchnorm(cls, value: str) -> str:
        if value != "train":
            raise ValueError(f"{cls.arch_name()} has no BatchNorm to freeze (its LayerNorms always train)")
        return value

    @property
    def input_divisor(self) -> int:
        """The encoder cuts the input into patches: both sides must be multiples of the patch."""
        return self.patch

    @property
    def input_requirement(self) -> str:
        return f"{self.family}'s patch size {self.patch} (model.generator.arch={self.arch})"

    def summary(self) -> dict[str, object]:
        return {"arch": self.arch, "encoder": self.encoder}  # type: ignore[attr-defined]
