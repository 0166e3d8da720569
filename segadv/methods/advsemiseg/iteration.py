"""AdvSemiSeg (Hung et al., BMVC 2018): semi-supervised adversarial training.

Each iteration draws a labeled batch (x_l, y_l), an unlabeled batch x_u and a separately
shuffled labeled batch y_gt that D sees as real (three streams, each resumable on its own).

G's loss, with D frozen:
    CE(G(x_l), y_l) + lambda_adv * BCE(D(softmax G(x_l)), real)              [labeled]
  + lambda_semi_adv * BCE(D(softmax G(x_u)), real)       from semi_start_adv [unlabeled]
  + lambda_semi * CE(G(x_u), pseudo)                      from semi_start     [self-training]
where pseudo = argmax G(x_u), ignored where D's confidence sigmoid(D(softmax G(x_u))) < mask_T.
D's loss: (BCE(D(fake), fake) + BCE(D(onehot(y_gt)), real)) / 2, fake = G's labeled (and, with
``d_sees_unlabeled``, unlabeled) maps, detached; labeled ignore pixels excluded throughout.

Unlike the reference, a batch with no confident pixel contributes a zero self-training term and
keeps its adversarial term (the reference dropped both). G runs once on labeled and unlabeled
images together (one forward per backward, as DDP expects); BatchNorm's batch statistics are
then over both, where the reference's two forwards kept them apart.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch

from segadv.data.streams import Stream
from segadv.engine.losses import EMPTY_PREFIX, empty_selection, masked_cross_entropy, pseudo_labels
from segadv.engine.network import Network
from segadv.methods.adversarial import (
    GROUND_TRUTH_REAL as LABELS,
    LabeledAdversarial,
    copy_in,
    discriminator_view,
    gan_loss,
    generator_logits,
    hand_over,
    optimizer_step,
)
from segadv.methods.base import PanelMaps
from segadv.methods.schedule import Schedule
from segadv.methods.advsemiseg.declaration import AdvSemiSegSetup, AdvSemiSegSpec
from segadv.monitor.diagnostics import d_accuracy
from segadv.monitor.profile import PhaseTimer
from segadv.parallel.placement import for_inference, to_device


class AdvSemiSeg(AdvSemiSegSpec, LabeledAdversarial):
    discriminator_realness = LabeledAdversarial.discriminator_realness

    def __init__(self, setup: AdvSemiSegSetup, nets: Mapping[str, Network], phases: PhaseTimer) -> None:
        """The labeled adversarial term (``loss.*``) as the supervised method's, and the
        unlabeled terms of ``method.advsemiseg``."""
        super().__init__(setup, nets, phases)
        self.settings = settings = setup.settings
        self.schedule = Schedule(adversarial=(setup.lambda_adv, setup.adv_warmup_steps),
                                 semi_adv=(settings.lambda_semi_adv, settings.semi_start_adv),
                                 semi=(settings.lambda_semi, settings.semi_start),
                                 unlabeled=(settings.lambda_semi + settings.lambda_semi_adv, settings.semi_start_adv))

    # Which terms are on at a step (adversarial_active: the labeled term's). The unlabeled batch is
    # drawn, forwarded and shown to D as fake by the reference's rule (train.py 330): while either
    # unlabeled weight is set, from semi_start_adv, whichever term is on; the self-training term
    # lives inside that branch, so it also waits for semi_start_adv.
    def threshold(self, confidence: torch.Tensor) -> float | torch.Tensor:
        """The confidence a pixel needs to be a pseudo label: ``mask_threshold``, or with
        ``mask_quantile`` that quantile of this batch's confidence (a device scalar: no sync)."""
        if self.settings.mask_quantile is None:
            return self.settings.mask_threshold
        return torch.quantile(confidence.float().flatten(), self.settings.mask_quantile)

    def unlabeled_active(self, step: int) -> bool:
        return self.schedule.active("unlabeled", step)

    def semi_adv_active(self, step: int) -> bool:
        return self.schedule.active("semi_adv", step)

    def semi_active(self, step: int) -> bool:
        return self.unlabeled_active(step) and self.schedule.active("semi", step)

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        g, d, phase, ignore = self.g, self.d, self.phases.phase, self.ignore_index
        images_l, labels_l = streams["labeled"].next()
        _, labels_gt = streams["gt"].next()  # only its labels: D's real maps
        use_unlabeled = self.unlabeled_active(step)
        images_u = streams["unlabeled"].next() if use_unlabeled else None
        images = images_l if images_u is None else torch.cat([images_l, images_u])
        images, labels_l, labels_l_d, valid_l_d = self.labeled_batch(images, labels_l)

        # ---- G, with D frozen
        n_l = images_l.shape[0]
        with phase("g_fwd_bwd", g.device):
            logits = generator_logits(g, images)
            logits_l, logits_u = logits[:n_l], logits[n_l:]
            loss_seg = masked_cross_entropy(logits_l, labels_l, ignore)
            probs = logits.softmax(dim=1)
        probs_d = hand_over(self.phases, probs, g, d)
        with phase("g_fwd_bwd", g.device):
            loss = loss_seg
            # Terms that are off report 0, each on the device its live value would be on.
            loss_adv = loss_semi_adv = empty_adv = torch.zeros((), device=d.device)
            loss_semi = semi_ratio = empty_semi = torch.zeros((), device=g.device)
            empty_l = empty_selection(valid_l_d)  # the labeled batch's labelled pixels
            adversarial = self.adversarial_active(step)
            if adversarial or use_unlabeled:
                d_out = discriminator_view(d, probs_d)
                if adversarial:
                    loss_adv, empty_adv = gan_loss(d_out[:n_l], LABELS.real, valid_l_d), empty_l
                    loss = loss + self.lambda_adv * to_device(loss_adv, g.device)
            if use_unlabeled:
                d_out_u = d_out[n_l:]
                if self.semi_adv_active(step):
                    every_pixel = torch.ones_like(d_out_u[:, 0], dtype=torch.bool)
                    loss_semi_adv = gan_loss(d_out_u, LABELS.real, every_pixel)
                    loss = loss + self.settings.lambda_semi_adv * to_device(loss_semi_adv, g.device)
                confidence = to_device(torch.sigmoid(d_out_u.detach().float()).squeeze(1), g.device)
                pseudo = pseudo_labels(logits_u, confidence, self.threshold(confidence), ignore)
                semi_ratio = (pseudo != ignore).float().mean()
                if self.semi_active(step):
                    loss_semi = masked_cross_entropy(logits_u, pseudo, ignore)
                    empty_semi = empty_selection(pseudo != ignore)
                    loss = loss + self.settings.lambda_semi * loss_semi
            g.opt.backward(loss)
        optimizer_step(self.phases, g)

        # ---- D: G's maps as fake, the gt stream's one-hot labels as real; the mean of the two
        (labels_gt,) = copy_in(self.phases, d.device, labels_gt)
        with phase("d_fwd_bwd", d.device):
            valid_gt = labels_gt != ignore
            fake, valid_fake = probs_d[:n_l], valid_l_d
            if use_unlabeled and self.settings.d_sees_unlabeled:
                fake = probs_d
                valid_fake = torch.cat([valid_l_d, torch.ones_like(valid_l_d[:1]).expand(len(images_u), -1, -1)])
        loss_d, logits_fake, logits_real = self.update_discriminator(fake, labels_gt, valid_gt, valid_fake=valid_fake,
                                                                     weight=0.5)
        return {
            "loss_seg": loss_seg.detach(),
            "loss_adv": loss_adv.detach(),
            "loss_d": loss_d,
            "loss_semi": loss_semi.detach(),
            "loss_semi_adv": loss_semi_adv.detach(),
            "semi_pixel_ratio": semi_ratio,
            "d_acc_real": d_accuracy(logits_real, LABELS.real, valid_gt),
            "d_acc_fake": d_accuracy(logits_fake, LABELS.fake, valid_fake),
            EMPTY_PREFIX + "loss_seg": empty_l,
            EMPTY_PREFIX + "loss_adv": empty_adv,
            EMPTY_PREFIX + "loss_d": empty_selection(valid_gt, valid_fake),
            EMPTY_PREFIX + "loss_semi": empty_semi,
        }

    @torch.no_grad()
    def panel(self, images: torch.Tensor) -> Optional[PanelMaps]:
        """G's prediction, D's confidence and the masked pseudo labels on fixed unlabeled images."""
        generator = for_inference(self.g.module)
        was_training = generator.training
        generator.eval()
        try:
            logits = generator_logits(self.g, to_device(images, self.g.device), module=generator)
        finally:
            generator.train(was_training)
        d_out = discriminator_view(self.d, to_device(logits.softmax(dim=1), self.d.device))
        confidence = to_device(torch.sigmoid(d_out.float()).squeeze(1), self.g.device)
        pseudo = pseudo_labels(logits, confidence, self.threshold(confidence), self.ignore_index)
        return PanelMaps("train/unlabeled_confidence_pseudo", images, logits.argmax(dim=1).cpu(),
                         confidence.cpu(), pseudo.cpu())
