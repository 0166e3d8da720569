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
import torch.nn.functional as F

from segadv.config.schema import AdvSemiSegConfig
from segadv.data.streams import Stream, StreamSpec
from segadv.engine.losses import masked_bce_with_logits, masked_cross_entropy, one_hot_labels, pseudo_labels
from segadv.engine.step import FAKE, REAL, AdversarialStep, discriminator_view, generator_logits
from segadv.methods.base import PanelMaps
from segadv.monitor.profile import transfer_device
from segadv.parallel.placement import for_inference, to_device, unwrap


class AdvSemiSeg:
    # Seed words 1 and 2: each stream shuffles and augments independently of the others.
    streams = (
        StreamSpec("labeled", "labeled"),
        StreamSpec("unlabeled", "unlabeled", seed_word=1, batch_size_key="method.advsemiseg.unlabeled_batch_size"),
        StreamSpec("gt", "labeled", seed_word=2),
    )
    panel_stream = "unlabeled"

    def __init__(self, base: AdversarialStep, settings: AdvSemiSegConfig) -> None:
        """``base``: the supervised step, whose networks, optimizers, device map and labeled
        adversarial term (``lambda_adv`` after ``adv_warmup_steps``) this method shares."""
        self.base = base
        self.settings = settings
        self.generator, self.discriminator = base.generator, base.discriminator
        self.opt_g, self.opt_d = base.opt_g, base.opt_d
        self.device_map = base.device_map

    # Which terms are on at a step. The unlabeled batch is drawn only while one of its terms is.
    def semi_adv_active(self, step: int) -> bool:
        return self.settings.lambda_semi_adv > 0 and step >= self.settings.semi_start_adv

    def semi_active(self, step: int) -> bool:
        return self.settings.lambda_semi > 0 and step >= self.settings.semi_start

    def unlabeled_active(self, step: int) -> bool:
        return self.semi_adv_active(step) or self.semi_active(step)

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        g_dev, d_dev = self.device_map.generator, self.device_map.discriminator
        images_l, labels_l = streams["labeled"].next()
        _, labels_gt = streams["gt"].next()  # only its labels: D's real maps
        use_unlabeled = self.unlabeled_active(step)
        images_u = streams["unlabeled"].next() if use_unlabeled else None

        phase = self.base.phases.phase
        with phase("input_copy", transfer_device(labels_l.device, g_dev)):
            labels_l = to_device(labels_l, g_dev)
            images = to_device(images_l if images_u is None else torch.cat([images_l, images_u]), g_dev)
        with phase("transfer", transfer_device(g_dev, d_dev)):
            labels_l_d = labels_l if d_dev == g_dev else to_device(labels_l, d_dev)
        valid_l_d = labels_l_d != self.base.ignore_index
        self.generator.train()
        self.discriminator.train()

        # ---- G, with D frozen
        n_l = images_l.shape[0]
        with phase("g_fwd_bwd", g_dev):
            logits = generator_logits(self.generator, self.opt_g, images)
            logits_l, logits_u = logits[:n_l], logits[n_l:]
            loss_seg = F.cross_entropy(logits_l, labels_l, ignore_index=self.base.ignore_index)
            probs = logits.softmax(dim=1)
        with phase("transfer", transfer_device(g_dev, d_dev)):
            probs_d = to_device(probs, d_dev)
        with phase("g_fwd_bwd", g_dev):
            loss = loss_seg
            # Terms that are off report 0, each on the device its live value would be on.
            loss_adv = loss_semi_adv = torch.zeros((), device=d_dev)
            loss_semi = semi_ratio = torch.zeros((), device=g_dev)
            adversarial = self.base.adversarial_active(step)
            if adversarial or use_unlabeled:
                d_out = discriminator_view(self.discriminator, self.opt_d, probs_d)
                if adversarial:
                    loss_adv = masked_bce_with_logits(d_out[:n_l], REAL, valid_l_d)
                    loss = loss + self.base.lambda_adv * to_device(loss_adv, g_dev)
            if use_unlabeled:
                d_out_u = d_out[n_l:]
                if self.semi_adv_active(step):
                    every_pixel = torch.ones_like(d_out_u[:, 0], dtype=torch.bool)
                    loss_semi_adv = masked_bce_with_logits(d_out_u, REAL, every_pixel)
                    loss = loss + self.settings.lambda_semi_adv * to_device(loss_semi_adv, g_dev)
                confidence = to_device(torch.sigmoid(d_out_u.detach().float()).squeeze(1), g_dev)
                pseudo = pseudo_labels(logits_u, confidence, self.settings.mask_threshold, self.base.ignore_index)
                semi_ratio = (pseudo != self.base.ignore_index).float().mean()
                if self.semi_active(step):
                    loss_semi = masked_cross_entropy(logits_u, pseudo, self.base.ignore_index)
                    loss = loss + self.settings.lambda_semi * loss_semi
            self.opt_g.backward(loss)
        with phase("optimizer", g_dev):
            self.opt_g.step()

        # ---- D: G's maps as fake, the gt stream's one-hot labels as real
        with phase("input_copy", transfer_device(labels_gt.device, d_dev)):
            labels_gt = to_device(labels_gt, d_dev)
        with phase("d_fwd_bwd", d_dev):
            valid_gt = labels_gt != self.base.ignore_index
            fake, valid_fake = probs_d[:n_l], valid_l_d
            if use_unlabeled and self.settings.d_sees_unlabeled:
                fake = probs_d
                valid_fake = torch.cat([valid_l_d, torch.ones_like(valid_l_d[:1]).expand(len(images_u), -1, -1)])
            real = one_hot_labels(labels_gt, self.base.num_classes, valid_gt)
            # One forward over fake and real together: DDP expects one forward per backward, and D
            # has no batch statistics, so this equals two separate forwards.
            with self.opt_d.autocast():
                fake_logits, real_logits = self.discriminator(torch.cat([fake.detach(), real])).split(
                    [len(fake), len(real)]
                )
            loss_d = 0.5 * (masked_bce_with_logits(fake_logits, FAKE, valid_fake)
                            + masked_bce_with_logits(real_logits, REAL, valid_gt))
            self.opt_d.backward(loss_d)
        with phase("optimizer", d_dev):
            self.opt_d.step()
        return {
            "loss_seg": loss_seg.detach(),
            "loss_adv": loss_adv.detach(),
            "loss_d": loss_d.detach(),
            "loss_semi": loss_semi.detach(),
            "loss_semi_adv": loss_semi_adv.detach(),
            "semi_pixel_ratio": semi_ratio,
        }

    @torch.no_grad()
    def panel(self, images: torch.Tensor) -> Optional[PanelMaps]:
        """G's prediction, D's confidence and the masked pseudo labels on fixed unlabeled images."""
        g_dev, d_dev = self.device_map.generator, self.device_map.discriminator
        generator = for_inference(self.generator)
        was_training = generator.training
        generator.eval()
        try:
            logits = generator_logits(generator, self.opt_g, to_device(images, g_dev))
        finally:
            generator.train(was_training)
        with self.opt_d.autocast():
            d_out = unwrap(self.discriminator)(to_device(logits.softmax(dim=1), d_dev))
        confidence = to_device(torch.sigmoid(d_out.float()).squeeze(1), g_dev)
        pseudo = pseudo_labels(logits, confidence, self.settings.mask_threshold, self.base.ignore_index)
        return PanelMaps("train/unlabeled_confidence_pseudo", images, logits.argmax(dim=1).cpu(),
                         confidence.cpu(), pseudo.cpu())
