"""The supervised method: what the method declares before any network exists (its settings, streams,
networks, losses, checks) and what its iteration reads from the config (``SupervisedSetup``),
torch-free so the config loads without torch; its iteration is ``iteration.py`` beside this file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from segadv.data.stream_spec import StreamSpec
from segadv.methods.base import Method, Setup

if TYPE_CHECKING:
    from segadv.config import Config


@dataclass(frozen=True)
class SupervisedSetup(Setup):
    """The labeled adversarial term's schedule besides ``Setup``: what the supervised method and
    AdvSemiSeg (``LabeledAdversarial``, segadv/methods/adversarial.py) read."""

    adv_warmup_steps: int  # loss.adv_warmup_steps: G's adversarial term is on from this step


class SupervisedSpec(Method):
    """Fully supervised adversarial training on the labeled stream (``loss.*``: the adversarial
    term's weight and warm-up; ``loss.lambda_adv: 0`` is the CE-only baseline)."""

    name = "supervised"
    iteration_path = "segadv.methods.supervised.iteration:Supervised"
    lambda_adv_default = 0.01  # AdvSemiSeg's README command (--lambda-adv-pred 0.01)
    streams = (StreamSpec("labeled", "labeled"),)
    losses = ("loss_seg", "loss_adv", "loss_d", "d_acc_real", "d_acc_fake")
    d_losses = ("loss_d",)
    selection_losses = ("loss_seg", "loss_adv", "loss_d")  # the labeled batch's labelled pixels, each
    d_loss_scale = 2.0  # loss_d is the sum of D's BCE on real and fake (weight 1 each): chance 2 ln 2
    diagnostics = ("train/loss_seg", "train/loss_d", "train/d_acc_real", "train/d_acc_fake")

    @classmethod
    def setup(cls, cfg: Config) -> SupervisedSetup:
        return SupervisedSetup(**vars(super().setup(cfg)), adv_warmup_steps=cfg.loss.adv_warmup_steps)

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        return cls.adversarial_weight(cfg) > 0  # the labeled adversarial term
