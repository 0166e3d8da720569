"""The built-in methods as they declare themselves: each one's settings (its section of the config,
``method.<name>``) and its class (``segadv.methods.base.Method``): streams, checks, whether G's
loss passes through a D, how it is built. torch-free: the config validates every registered
method's settings with these models, and loads without torch. Each method's iteration subclasses
its declaration in the method's own module (``supervised.py``, ``advsemiseg.py``, ``s4gan.py``,
``domain_adaptation.py``), which ``from_config`` imports when a run is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal, Optional

from pydantic import Field

from segadv.config.schema import Probability, Section, Weight
from segadv.errors import UserError
from segadv.methods.base import Method
from segadv.data.stream_spec import StreamSpec

if TYPE_CHECKING:
    from segadv.config import Config
    from segadv.engine.network import Network
    from segadv.monitor.profile import PhaseTimer


# ----------------------------------------------------------------------------- settings


class AdvSemiSegConfig(Section):
    """AdvSemiSeg's semi-supervised part (Hung et al., 2018); defaults are the reference's."""

    lambda_semi: Weight = Field(
        0.1, description="self-training weight: CE of G on its argmax where D's confidence reaches the threshold")
    mask_threshold: Probability = Field(0.2, description="D's confidence from which an unlabeled pixel is self-trained")
    # Not the reference's: the mask then uses D's ranking of pixels whatever its calibration.
    mask_quantile: Optional[float] = Field(
        None, gt=0, lt=1,
        description="if set, each batch's threshold is this quantile of D's confidence (mask_threshold unused)")
    semi_start: int = Field(5000, ge=0, le=10**9, description="step from which self-training is on")
    lambda_semi_adv: Weight = Field(
        0.001, description="weight of the adversarial term on unlabeled predictions (G makes them look real)")
    semi_start_adv: int = Field(0, ge=0, le=10**9, description="step from which the unlabeled adversarial term is on")
    d_sees_unlabeled: bool = Field(True, description="D also takes G's unlabeled predictions as fake (the reference's --D-remain)")
    unlabeled_batch_size: Optional[int] = Field(
        None, gt=0, le=10**6, description="batch of the unlabeled stream; null: data.batch_size")


class S4GanConfig(Section):
    """s4GAN's terms (Mittal et al., TPAMI 2019); defaults are the reference's for VOC."""

    lambda_fm: Weight = Field(
        0.1, description="feature matching weight: L1 between D's mean features on real and on fake (G's adversarial term)")
    lambda_st: Weight = Field(1.0, description="self-training weight: CE of G on its argmax over the images D scores above threshold")
    threshold: Probability = Field(0.6, description="D's score above which a whole unlabeled image is self-trained (0.6 VOC, 0.7 Cityscapes)")
    st_start: int = Field(1, ge=0, le=10**9, description="step from which self-training is on")
    unlabeled_batch_size: Optional[int] = Field(
        None, gt=0, le=10**6, description="batch of the unlabeled stream; null: data.batch_size")


class DomainAdaptationConfig(Section):
    """Unsupervised domain adaptation from the labeled source (``data``) to the unlabeled target
    (``target_data``). Levels: main, and aux when ``model.generator.aux_head`` (multi-level).
    Defaults: AdaptSegNet's multi-level weights (docs/methods.md "Domain adaptation")."""

    lambda_seg_aux: Weight = Field(0.1, description="weight of the aux output's source CE")
    lambda_adv_main: Weight = Field(0.001, description="weight of the main level's adversarial term (target made to look like source)")
    lambda_adv_aux: Weight = Field(0.0002, description="weight of the aux level's adversarial term")
    lambda_ent_main: Weight = Field(0.0, description="weight of the main level's mean normalised target entropy (MinEnt)")
    lambda_ent_aux: Weight = Field(0.0, description="weight of the aux level's target entropy")
    gan: Literal["bce", "ls"] = Field("bce", description="GAN loss: bce, or ls (least squares: MSE on D's logits)")
    target_batch_size: Optional[int] = Field(
        None, gt=0, le=10**6, description="batch of the target stream; null: data.batch_size")


class MinEntConfig(DomainAdaptationConfig):
    """ADVENT's MinEnt: no discriminator, the target's entropy minimised."""

    lambda_adv_main: Weight = Field(0.0, description="weight of the main level's adversarial term (MinEnt: none)")
    lambda_adv_aux: Weight = Field(0.0, description="weight of the aux level's adversarial term (MinEnt: none)")
    lambda_ent_main: Weight = Field(0.001, description="weight of the main level's mean normalised target entropy")
    lambda_ent_aux: Weight = Field(0.0002, description="weight of the aux level's target entropy")


# ----------------------------------------------------------------------------- declarations


class SupervisedSpec(Method):
    """Fully supervised adversarial training on the labeled stream (``loss.*``: the adversarial
    term's weight and warm-up; ``loss.lambda_adv: 0`` is the CE-only baseline)."""

    name = "supervised"
    streams = (StreamSpec("labeled", "labeled"),)
    implementation = "segadv.methods.supervised:Supervised"

    @classmethod
    def from_config(cls, cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer) -> Method:
        return cls.iteration_class()(g, d, phases, num_classes=cfg.data.num_classes,
                                     ignore_index=cfg.data.ignore_index,
                                     lambda_adv=cfg.loss.lambda_adv, adv_warmup_steps=cfg.loss.adv_warmup_steps)

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        return cfg.loss.lambda_adv > 0  # the labeled adversarial term


class AdvSemiSegSpec(Method):
    """AdvSemiSeg's semi-supervised iteration on three streams: labeled, unlabeled, and a labeled
    batch D sees as real."""

    name = "advsemiseg"
    config = AdvSemiSegConfig
    # Seed words 1 and 2: each stream shuffles and augments independently of the others.
    streams = (
        StreamSpec("labeled", "labeled"),
        StreamSpec("unlabeled", "unlabeled", seed_word=1, batch_size_key="method.advsemiseg.unlabeled_batch_size"),
        StreamSpec("gt", "labeled", seed_word=2),
    )
    panel_stream = "unlabeled"
    implementation = "segadv.methods.advsemiseg:AdvSemiSeg"

    @classmethod
    def from_config(cls, cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer) -> Method:
        return cls.iteration_class()(g, d, phases, cls.settings(cfg), num_classes=cfg.data.num_classes,
                                     ignore_index=cfg.data.ignore_index, lambda_adv=cfg.loss.lambda_adv,
                                     adv_warmup_steps=cfg.loss.adv_warmup_steps)

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        return cfg.loss.lambda_adv > 0 or cls.settings(cfg).lambda_semi_adv > 0  # labeled, unlabeled terms


class S4GanSpec(Method):
    """s4GAN's iteration on AdvSemiSeg's three streams, against an image-level D."""

    name = "s4gan"
    config = S4GanConfig
    # Seed words 1 and 2, as AdvSemiSeg's: each stream shuffles and augments independently.
    streams = (
        StreamSpec("labeled", "labeled"),
        StreamSpec("unlabeled", "unlabeled", seed_word=1, batch_size_key="method.s4gan.unlabeled_batch_size"),
        StreamSpec("gt", "labeled", seed_word=2),
    )
    discriminator_kind = "image"
    implementation = "segadv.methods.s4gan:S4Gan"

    @classmethod
    def from_config(cls, cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer) -> Method:
        return cls.iteration_class()(g, d, phases, cls.settings(cfg), num_classes=cfg.data.num_classes,
                                     ignore_index=cfg.data.ignore_index)

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        # Feature matching is its only term through D (loss.lambda_adv is not used).
        return cls.settings(cfg).lambda_fm > 0

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        super().check_config(cfg)
        if cfg.model.discriminator.kind != "image":
            raise UserError("model.discriminator.kind: s4gan's D scores whole images with their class maps; set "
                            "model.discriminator.kind: image (configs/s4gan_voc.yaml)")


class DomainAdaptationSpec(Method):
    """Unsupervised domain adaptation, source and target streams, one level or two (G's aux head);
    each method is a subclass naming itself, its section and whether it trains a D."""

    config: ClassVar[type[DomainAdaptationConfig]] = DomainAdaptationConfig
    has_discriminator: ClassVar[bool]  # a D per level (AdaptSegNet, ADVENT), or none (MinEnt)
    trains_aux_output = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        name = getattr(cls, "name", None)
        if name is None:  # a further shared base, not yet a method
            return
        if not hasattr(cls, "has_discriminator"):
            raise TypeError(f"{cls.__qualname__}: a domain adaptation method says whether it trains a D "
                            "(has_discriminator)")
        # The source stream is the labeled split as the supervised method draws it (same seed);
        # the target stream's batch size is the method's own setting.
        cls.streams = (
            StreamSpec("source", "labeled"),
            StreamSpec("target", "target", seed_word=3, batch_size_key=f"method.{name}.target_batch_size"),
        )

    @classmethod
    def has_aux_discriminator(cls, cfg: Config) -> bool:
        return cfg.model.generator.aux_head and cls.has_discriminator

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        settings = cls.settings(cfg)
        return cls.has_discriminator and (
            settings.lambda_adv_main > 0 or (cfg.model.generator.aux_head and settings.lambda_adv_aux > 0))

    @classmethod
    def from_config(cls, cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer) -> Method:
        return cls.iteration_class()(g, d, d_aux, phases, cls.settings(cfg), ignore_index=cfg.data.ignore_index,
                                     multi_level=cfg.model.generator.aux_head)


class AdaptSegNetSpec(DomainAdaptationSpec):
    """AdaptSegNet (Tsai et al.): D on the softmax maps."""

    name = "adaptsegnet"
    has_discriminator = True
    implementation = "segadv.methods.domain_adaptation:AdaptSegNet"


class AdventSpec(DomainAdaptationSpec):
    """ADVENT's AdvEnt (Vu et al.): D on the weighted self-information maps."""

    name = "advent"
    has_discriminator = True
    implementation = "segadv.methods.domain_adaptation:Advent"


class MinEntSpec(DomainAdaptationSpec):
    """ADVENT's MinEnt (Vu et al.): no D, the target's entropy minimised."""

    name = "minent"
    config = MinEntConfig
    has_discriminator = False
    implementation = "segadv.methods.domain_adaptation:MinEnt"
