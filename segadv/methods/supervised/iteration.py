"""Fully supervised adversarial training (AdvSemiSeg's supervised part, Hung et al., BMVC 2018) on
the labeled stream. ``loss.lambda_adv: 0`` makes it the CE-only baseline.

G's update:  CE(G(x), y) + lambda_adv * BCE(D(softmax(G(x))), real), with D frozen.
D's update:  BCE(D(onehot(y)), real) + BCE(D(softmax(G(x)).detach()), fake).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from segadv.data.streams import Stream
from segadv.engine.losses import EMPTY_PREFIX, empty_selection, masked_cross_entropy
from segadv.methods.adversarial import (
    GROUND_TRUTH_REAL as LABELS,
    LabeledAdversarial,
    discriminator_view,
    gan_loss,
    generator_logits,
    hand_over,
    optimizer_step,
)
from segadv.methods.supervised.declaration import SupervisedSpec
from segadv.monitor.diagnostics import d_accuracy
from segadv.parallel.placement import to_device


@dataclass
class StepLosses:
    """Detached losses of one iteration, each on the device that computed it."""

    loss_seg: torch.Tensor
    loss_adv: torch.Tensor
    loss_d: torch.Tensor
    d_acc_real: torch.Tensor  # D's accuracy on the one-hot maps (valid pixels), in its update
    d_acc_fake: torch.Tensor  # and on G's maps
    empty: torch.Tensor  # 1 where the batch had no labelled pixel: every loss above averaged over none

    def as_dict(self) -> dict[str, torch.Tensor]:
        losses = {"loss_seg": self.loss_seg, "loss_adv": self.loss_adv, "loss_d": self.loss_d,
                  "d_acc_real": self.d_acc_real, "d_acc_fake": self.d_acc_fake}
        return {**losses, **{EMPTY_PREFIX + name: self.empty for name in SupervisedSpec.selection_losses}}


class Supervised(SupervisedSpec, LabeledAdversarial):
    discriminator_realness = LabeledAdversarial.discriminator_realness

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        images, labels = streams["labeled"].next()
        return self.iteration(images, labels, step).as_dict()

    def iteration(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> StepLosses:
        """One G update then one D update on this batch. ``step`` counts completed steps before it."""
        images, labels_g, labels_d, valid_d = self.labeled_batch(images, labels)
        probs_d, loss_seg, loss_adv = self.update_generator(images, labels_g, valid_d, step)
        loss_d, fake_logits, real_logits = self.update_discriminator(probs_d, labels_d, valid_d)
        if loss_adv is None:
            # Same value G's update would have seen: D was frozen there and G's output is the same.
            loss_adv = gan_loss(fake_logits, LABELS.real, valid_d)
        return StepLosses(loss_seg, loss_adv, loss_d, d_accuracy(real_logits, LABELS.real, valid_d),
                          d_accuracy(fake_logits, LABELS.fake, valid_d), empty_selection(valid_d))

    def update_generator(
        self, images: torch.Tensor, labels: torch.Tensor, valid_d: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Returns G's detached probabilities on D's device, the CE loss and the adversarial loss
        (None while the adversarial term is off)."""
        with self.phases.phase("g_fwd_bwd", self.g.device):
            logits = generator_logits(self.g, images)
            loss_seg = masked_cross_entropy(logits, labels, self.ignore_index)
            probs = logits.softmax(dim=1)
        probs_d = hand_over(self.phases, probs, self.g, self.d)
        with self.phases.phase("g_fwd_bwd", self.g.device):
            loss = loss_seg
            loss_adv = None
            if self.adversarial_active(step):
                loss_adv = gan_loss(discriminator_view(self.d, probs_d), LABELS.real, valid_d)
                # G's scaler also scales this term when D runs in float16 (build.py): unscaled, its
                # per-pixel gradient underflows to zero in D's float16 backward.
                loss = loss_seg + self.lambda_adv * to_device(loss_adv, loss_seg.device)
            self.g.opt.backward(loss)
        optimizer_step(self.phases, self.g)
        return probs_d.detach(), loss_seg.detach(), None if loss_adv is None else loss_adv.detach()
