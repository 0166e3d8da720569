"""The supervised method: what the method declares before any network exists (its settings, streams,
networks, losses, checks), torch-free so the config loads without torch; its iteration is
``iteration.py`` beside this file, which ``Method.iteration_class`` imports when a run is built."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from segadv.data.stream_spec import StreamSpec
from segadv.methods.base import Method

if TYPE_CHECKING:
    from segadv.config import Config
    from segadv.engine.network import Network
    from segadv.monitor.profile import PhaseTimer


class SupervisedSpec(Method):
    """Fully supervised adversarial training on the labeled stream (``loss.*``: the adversarial
    term's weight and warm-up; ``loss.lambda_adv: 0`` is the CE-only baseline)."""

    name = "supervised"
    lambda_adv_default = 0.01  # AdvSemiSeg's README command (--lambda-adv-pred 0.01)
    streams = (StreamSpec("labeled", "labeled"),)
    losses = ("loss_seg", "loss_adv", "loss_d", "d_acc_real", "d_acc_fake")
    d_losses = ("loss_d",)
    d_loss_scale = 2.0  # loss_d is the sum of D's BCE on real and fake (weight 1 each): chance 2 ln 2
    diagnostics = ("train/loss_seg", "train/loss_d", "train/d_acc_real", "train/d_acc_fake")

    @classmethod
    def from_config(cls, cfg: Config, nets: Mapping[str, Network], phases: PhaseTimer) -> Method:
        return cls.iteration_class()(nets["generator"], nets["discriminator"], phases, num_classes=cfg.data.num_classes,
                                     ignore_index=cfg.data.ignore_index,
                                     lambda_adv=cls.adversarial_weight(cfg), adv_warmup_steps=cfg.loss.adv_warmup_steps)

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        return cls.adversarial_weight(cfg) > 0  # the labeled adversarial term
