"""AdaptSegNet, ADVENT's AdvEnt and MinEnt: what the method declares before any network exists (its
settings, streams, networks, losses, checks) and what their iteration reads from the config
(``DomainAdaptationSetup``), torch-free so the config loads without torch; their iterations are in
``iteration.py`` beside this file, one class each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Optional

from pydantic import Field

from segadv.config.schema import Section, Weight
from segadv.data.stream_spec import StreamSpec
from segadv.methods.base import Method, Setup

if TYPE_CHECKING:
    from segadv.config import Config


class DomainAdaptationConfig(Section):
    """Unsupervised domain adaptation from the labeled source (``data``) to the unlabeled target
    (``target_data``). Levels: main, and aux when ``model.generator.aux_head`` (multi-level).
    Defaults: AdaptSegNet's multi-level weights (docs/methods.md "Domain adaptation"); the main
    level's adversarial weight is every method's ``loss.lambda_adv`` (null: 0.001)."""

    lambda_seg_aux: Weight = Field(0.1, description="weight of the aux output's source CE")
    lambda_adv_aux: Weight = Field(
        0.0002, description="weight of the aux level's adversarial term (the main level's: loss.lambda_adv)")
    lambda_ent_main: Weight = Field(0.0, description="weight of the main level's mean normalised target entropy (MinEnt)")
    lambda_ent_aux: Weight = Field(0.0, description="weight of the aux level's target entropy")
    gan: Literal["bce", "ls"] = Field("bce", description="GAN loss: bce, or ls (least squares: MSE on D's logits)")
    target_batch_size: Optional[int] = Field(
        None, gt=0, le=10**6, description="batch of the target stream; null: data.batch_size")


class MinEntConfig(DomainAdaptationConfig):
    """ADVENT's MinEnt: no discriminator, the target's entropy minimised."""

    lambda_adv_aux: Weight = Field(0.0, description="weight of the aux level's adversarial term (MinEnt: none)")
    lambda_ent_main: Weight = Field(0.001, description="weight of the main level's mean normalised target entropy")
    lambda_ent_aux: Weight = Field(0.0002, description="weight of the aux level's target entropy")


@dataclass(frozen=True)
class DomainAdaptationSetup(Setup):
    """``Setup`` (its ``lambda_adv``: the main level's adversarial weight) and the levels."""

    settings: DomainAdaptationConfig  # method.<name>: MinEnt's section is a MinEntConfig
    multi_level: bool  # model.generator.aux_head: an aux level besides the main one


class DomainAdaptationSpec(Method):
    """Unsupervised domain adaptation, source and target streams, one level or two (G's aux head);
    each method is a subclass naming itself, its section and whether it trains a D."""

    config: ClassVar[type[DomainAdaptationConfig]] = DomainAdaptationConfig
    has_discriminator: ClassVar[bool]  # a D per level (AdaptSegNet, ADVENT), or none (MinEnt)
    trains_aux_output = True
    # The main level's adversarial weight (the aux level's: lambda_adv_aux): AdaptSegNet's and
    # ADVENT's --lambda-adv-target2 / TRAIN.LAMBDA_ADV_MAIN.
    lambda_adv_default = 0.001
    selection_losses = ("loss_seg", "loss_seg_aux")  # the source batch's labelled pixels

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
    def networks(cls, cfg: Config) -> tuple[str, ...]:
        if not cls.has_discriminator:
            return ("generator",)
        return ("generator", "discriminator") + (("discriminator_aux",) if cfg.model.generator.aux_head else ())

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        settings = cls.settings(cfg)
        return cls.has_discriminator and (
            cls.adversarial_weight(cfg) > 0 or (cfg.model.generator.aux_head and settings.lambda_adv_aux > 0))

    @classmethod
    def setup(cls, cfg: Config) -> DomainAdaptationSetup:
        return DomainAdaptationSetup(**vars(super().setup(cfg)), settings=cls.settings(cfg),
                                     multi_level=cfg.model.generator.aux_head)


# What AdaptSegNet and AdvEnt log (the _aux ones with two levels, loss_ent* where weighted) and report.
ADVERSARIAL_ADAPTATION_LOSSES = ("loss_seg", "loss_seg_aux", "loss_ent", "loss_ent_aux", "loss_adv", "loss_adv_aux",
                                 "loss_d", "loss_d_aux", "d_acc_source", "d_acc_target", "d_acc_source_aux",
                                 "d_acc_target_aux")


ADVERSARIAL_ADAPTATION_DIAGNOSTICS = ("train/loss_seg", "train/loss_d", "train/d_acc_source", "train/d_acc_target")


class AdaptSegNetSpec(DomainAdaptationSpec):
    """AdaptSegNet (Tsai et al.): D on the softmax maps."""

    name = "adaptsegnet"
    iteration_path = "segadv.methods.domain_adaptation.iteration:AdaptSegNet"
    has_discriminator = True
    losses = ADVERSARIAL_ADAPTATION_LOSSES
    d_losses = ("loss_d", "loss_d_aux")
    diagnostics = ADVERSARIAL_ADAPTATION_DIAGNOSTICS


class AdventSpec(DomainAdaptationSpec):
    """ADVENT's AdvEnt (Vu et al.): D on the weighted self-information maps."""

    name = "advent"
    iteration_path = "segadv.methods.domain_adaptation.iteration:Advent"
    has_discriminator = True
    losses = ADVERSARIAL_ADAPTATION_LOSSES
    d_losses = ("loss_d", "loss_d_aux")
    diagnostics = ADVERSARIAL_ADAPTATION_DIAGNOSTICS


class MinEntSpec(DomainAdaptationSpec):
    """ADVENT's MinEnt (Vu et al.): no D, the target's entropy minimised."""

    name = "minent"
    iteration_path = "segadv.methods.domain_adaptation.iteration:MinEnt"
    config = MinEntConfig
    has_discriminator = False
    lambda_adv_default = 0.0  # what its old key said (method.minent.lambda_adv_main: 0); more is refused
    lambda_adv_unused = "trains no D: it has no adversarial term (its target term is method.minent.lambda_ent_main)"
    losses = ("loss_seg", "loss_seg_aux", "loss_ent", "loss_ent_aux")
    diagnostics = ("train/loss_seg",)
