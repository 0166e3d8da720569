"""The typed experiment config: every key, its type, its default, its range and one line of meaning.

Defaults follow AdvSemiSeg (Hung et al., 2018) where it has an opinion; ``configs/default.yaml``
(the embedded demo) overrides what a CPU-sized demo needs. Unknown keys are rejected
(``extra="forbid"``) and types are checked strictly, so a typo never silently does nothing.

Every value is range-checked here, so torch and smp never see one they would fail on: floats are
finite (``allow_inf_nan=False`` for the whole schema), counts and sizes have bounds, lists their
lengths; what needs two keys (an encoder depth against the architecture) is a validator naming
the key. What needs the data (D's depth against the smallest training image, batches of one) is
checked before the first step (segadv/training/build.py, segadv/data/batch_checks.py). Every field carries a
one-line ``description`` (tests/config/test_schema.py insists), the line a key listing shows;
tests/config/test_schema_bounds.py tries every numeric and list field at its boundaries.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from segadv.config.normalization import NORMALIZATIONS, Normalization, resolve as resolve_normalization


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)

    @classmethod
    def schema_model(cls) -> type[Section]:
        """The model whose fields a config's section has: this one, except where they depend on
        what is registered (``MethodConfig``)."""
        return cls


# Reusable ranges. Seeds feed numpy (below 2**32) after the rank is added, hence 2**31.
Seed = Annotated[int, Field(ge=0, lt=2**31)]
Count = Annotated[int, Field(gt=0, le=10**9)]  # steps, intervals: positive and far from int64's edge
Weight = Annotated[float, Field(ge=0, le=1e6)]  # a loss term's weight (0: off)
Probability = Annotated[float, Field(ge=0, le=1)]
Beta = Annotated[float, Field(ge=0, lt=1)]


@dataclass(frozen=True)
class ArchLimits:
    """What an architecture's decoder takes from its encoder: the least ``encoder_depth`` (smp's
    encoders have 5 stages), the number of ASPP dilations and the encoder layouts it builds."""

    min_encoder_depth: int
    atrous_rates: Optional[int]  # None: decoder_atrous_rates does not apply
    layouts: tuple[str, ...] = ("smp",)


ARCH_LIMITS: dict[str, ArchLimits] = {
    "deeplabv3": ArchLimits(min_encoder_depth=1, atrous_rates=3),
    "deeplabv3plus": ArchLimits(min_encoder_depth=3, atrous_rates=3),  # fuses the stride-4 stage
    # its own rates (aspp_v2_rates); the references' Caffe layout: any input size, their weights
    "deeplabv2": ArchLimits(min_encoder_depth=1, atrous_rates=None, layouts=("smp", "caffe")),
}
ENCODER_STAGES = 5  # smp's encoders: 5 stride-2 stages (depth limits 1..5)


class GeneratorConfig(Section):
    arch: Literal["deeplabv3", "deeplabv3plus", "deeplabv2"] = Field(
        "deeplabv3plus",
        description="G's network on the encoder: smp's DeepLabV3, or DeepLabV3+ with its low-level skip (an "
        "ASPP decoder with image pooling), or DeepLab-v2 as the adversarial references train it (a classifier "
        "summing dilated 3x3 convolutions, model.generator.aspp_v2_rates; no decoder, no pooling)")
    encoder: str = Field("resnet18", min_length=1, description="smp encoder name, e.g. resnet18, resnet101, mobilenet_v2")
    encoder_weights: Optional[str] = Field(
        None, min_length=1,
        description="encoder weights: null random init; a name (imagenet) fetched by smp (a download); "
        "a local file path loaded strictly")
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
        description="deeplabv3/deeplabv3plus: ASPP dilation rates, three positive integers (feature-map cells)")
    decoder_channels: int = Field(
        256, gt=0, le=1024,
        description="deeplabv3/deeplabv3plus: width of the decoder (ASPP and DeepLabV3+'s fusion); smp's default 256")
    aux_head: bool = Field(
        False,
        description="training only: a second output from the encoder's second-to-last stage (AdaptSegNet / "
        "ADVENT multi-level adaptation); eval, export and predict use the main output")
    activation_checkpointing: bool = Field(
        False,
        description="training only: recompute G's encoder stages and decoder in the backward (less memory, "
        "about one more forward of time); weights and files unchanged")
    aspp_v2_rates: Union[Literal["paper", "early_return"], list[Annotated[int, Field(ge=1, le=256)]]] = Field(
        "paper", min_length=1,
        description="deeplabv2: its classifier's dilation rates, one 3x3 convolution to the classes per rate, "
                    "the outputs summed. paper: 6, 12, 18, 24 (DeepLab-v2's ASPP-L; ADVENT's code). "
                    "early_return: 6, 12, what AdaptSegNet's, AdvSemiSeg's and s4GAN's code "
                    "computes (its loop returns after the second branch). Or a list of rates")
    norm: Literal["train", "frozen_affine", "frozen"] = Field(
        "train",
        description="G's BatchNorm. train: learned weight and bias, batch statistics. frozen_affine: weight "
                    "and bias fixed (not in the optimizer), batch statistics, running ones updated (the "
                    "references' DeepLab-v2). frozen: weight, bias and statistics fixed, every BatchNorm in "
                    "eval mode while G trains (mmsegmentation's norm_eval); a batch of one trains")

    @property
    def trains_batch_statistics(self) -> bool:
        """Whether G's BatchNorm layers normalise with each batch's own statistics in training:
        all but ``norm: frozen`` (eval-mode BatchNorm, its running statistics)."""
        return self.norm != "frozen"

    @property
    def trains_on_one_sample(self) -> bool:
        """Whether a batch of one sample trains G (where not, segadv/training/build.py and
        segadv/data/batch_checks.py refuse one before step 1). Not where a BatchNorm on batch
        statistics sees one value per channel: the image-pooling branch of smp's DeepLabV3 / V3+
        ASPP (a 1x1 map). DeepLab-v2 has no pooling: at batch 1 its BatchNorm normalises over each
        map's pixels, as the references train it (AdaptSegNet, ADVENT: batch 1, statistics updating)."""
        return not self.trains_batch_statistics or self.arch == "deeplabv2"

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
        arch = info.data.get("arch")
        least = ARCH_LIMITS[arch].min_encoder_depth if arch in ARCH_LIMITS else 1
        if depth < least:
            raise ValueError(f"{arch} needs an encoder depth of {least}..{ENCODER_STAGES}, got {depth}")
        return depth

    @field_validator("layout")
    @classmethod
    def _layout_fits_arch(cls, layout: str, info: ValidationInfo) -> str:
        arch = info.data.get("arch")
        layouts = ARCH_LIMITS[arch].layouts if arch in ARCH_LIMITS else ("smp",)
        if layout not in layouts:
            raise ValueError(f"{arch} builds its encoder in layout {' or '.join(layouts)}, not {layout} "
                             "(the caffe layout is the references' DeepLab-v2: arch deeplabv2)")
        return layout

    @field_validator("decoder_atrous_rates")
    @classmethod
    def _rates_fit_arch(cls, rates: list[int], info: ValidationInfo) -> list[int]:
        arch = info.data.get("arch")
        count = ARCH_LIMITS[arch].atrous_rates if arch in ARCH_LIMITS else 3
        if count is not None and len(rates) != count:
            raise ValueError(f"{arch}'s ASPP takes {count} dilation rates, e.g. [12, 24, 36]; got {len(rates)}")
        return rates


class DiscriminatorConfig(Section):
    kind: Literal["fc", "image"] = Field(
        "fc",
        description="fc: AdvSemiSeg's fully convolutional D (a logit per pixel of a class map); image: "
        "s4GAN's image-level D (one logit per image)")
    ndf: int = Field(64, gt=0, le=256, description="width of D's first convolution (later ones double it, up to 8x)")
    # fc: the last one is D's classifier and its logit map is the training size halved this many
    # times; 5 is the reference's (10x10 at 321 px, but 2x2 at 80 px: use 3 there).
    num_downsamples: Optional[int] = Field(
        None, ge=1, le=10,
        description="D's stride-2 convolutions (fc: its logit map is the training size halved this many "
        "times, checked against the smallest training image); null: the kind's reference (fc 5, image 4)")
    align_corners: bool = Field(
        True,
        description="fc: upsample D's logit map with align_corners (AdvSemiSeg's reference; "
        "docs/methods.md \"Deviations\")")


class ModelConfig(Section):
    generator: GeneratorConfig = Field(GeneratorConfig(), description="G, the segmentation network")
    discriminator: DiscriminatorConfig = Field(DiscriminatorConfig(), description="D, the discriminator")
    discriminator_aux: Optional[DiscriminatorConfig] = Field(
        None, description="the aux output's D (multi-level domain adaptation); null: D's settings")


class SyntheticDataConfig(Section):
    image_size: int = Field(128, ge=32, le=2048, description="side of the square generated images, pixels")
    train_size: int = Field(2000, gt=0, le=10**7, description="number of generated training samples")
    val_size: int = Field(200, gt=0, le=10**7, description="number of generated val samples")
    seed: Seed = Field(0, description="seed of the generated dataset (each sample a function of seed, split, index)")
    # "pretext": the source look with other shape classes, a task to pretrain an encoder on
    # (configs/pretext.yaml) that shares no image or label with the others.
    domain: Literal["source", "target", "pretext"] = Field(
        "source",
        description="look of the images: source, target (other textures and lighting, for domain "
        "adaptation) or pretext (other shape classes)")


# Dataset kinds and their layouts: docs/datasets.md. Relative paths inside the data section are
# taken from ``data.root``; ``data.root`` itself from the working directory.
DataKind = Literal["synthetic", "folder", "voc", "cityscapes", "gta5"]


class FolderSplitConfig(Section):
    images: str = Field("images", min_length=1, description="image directory (relative: from data.root)")
    masks: str = Field("masks", min_length=1, description="mask directory; a mask matches its image by file stem")
    list_file: Optional[str] = Field(
        None, min_length=1, description="a file of ids (file stems), one a line; null: every image in images")


class FolderDataConfig(Section):
    train: FolderSplitConfig = Field(
        FolderSplitConfig(images="train/images", masks="train/masks"), description="the training split's files")
    val: FolderSplitConfig = Field(
        FolderSplitConfig(images="val/images", masks="val/masks"), description="the val split's files")
    image_suffixes: list[Annotated[str, Field(min_length=1)]] = Field(
        [".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"], min_length=1,
        description="image file suffixes listed (any case)")
    mask_suffix: str = Field(".png", min_length=1, description="mask file suffix")
    class_names: Optional[list[Annotated[str, Field(min_length=1)]]] = Field(
        None, min_length=2, description="one name per class; null: class_0, class_1, ...")


class VocDataConfig(Section):
    augmented: bool = Field(False, description="train on the SBD-augmented set (SegmentationClassAug/, train_aug.txt)")
    train_split: Optional[str] = Field(
        None, min_length=1, description="ImageSets/Segmentation/<name>.txt for training; null: train (train_aug when augmented)")
    val_split: str = Field("val", min_length=1, description="ImageSets/Segmentation/<name>.txt for val")


class CityscapesDataConfig(Section):
    train_split: str = Field("train", min_length=1, description="leftImg8bit/<split>/ and gtFine/<split>/ for training")
    val_split: str = Field("val", min_length=1, description="leftImg8bit/<split>/ and gtFine/<split>/ for val")


class Gta5DataConfig(Section):
    train_list: Optional[str] = Field(
        None, min_length=1,
        description="a file of training ids; null: every image not held out for val (must not share ids with val)")
    val_list: Optional[str] = Field(None, min_length=1, description="a file of val ids; null: every val_every-th image (sorted)")
    val_every: int = Field(20, ge=2, le=10**6, description="without val_list: every val_every-th image is held out for val")


class DataConfig(Section):
    kind: DataKind = Field("synthetic", description="dataset kind: synthetic, folder, voc, cityscapes or gta5 (docs/datasets.md)")
    root: Optional[str] = Field(None, min_length=1, description="the dataset directory (every kind but synthetic)")
    synthetic: SyntheticDataConfig = Field(SyntheticDataConfig(), description="kind synthetic: the generated shapes")
    folder: FolderDataConfig = Field(FolderDataConfig(), description="kind folder: images and masks in directories")
    voc: VocDataConfig = Field(VocDataConfig(), description="kind voc: Pascal VOC 2012 (and SBD)")
    cityscapes: CityscapesDataConfig = Field(CityscapesDataConfig(), description="kind cityscapes: its splits")
    gta5: Gta5DataConfig = Field(Gta5DataConfig(), description="kind gta5: its train / val split")
    num_classes: int = Field(
        5, ge=2, description="number of classes (ids 0..num_classes-1); at most 255, masks being 8-bit")
    ignore_index: int = Field(
        255, ge=0, le=255, description="mask value that is not a class (not scored, no loss); 0..255, not a class id")
    # raise: a bad sample stops the run with a message naming it; skip: it is dropped, counted and
    # listed in RUN/skipped.json.
    on_error: Literal["raise", "skip"] = Field(
        "raise", description="a bad sample: raise stops with its name; skip drops it and lists it in RUN/skipped.json")
    labeled_fraction: float = Field(
        1.0, gt=0, le=1,
        description="seeded fraction of the training set that is labeled; the rest is an unlabeled pool whose "
        "masks are never read")
    labeled_list: Optional[str] = Field(
        None, min_length=1, description="a file of the labeled ids (replaces labeled_fraction); saved split: RUN/data_split.json")
    labeled_seed: Seed = Field(0, description="seed of the labeled / unlabeled split")
    batch_size: int = Field(
        8, gt=0, le=10**6,
        description="training batch per process and stream (G's BatchNorm needs 2 or more per micro-batch)")
    val_batch_size: int = Field(8, gt=0, le=10**6, description="evaluation batch per process")
    num_workers: int = Field(1, ge=0, le=256, description="DataLoader worker processes per loader (0: in the main process)")
    pin_memory: bool = Field(True, description="pin host batches (only used when a CUDA device consumes them)")
    persistent_workers: bool = Field(True, description="keep the workers between epochs (with num_workers > 0)")
    prefetch_factor: Optional[int] = Field(
        None, ge=1, le=64, description="batches each worker loads ahead (with num_workers > 0); null: torch's 2")
    drop_last: bool = Field(
        True, description="drop each epoch's last partial training batch (val never drops); false refuses a last batch of one")
    # Which convention G's input follows (segadv/config/normalization.py): the weights G starts from
    # were trained on one, and everything that undoes or reproduces it (panels, export, predict) reads it.
    normalization: Literal[tuple(NORMALIZATIONS)] = Field(  # type: ignore[valid-type]
        "imagenet", description="G's input: imagenet (RGB, data.mean / data.std), caffe_bgr (BGR less the Caffe "
        "mean, no std: AdaptSegNet, ADVENT) or caffe_rgb (RGB less it: AdvSemiSeg, s4GAN); docs/datasets.md")
    # On the 0..1 scale of albumentations' Normalize (pixels divided by 255 first).
    mean: list[Probability] = Field(
        [0.485, 0.456, 0.406], min_length=3, max_length=3,
        description="per-channel RGB mean of Normalize, each in 0..1 (normalization imagenet)")
    std: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        [0.229, 0.224, 0.225], min_length=3, max_length=3,
        description="per-channel RGB std of Normalize, each in (0, 1] (normalization imagenet)")
    # Normalize(mean, std) and ToTensorV2 are appended to both pipelines.
    train_transforms: list[dict[str, Any]] = Field(
        [{"name": "HorizontalFlip", "p": 0.5}],
        description="albumentations steps on image and mask, e.g. {name: HorizontalFlip, p: 0.5}; Normalize and ToTensorV2 appended")
    val_transforms: list[dict[str, Any]] = Field([], description="albumentations steps for val (same form)")
    # AdaptSegNet's and ADVENT's evaluation (Cityscapes at [1024, 512]): G predicts at a smaller
    # input and its output is upsampled to the label; the label keeps its size, so the scores are
    # at full resolution. [W, H] as theirs (PIL's size order). Null: G predicts at the image's size.
    val_input_size: Optional[list[Annotated[int, Field(ge=16, le=16384)]]] = Field(
        None, min_length=2, max_length=2,
        description="[W, H] each val image is resized to (bicubic, after data.val_transforms) before G; G's "
        "raw output upsampled to the full-size label (null: predict at the image's size); docs/datasets.md")

    @field_validator("num_classes")
    @classmethod
    def _fits_masks(cls, n: int) -> int:
        if n > 255:
            raise ValueError(f"masks are 8-bit, so at most 255 classes (ids 0..254, 255 left for "
                             f"data.ignore_index); got {n}")
        return n

    @model_validator(mode="after")
    def _mean_std_belong_to_the_normalization(self) -> "DataConfig":
        # A convention that fixes its own mean and std would silently ignore data.mean / data.std.
        if not NORMALIZATIONS[self.normalization].takes_mean_std:
            for key in ("mean", "std"):
                if getattr(self, key) != type(self).model_fields[key].default:
                    raise ValueError(f"data.{key}: normalization {self.normalization} fixes its own mean and std "
                                     f"(docs/datasets.md); leave data.{key} out, or use normalization imagenet")
        return self

    @property
    def input_normalization(self) -> Normalization:
        """The convention G's input follows, resolved: channel order, mean and std."""
        return resolve_normalization(self.normalization, self.mean, self.std)


class OptimizerConfig(Section):
    name: Literal["sgd", "adam", "adamw"] = Field(description="the optimizer: sgd, adam or adamw (torch.optim)")
    # Above 100 no optimizer converges, and near float32's limit the update itself overflows.
    lr: float = Field(gt=0, le=100, description="base learning rate (> 0, at most 100), decayed by the poly schedule")
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd: momentum in [0, 1)")
    weight_decay: float = Field(0.0, ge=0, le=1, description="L2 penalty (adamw: decoupled decay), 0..1")
    betas: list[Beta] = Field(
        [0.9, 0.999], min_length=2, max_length=2, description="adam / adamw: the two moment decays, each in [0, 1)")
    poly_power: float = Field(
        0.9, ge=0, le=100,
        description="poly schedule: lr = base_lr * (1 - step / poly_horizon) ** poly_power (0: constant)")
    # The references decay over 250,000 iterations and stop earlier (AdaptSegNet 150,000, ADVENT 120,000).
    poly_horizon: Optional[int] = Field(
        None, ge=1, le=10**9,
        description="steps the poly schedule decays over (at least train.max_steps); null: train.max_steps")
    # The references train their classifier at 10x the backbone's rate (optim_parameters).
    head_lr_mult: float = Field(
        1.0, gt=0, le=1000,
        description="generator: the learning rate of everything but the encoder (the head: classifier, decoder, "
                    "aux head) as a multiple of lr; the references' DeepLab-v2: 10")
    head_weight_decay: Optional[float] = Field(
        None, ge=0, le=1, description="generator: the head's weight decay; null: weight_decay (the references')")
    implementation: Literal["auto", "for_loop", "foreach", "fused"] = Field(
        "auto",
        description="torch's update kernels: auto (foreach on CUDA, a loop on the CPU), for_loop, foreach "
        "(one multi-tensor op a group) or fused")


class OptimConfig(Section):
    generator: OptimizerConfig = Field(
        OptimizerConfig(name="sgd", lr=2.5e-4, momentum=0.9, weight_decay=5e-4), description="G's optimizer")
    discriminator: OptimizerConfig = Field(
        OptimizerConfig(name="adam", lr=1e-4, betas=[0.9, 0.99]), description="D's optimizer")
    discriminator_aux: Optional[OptimizerConfig] = Field(
        None, description="the aux D's optimizer; null: D's settings (its own instance)")

    @field_validator("discriminator", "discriminator_aux")
    @classmethod
    def _one_group_for_d(cls, optim: Optional[OptimizerConfig], info: ValidationInfo) -> Optional[OptimizerConfig]:
        """A D is one network with no encoder: no backbone and head to set apart."""
        if optim is not None:
            for key, default in (("head_lr_mult", 1.0), ("head_weight_decay", None)):
                if getattr(optim, key) != default:
                    raise ValueError(f"{key} is G's (its encoder against its head); {info.field_name} has no "
                                     f"encoder: leave it at {default}")
        return optim


class LossConfig(Section):
    # One key for every method (issue 50); its old names (method.adaptsegnet.lambda_adv_main, ...)
    # still read, with a note: segadv/config/renamed.py. Each method's default and refusal are on its
    # class (segadv/methods/base.py Method.adversarial_weight, the one reader of the key).
    lambda_adv: Optional[Weight] = Field(
        None, description="weight of G's adversarial term (adaptation: the main level's; 0: off). null: the "
                          "method's reference default: supervised and advsemiseg 0.01 (on labeled images), "
                          "adaptsegnet and advent 0.001, mean_teacher 0 (no D is built); minent has no such "
                          "term (0 only), nor has s4gan (its term is method.s4gan.lambda_fm)")
    adv_warmup_steps: int = Field(0, ge=0, le=10**9, description="G's update ignores D until this many steps have run")


class MethodConfig(Section):
    """What one training iteration does (docs/methods.md): ``name`` picks the method, and each
    registered method with settings has its section under its name (``method.advsemiseg``).

    The methods are registered in ``segadv.methods.registry`` (a plugin adds its own there), and
    each method's class holds its section's model: this section is validated against them. Every
    registered method's section is kept, not only ``name``'s, so that a run can switch methods with
    ``method.name=...`` over a config that sets another method's settings (an experiment grid's
    rows). A validated ``MethodConfig`` is an instance of a subclass with one field per section
    (``registered()``), so ``cfg.method.advsemiseg.semi_start`` reads as any other setting.
    """

    name: str = Field("supervised", description="the method: what one training iteration does (a registered "
                                                 "method's name; docs/methods.md)")

    @field_validator("name")
    @classmethod
    def _registered_name(cls, name: str) -> str:
        methods = registered_methods()
        if name not in methods:  # reported as a Literal's mismatch is: the names it could be
            *others, last = map(repr, methods)
            expected = f"{', '.join(others)} or {last}" if others else last
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return name

    @model_validator(mode="wrap")
    @classmethod
    def _with_sections(cls, data: Any, handler: Any) -> Any:
        if cls is not MethodConfig or isinstance(data, MethodConfig):
            return handler(data)  # the registered subclass's own fields, or one already validated
        return cls.registered().model_validate(data)

    @classmethod
    def schema_model(cls) -> type[MethodConfig]:
        return cls.registered()

    @classmethod
    def registered(cls) -> type[MethodConfig]:
        """The section as the registry stands: ``name`` and each registered method's settings."""
        return _method_sections(tuple((name, method.config) for name, method in registered_methods().items()
                                      if method.config is not None))

    def __reduce__(self) -> tuple:
        # The registered subclass is built at run time, so it is pickled as its values.
        return _validated_method_config, (self.model_dump(),)


# The method registry imports this module (each method's section is a Section and its class reads
# a Config), so the schema finds the registry by its module name when it first validates a method
# section, rather than importing it here.
METHOD_REGISTRY = "segadv.methods.registry"


def registered_methods() -> dict[str, Any]:
    """``method.name`` -> the method's class (``segadv.methods.registry.METHODS``)."""
    return importlib.import_module(METHOD_REGISTRY).METHODS


@functools.lru_cache(maxsize=None)
def _method_sections(sections: tuple[tuple[str, type[Section]], ...]) -> type[MethodConfig]:
    return create_model("MethodConfig", __base__=MethodConfig, __module__=__name__,
                        **{name: (model, Field(default_factory=model, description=f"method {name}'s settings"))
                           for name, model in sections})


def _validated_method_config(data: dict[str, Any]) -> MethodConfig:
    return MethodConfig.model_validate(data)


class NetworkAmpConfig(Section):
    # auto is resolved once per network on its own devices when the run's roles are built
    # (segadv/training/build.py, rule in segadv/engine/amp_optimizer.py resolve_auto); a stored
    # config keeps auto, so a resume on another machine resolves again.
    enabled: Union[bool, Literal["auto"]] = Field(
        False, description="run this network's forward under autocast: true, false, or auto (bfloat16 where "
                           "its device computes bf16 natively: CUDA compute capability 8.0+, a CPU with "
                           "AMX-BF16 or AVX512-BF16; else off)")
    dtype: Literal["float16", "bfloat16"] = Field("bfloat16", description="autocast dtype: bfloat16, or float16 (with a GradScaler); enabled: auto is bfloat16 only")
    # Up to 2**32: far above any useful scale, and a float32 scale that can still halve.
    init_scale: float = Field(2.0**16, gt=0, le=2.0**32, description="float16 only: the GradScaler's starting loss scale")

    @model_validator(mode="after")
    def _auto_is_bfloat16(self) -> "NetworkAmpConfig":
        # fp16 is never chosen by a machine check: it needs loss scaling and overflows where bf16
        # does not, and on a CPU it is 46x slower than float32 (docs/performance.md). Refused
        # rather than silently ignored, so a config says what it runs.
        if self.enabled == "auto" and self.dtype == "float16":
            raise ValueError("enabled: auto chooses bfloat16 or off, never float16; write enabled: true with "
                             "dtype: float16, or leave dtype out (bfloat16) with auto")
        return self

    @property
    def is_auto(self) -> bool:
        return self.enabled == "auto"


class AmpConfig(Section):
    generator: NetworkAmpConfig = Field(NetworkAmpConfig(), description="G's mixed precision")
    discriminator: NetworkAmpConfig = Field(NetworkAmpConfig(), description="D's mixed precision")
    discriminator_aux: Optional[NetworkAmpConfig] = Field(
        None, description="the aux D's mixed precision; null: D's setting (its own GradScaler)")
    teacher: Optional[NetworkAmpConfig] = Field(
        None, description="the mean teacher's autocast (it has no GradScaler: it never backpropagates); null: G's setting")


ParallelMode = Literal["auto", "none", "dp", "ddp"]


class ParallelConfig(Section):
    """Each network is wrapped on its own (never one wrapper around both).

    auto: ddp under a multi-process launch, dp when the device map lists a replica set
    (``g:1+2``), else none.
    """

    generator: ParallelMode = Field("auto", description="G's wrapper: auto, none, dp or ddp")
    discriminator: ParallelMode = Field("auto", description="D's wrapper: auto, none, dp or ddp")
    discriminator_aux: Optional[ParallelMode] = Field(None, description="the aux D's wrapper; null: D's")
    sync_bn: bool = Field(False, description="convert G's BatchNorm to SyncBatchNorm under DDP")


class CompileConfig(Section):
    """``torch.compile`` per network (docs/training.md "Compiling"): each network's forward (and so its
    backward) compiled on its own device, in place, so parameter names, state dicts, checkpoints and
    the wrappers see the same module; the hand-over between devices, the losses, the GradScaler and
    the optimizer steps stay eager. Evaluation (eval mode, no_grad) and each new batch size may
    compile once more; after the first evaluation no step recompiles."""

    generator: bool = Field(False, description="torch.compile G's forward")
    discriminator: bool = Field(False, description="torch.compile D's forward (also the aux D's unless discriminator_aux says)")
    discriminator_aux: Optional[bool] = Field(None, description="torch.compile the aux D's forward; null: D's setting")
    teacher: Optional[bool] = Field(None, description="torch.compile the mean teacher's forward; null: G's setting")
    mode: Optional[Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]] = Field(
        None, description="torch.compile's mode; null: its default (reduce-overhead adds CUDA graphs on CUDA)")
    # inductor generates kernels (C++ on the CPU: needs a C++ compiler; Triton on CUDA). aot_eager
    # and eager generate none, so they check a model's compilability in seconds.
    backend: Literal["inductor", "aot_eager", "eager"] = Field(
        "inductor", description="torch.compile's backend: inductor (generates kernels), aot_eager or eager (checks only)")


class TrainConfig(Section):
    max_steps: Count = Field(20000, description="optimizer steps of the run")
    eval_every: Count = Field(1000, description="evaluate on val every this many steps (and at the end)")
    log_every: Count = Field(10, description="log losses (and check them for NaN) every this many steps")
    seed: Seed = Field(0, description="training seed: weights, data order, augmentation (each rank adds its rank)")
    deterministic: bool = Field(False, description="bitwise-repeatable kernels where torch has them")
    lr_scaling: Literal["none", "linear"] = Field(
        "none", description="linear: multiply both learning rates by the world size (DDP's global batch grows with it)")
    channels_last: bool = Field(False, description="both networks' weights and activations in channels_last memory format")
    eval_source: bool = Field(
        False, description="with target_data: also evaluate the source val split (val_source/*; val/* stays the target's)")
    profile: bool = Field(
        False, description="precise per-phase timing: synchronise the device around every phase (a sync per phase on CUDA)")
    # skip_step: a GradScaler held at scale 1 where no fp16 one runs: a host read of its flag per step.
    on_nonfinite: Literal["stop", "skip_step"] = Field(
        "stop", description="a non-finite loss or weight: stop (exit 3, nothing non-finite saved) or skip_step (skip that update)")
    on_discriminator_collapse: Literal["warn", "stop"] = Field(
        "warn", description="D leaves its band (log.d_wins_loss, log.d_collapse_loss): warn, or stop (a checkpoint, outcome stopped)")
    accumulation_steps: int = Field(
        1, gt=0, le=1024,
        description="micro-batches per optimizer step; must divide every stream's batch, leaving 2 or more per micro-batch")


# The label-free scores logged at each evaluation of a run with unlabeled or target data
# (segadv/engine/proxies.py), each with its direction: True where higher is better.
PROXY_SCORES: dict[str, bool] = {"entropy": False, "flip_agreement": True, "scale_agreement": True, "snd": True,
                                 "d_confidence": True}
BEST_BY = ("val/mIoU", *(f"proxy/{name}" for name in PROXY_SCORES))


def higher_is_better(score: str) -> bool:
    """The direction of a ``checkpoint.best_by`` score."""
    return score == "val/mIoU" or PROXY_SCORES[score.removeprefix("proxy/")]


def best_score_by(best: Mapping[str, Any]) -> str:
    """The score a ``best`` record (best.json, a checkpoint's ``best``) was chosen by; a record
    without ``by`` (chosen by the val labels, or written before checkpoint.best_by): val/mIoU."""
    return str(best.get("by", "val/mIoU"))


class CheckpointConfig(Section):
    every: Count = Field(1000, description="write step_<N>.pt and last.pt every this many steps (and at the end)")
    keep_last: Optional[int] = Field(
        None, ge=1, le=10**6, description="keep only the newest K step_<N>.pt files (null: all); last.pt is always kept")
    best_by: Literal[BEST_BY] = Field(  # type: ignore[valid-type]
        "val/mIoU", description="the score best.pt is chosen by: val/mIoU (the val labels; in adaptation the "
                                "target's) or a label-free proxy/* score, each in its direction (entropy: lowest; "
                                "the others: highest)")


class InitSource(Section):
    path: str = Field(min_length=1, description="weights file to start from (any format the checkpoint loader takes)")
    # e.g. ["segmentation_head.*"] to start from weights trained with another number of classes.
    exclude: list[Annotated[str, Field(min_length=1)]] = Field(
        [], description="glob patterns of model keys not taken from the file (they keep their fresh init)")


class InitConfig(Section):
    """Weights to start from (any format the checkpoint loader accepts); strict unless excluded."""

    generator: Optional[InitSource] = Field(None, description="G's starting weights; null: fresh")
    discriminator: Optional[InitSource] = Field(None, description="D's starting weights; null: fresh")


class LogConfig(Section):
    tensorboard: bool = Field(True, description="write TensorBoard events in the run dir")
    num_images: int = Field(4, ge=0, le=64, description="val samples shown as image panels at each evaluation (0: none)")
    # Only for a method with a panel on a pool whose masks exist (the synthetic data's).
    diagnostic_images: int = Field(
        16, ge=0, le=4096,
        description="unlabeled images whose masks measure D's confidence at each evaluation (diag/*); 0: off")
    progress_bar: Optional[bool] = Field(None, description="a progress bar; null: on a terminal, log lines otherwise")
    # D's health (docs/training.md "D's health"): a band for D's loss and its accuracies, on the
    # references' scale (AdvSemiSeg's loss_D: the mean of D's BCE on real and fake; its issue #39
    # calls 0.2-0.5 healthy; chance is ln 2 = 0.693). The supervised method logs the sum of the two,
    # so its bounds are doubled; an ls GAN's squared errors are not checked.
    d_wins_loss: Optional[float] = Field(
        0.2, gt=0, le=100,
        description="\"D wins outright\": D's loss below this at d_wins_steps consecutive log steps; null: not checked")
    d_wins_steps: int = Field(
        10, ge=1, le=10**6, description="the window: consecutive log steps out of D's band before a warning (either condition)")
    d_collapse_loss: Optional[float] = Field(
        0.69, gt=0, le=100,
        description="\"D collapsed\": D's loss at or above this (chance ln 2 = 0.693) at d_wins_steps consecutive log "
                    "steps, once it was below; null: not checked")
    d_collapse_accuracy: float = Field(
        0.55, ge=0, le=1,
        description="\"D collapsed\" also needs the mean of D's accuracies on real and fake (where logged) at most this (0.5: chance)")


class Config(Section):
    device_map: Optional[str] = Field(
        None, min_length=1, description="where networks run, e.g. \"g:1,d:0\"; null: cuda:0 for both when CUDA is available, else cpu")
    run_dir: Optional[str] = Field(
        None, description="the run's directory (~ expanded); null: runs/<config name>-<timestamp>; a run's config.yaml stores null")
    model: ModelConfig = Field(ModelConfig(), description="the networks")
    data: DataConfig = Field(DataConfig(), description="the training data (domain adaptation: the labeled source)")
    target_data: Optional[DataConfig] = Field(
        None, description="domain adaptation's unlabeled target: its train images and the val split val/* is measured on")
    optim: OptimConfig = Field(OptimConfig(), description="optimizers and their schedules")
    loss: LossConfig = Field(LossConfig(), description="G's adversarial weight (every method's) and the labeled term's warm-up (supervised, advsemiseg)")
    method: SerializeAsAny[MethodConfig] = Field(default_factory=lambda: MethodConfig.model_validate({}),
                                                 description="what one training iteration does")
    amp: AmpConfig = Field(AmpConfig(), description="mixed precision per network")
    parallel: ParallelConfig = Field(ParallelConfig(), description="wrappers per network (DataParallel, DDP)")
    compile: CompileConfig = Field(CompileConfig(), description="torch.compile per network")
    train: TrainConfig = Field(TrainConfig(), description="the training loop")
    checkpoint: CheckpointConfig = Field(CheckpointConfig(), description="checkpoint files")
    init: InitConfig = Field(InitConfig(), description="weights to start from")
    log: LogConfig = Field(LogConfig(), description="what a run reports")

    @field_validator("run_dir")
    @classmethod
    def _user_path(cls, value: Optional[str]) -> Optional[str]:
        """``~`` expanded as in every path option; an empty path (an unset shell variable) would
        be the current dir, so it is refused (segadv/fsutil.py ``user_path``)."""
        if value is None:
            return None
        if not value.strip():
            raise ValueError("the path is empty (an unset shell variable?); name a directory or leave it out")
        return os.path.expanduser(value)
