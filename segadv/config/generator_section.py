"""``model.generator``: the keys every generator architecture takes, and the choice of the
architecture's own section by ``arch``.

Each arch is a row of the arch table (``segadv/models/registry.py``) holding its section, a subclass
of :class:`GeneratorConfig` with its own keys and limits. A ``model.generator`` mapping is validated
as the section of the row its ``arch`` names (the table's default where it names none), so the keys
of one arch mean nothing to another; ``GeneratorConfig(**keys)`` builds that row's section too.
The table imports this module (each row's section is a ``GeneratorConfig``), so this module finds
the table by its module name when it first validates a section, as the method section finds the
method registry; both are registered sections (segadv/config/registered.py).
"""

from __future__ import annotations

import copy
import importlib
from typing import Any, ClassVar, Literal, Mapping, Optional

from pydantic import Field, field_validator, model_validator

from segadv.config.registered import RegisteredSection, generated
from segadv.config.section import Section, registered_choice
from segadv.errors import UserError

ARCH_TABLE = "segadv.models.registry"
DEFAULT_ARCH = "deeplabv3plus"
ARCH_DESCRIPTION = (
    "G's network on the encoder: smp's DeepLabV3, or DeepLabV3+ with its low-level skip (an "
    "ASPP decoder with image pooling), or deeplabv3plus_unimatch: UniMatch's DeepLabV3+ head (plain ASPP, no "
    "dropout, two 3x3 fuse convolutions, any input size), or DeepLab-v2 as the adversarial references train it (a classifier "
    "summing dilated 3x3 convolutions, model.generator.aspp_v2_rates; no decoder, no pooling), or dinov2: a "
    "DINOv2 ViT with UniMatch V2's DPT head, or dinov3: a DINOv3 ViT (RoPE, patch 16) with that head; a row of the "
    "arch table (segadv/models/registry.py)")


def arch_field(name: str) -> Any:
    """The ``arch`` field of the section of row ``name`` (its default is its own name)."""
    return Field(name, description=ARCH_DESCRIPTION)


def registered_archs() -> dict[str, Any]:
    """``model.generator.arch`` -> its row (``segadv.models.registry.ARCHS``)."""
    return importlib.import_module(ARCH_TABLE).ARCHS


class GeneratorConfig(RegisteredSection):
    """G, the segmentation network: ``arch`` picks its row, whose section holds the arch's own keys."""

    arch: str = arch_field(DEFAULT_ARCH)
    encoder_weights: Optional[str] = Field(
        None, min_length=1,
        description="encoder weights: null random init; a name (imagenet) fetched by smp (a download); "
        "a local file path loaded strictly")
    aux_head: bool = Field(
        False,
        description="training only: a second output from the encoder's second-to-last stage (AdaptSegNet / "
        "ADVENT multi-level adaptation); eval, export and predict use the main output")
    activation_checkpointing: bool = Field(
        False,
        description="training only: recompute G's encoder stages and decoder in the backward (less memory, "
        "about one more forward of time); weights and files unchanged")
    freeze_encoder: bool = Field(
        False,
        description="G's encoder (its arch's backbone) fixed: no gradients, no optimizer state, its BatchNorm "
                    "in eval mode (running statistics fixed); the head and D train. Checkpoints keep every key")
    norm: Literal["train", "frozen_affine", "frozen"] = Field(
        "train",
        description="G's BatchNorm. train: learned weight and bias, batch statistics. frozen_affine: weight "
                    "and bias fixed (not in the optimizer), batch statistics, running ones updated (the "
                    "references' DeepLab-v2). frozen: weight, bias and statistics fixed, every BatchNorm in "
                    "eval mode while G trains (mmsegmentation's norm_eval); a batch of one trains")

    # Whether a BatchNorm on batch statistics sees one value per channel at a batch of one (an
    # image-pooling branch, as smp's ASPP has): then a batch of one cannot train G.
    pools_the_image: ClassVar[bool] = True

    @classmethod
    def validated_as(cls, data: Mapping[str, Any]) -> type[GeneratorConfig] | None:
        # The section of the row its arch names; an unknown arch gets the default row's section,
        # whose arch check names the archs.
        return section_of(data.get("arch", DEFAULT_ARCH)) if cls is GeneratorConfig else None

    @field_validator("arch")
    @classmethod
    def _registered_arch(cls, name: str) -> str:
        archs = registered_archs()
        registered_choice(name, archs)
        if cls is not GeneratorConfig and archs[name].settings is not cls:
            raise ValueError(f"{name} is not the arch of this section ({cls.__name__})")
        return name

    @model_validator(mode="after")
    def _encoder_to_freeze(self) -> GeneratorConfig:
        if self.freeze_encoder and registered_archs()[self.arch].backbone is None:
            raise ValueError(f"freeze_encoder: arch {self.arch} names no encoder (its row's backbone) to freeze")
        return self

    @property
    def trains_batch_statistics(self) -> bool:
        """Whether G's BatchNorm layers normalise with each batch's own statistics in training:
        all but ``norm: frozen`` (eval-mode BatchNorm, its running statistics)."""
        return self.norm != "frozen"

    @property
    def trains_on_one_sample(self) -> bool:
        """Whether a batch of one sample trains G (where not, segadv/training/checks.py and
        segadv/data/batch_checks.py refuse one before step 1). Not where a BatchNorm on batch
        statistics sees one value per channel: the image-pooling branch of smp's DeepLabV3 / V3+
        ASPP (a 1x1 map). DeepLab-v2 has no pooling: at batch 1 its BatchNorm normalises over each
        map's pixels, as the references train it (AdaptSegNet, ADVENT: batch 1, statistics updating)."""
        return not self.trains_batch_statistics or not self.pools_the_image

    @property
    def input_divisor(self) -> int:
        """G takes inputs whose sides are multiples of this (1: any size)."""
        return 1

    @property
    def input_requirement(self) -> str:
        """What :attr:`input_divisor` is, with the keys that set it, for a message."""
        return f"{self.input_divisor} (model.generator.arch={self.arch})"

    def check_input_size(self, height: int, width: int, source: str, fix: Optional[str] = None) -> None:
        """A UserError naming ``source`` (where the size comes from: a config key, a split's
        images) where G cannot take an input of ``height`` x ``width``: a side that is not a
        multiple of :attr:`input_divisor`. ``fix``: what to change (default: the size rounded down
        to a multiple). Checked at start for every input size G is given (segadv/training/checks.py
        ``check_build`` and ``check_image_inputs``)."""
        divisor = self.input_divisor
        if height % divisor == 0 and width % divisor == 0:
            return
        if fix is None:
            fix = f"use e.g. {height - height % divisor or divisor}x{width - width % divisor or divisor}"
        raise UserError(f"{source}: {height}x{width} is not a multiple of {self.input_requirement}; {fix}")

    def deepest_map(self, height: int, width: int) -> Optional[tuple[int, int]]:
        """The height and width of G's deepest feature map at an input of ``height`` x ``width``,
        where the config alone says (None: it does not). A 1x1 map at a batch of one leaves a
        BatchNorm on batch statistics one value per channel (segadv/training/checks.py)."""
        return None

    def summary(self) -> dict[str, Any]:
        """What an exported model's metadata says of G (``segadv/export/wrapper.py``'s sidecar)."""
        return {"arch": self.arch}

    @classmethod
    def carried_over(cls, below: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
        """A layer naming another arch keeps of the lower layers' keys those the two archs' sections
        declare in common (their nearest shared section): a switch between DeepLab rows keeps the
        base's encoder and decoder geometry, a switch from a DeepLab to a ViT row keeps only the keys
        every arch takes, so no key follows into an arch where it means something else."""
        old = below.get("arch", DEFAULT_ARCH)
        if "arch" not in layer or layer["arch"] == old:
            return dict(below)
        shared = shared_section(old, layer["arch"])
        return {key: value for key, value in below.items() if key in shared.model_fields and key != "arch"}

    @classmethod
    def schema_model(cls) -> type[Section]:
        if cls is not GeneratorConfig:
            return cls
        sections = tuple((name, row.settings) for name, row in registered_archs().items())
        return generated(GeneratorKeys, sections, lambda: _every_arch_key(sections))


def section_of(arch: Any) -> type[GeneratorConfig]:
    """The section of row ``arch``, or the default row's for a name the table lacks (or a value
    that is no name, whose arch check then names the archs)."""
    archs = registered_archs()
    row = archs.get(arch) if isinstance(arch, str) else None
    return (row or archs[DEFAULT_ARCH]).settings


def shared_section(first: Any, second: Any) -> type[GeneratorConfig]:
    """The nearest section both archs' sections derive from (``GeneratorConfig`` where they share
    no other, or where either is not an arch's name)."""
    archs = registered_archs()
    rows = [archs.get(arch) if isinstance(arch, str) else None for arch in (first, second)]
    if None in rows:
        return GeneratorConfig
    one, two = (row.settings for row in rows)
    return next(c for c in two.__mro__ if issubclass(one, c))


class GeneratorKeys(RegisteredSection):
    """Every arch's keys in one section: ``arch`` as the choice of rows, and each key an arch of its
    own takes, named so (the key listing of ``--help-config``, the loader's suggestions)."""


def _every_arch_key(sections: tuple[tuple[str, type[GeneratorConfig]], ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    fields: dict[str, Any] = {"arch": (Literal[tuple(name for name, _ in sections)], arch_field(DEFAULT_ARCH))}
    for name, model in sections:
        for key, field in model.model_fields.items():
            if key in fields:
                continue
            takers = [other for other, section in sections if key in section.model_fields]
            if len(takers) < len(sections):
                field = copy.copy(field)
                field.description = f"(arch {', '.join(takers)}) {field.description or ''}".strip()
            fields[key] = (field.annotation, field)
    return fields, {}
