"""s4GAN (Mittal et al., TPAMI 2019): what the method declares before any network exists (its
settings, streams, networks, losses, checks) and what its iteration reads from the config
(``S4GanSetup``), torch-free so the config loads without torch; its iteration is ``iteration.py``
beside this file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from pydantic import Field

from segadv.config.schema import Probability, Section, Weight
from segadv.data.stream_spec import StreamSpec
from segadv.errors import UserError
from segadv.methods.base import Method, Setup

if TYPE_CHECKING:
    from segadv.config import Config


class S4GanConfig(Section):
    """s4GAN's terms (Mittal et al., TPAMI 2019); defaults are the reference's for VOC."""

    lambda_fm: Weight = Field(
        0.1, description="feature matching weight: L1 between D's mean features on real and on fake (G's adversarial term)")
    lambda_st: Weight = Field(1.0, description="self-training weight: CE of G on its argmax over the images D scores above threshold")
    threshold: Probability = Field(0.6, description="D's score above which a whole unlabeled image is self-trained (0.6 VOC, 0.7 Cityscapes)")
    st_start: int = Field(1, ge=0, le=10**9, description="step from which self-training is on")
    unlabeled_batch_size: Optional[int] = Field(
        None, gt=0, le=10**6, description="batch of the unlabeled stream; null: data.batch_size")


@dataclass(frozen=True)
class S4GanSetup(Setup):
    """``Setup`` (its ``lambda_adv`` is 0: s4GAN's G term through D is feature matching) and its terms."""

    settings: S4GanConfig  # method.s4gan


class S4GanSpec(Method):
    """s4GAN's iteration on AdvSemiSeg's three streams, against an image-level D."""

    name = "s4gan"
    iteration_path = "segadv.methods.s4gan.iteration:S4Gan"
    config = S4GanConfig
    # Seed words 1 and 2, as AdvSemiSeg's: each stream shuffles and augments independently.
    streams = (
        StreamSpec("labeled", "labeled"),
        StreamSpec("unlabeled", "unlabeled", seed_word=1, batch_size_key="method.s4gan.unlabeled_batch_size"),
        StreamSpec("gt", "labeled", seed_word=2),
    )
    discriminator_kind = "image"
    # Its G term through D is feature matching, with a weight of its own.
    lambda_adv_unused = "has no term loss.lambda_adv weighs: its adversarial term for G is feature matching, " \
                        "weighted by method.s4gan.lambda_fm"
    losses = ("loss_seg", "loss_fm", "loss_st", "loss_d", "st_image_ratio", "d_acc_real", "d_acc_fake")
    d_losses = ("loss_d",)
    selection_losses = ("loss_seg", "loss_st")  # the labeled batch's labelled pixels; the selected images'
    diagnostics = ("train/loss_seg", "train/loss_d", "train/d_acc_real", "train/d_acc_fake", "train/st_image_ratio")

    @classmethod
    def setup(cls, cfg: Config) -> S4GanSetup:
        return S4GanSetup(**vars(super().setup(cfg)), settings=cls.settings(cfg))

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        # Feature matching is its only term through D (loss.lambda_adv is refused: lambda_adv_unused).
        return cls.settings(cfg).lambda_fm > 0

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        super().check_config(cfg)
        if cfg.model.discriminator.kind != "image":
            raise UserError("model.discriminator.kind: s4gan's D scores whole images with their class maps; set "
                            "model.discriminator.kind: image (configs/s4gan_voc.yaml)")
