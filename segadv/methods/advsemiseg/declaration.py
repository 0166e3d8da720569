"""AdvSemiSeg (Hung et al., BMVC 2018): what the method declares before any network exists (its
settings, streams, networks, losses, checks) and what its iteration reads from the config
(``AdvSemiSegSetup``), torch-free so the config loads without torch; its iteration is
``iteration.py`` beside this file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from pydantic import Field

from segadv.config.schema import Probability, Section, Weight
from segadv.data.stream_spec import StreamSpec
from segadv.methods.base import Method
from segadv.methods.supervised.declaration import SupervisedSetup

if TYPE_CHECKING:
    from segadv.config import Config


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


@dataclass(frozen=True)
class AdvSemiSegSetup(SupervisedSetup):
    """The supervised method's setup (its labeled adversarial term is AdvSemiSeg's too) and the
    unlabeled terms' settings."""

    settings: AdvSemiSegConfig  # method.advsemiseg


class AdvSemiSegSpec(Method):
    """AdvSemiSeg's semi-supervised iteration on three streams: labeled, unlabeled, and a labeled
    batch D sees as real."""

    name = "advsemiseg"
    iteration_path = "segadv.methods.advsemiseg.iteration:AdvSemiSeg"
    config = AdvSemiSegConfig
    lambda_adv_default = 0.01  # on the labeled predictions: the reference README's --lambda-adv-pred 0.01
    # Seed words 1 and 2: each stream shuffles and augments independently of the others.
    streams = (
        StreamSpec("labeled", "labeled"),
        StreamSpec("unlabeled", "unlabeled", seed_word=1, batch_size_key="method.advsemiseg.unlabeled_batch_size"),
        StreamSpec("gt", "labeled", seed_word=2),
    )
    panel_stream = "unlabeled"
    losses = ("loss_seg", "loss_adv", "loss_d", "loss_semi", "loss_semi_adv", "semi_pixel_ratio", "d_acc_real",
              "d_acc_fake")
    d_losses = ("loss_d",)
    # the labeled batch's labelled pixels; D's: the gt batch's and G's maps'; the confident unlabeled pixels
    selection_losses = ("loss_seg", "loss_adv", "loss_d", "loss_semi")
    # diag/: at evaluations, from its panel's D confidence (does D know which of G's pixels are right?)
    diagnostics = ("train/loss_seg", "train/loss_d", "train/d_acc_real", "train/d_acc_fake", "train/semi_pixel_ratio",
                   "diag/d_confidence_auroc", "diag/d_mask_precision")

    @classmethod
    def setup(cls, cfg: Config) -> AdvSemiSegSetup:
        return AdvSemiSegSetup(**vars(super().setup(cfg)), adv_warmup_steps=cfg.loss.adv_warmup_steps,
                               settings=cls.settings(cfg))

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        return cls.adversarial_weight(cfg) > 0 or cls.settings(cfg).lambda_semi_adv > 0  # labeled, unlabeled terms
