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
from torch import nn

from segadv.config.schema import AdvSemiSegConfig
from segadv.data.streams import Stream
from segadv.engine.amp_optimizer import AmpOptimizer
from segadv.engine.losses import masked_bce_with_logits, masked_cross_entropy, one_hot_labels, pseudo_labels
from segadv.engine.step import FAKE, REAL, discriminator_view, generator_logits
from segadv.methods.base import PanelMaps
from segadv.parallel.device_map import DeviceMap
from segadv.parallel.placement import for_inference, to_device, unwrap


class AdvSemiSeg:
    streams = ("labeled", "unlabeled", "gt")
    panel_stream = "unlabeled"

    def __init__(
        self,
        generator: nn.Module,
        discriminator: nn.Module,
        opt_g: AmpOptimizer,
        opt_d: AmpOptimizer,
        device_map: DeviceMap,
        *,
        num_classes: int,
        ignore_index: int,
        lambda_adv: float,
        adv_warmup_steps: int,
        settings: AdvSemiSegConfig,
    ) -> None:
        self.generator = generator
        self.discriminator = discriminator
        self.opt_g = opt_g
        self.opt_d = opt_d
        self.device_map = device_map
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.lambda_adv = lambda_adv
        self.adv_warmup_steps = adv_warmup_steps
        self.settings = settings

    # Which terms are on at a step. The unlabeled batch is drawn only while one of its terms is.
    def adversarial_active(self, step: int) -> bool:
        return self.lambda_adv > 0 and step >= self.adv_warmup_steps

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

        labels_l = to_device(labels_l, g_dev)
        labels_l_d = labels_l if d_dev == g_dev else to_device(labels_l, d_dev)
        valid_l_d = labels_l_d != self.ignore_index
        self.generator.train()
        self.discriminator.train()

        # ---- G, with D frozen
        images = to_device(images_l if images_u is None else torch.cat([images_l, images_u]), g_dev)
        n_l = images_l.shape[0]
        logits = generator_logits(self.generator, self.opt_g, images)
        logits_l, logits_u = logits[:n_l], logits[n_l:]
        loss_seg = F.cross_entropy(logits_l, labels_l, ignore_index=self.ignore_index)
        probs_d = to_device(logits.softmax(dim=1), d_dev)
        loss = loss_seg
        zero = torch.zeros((), device=g_dev)
        loss_adv, loss_semi_adv, loss_semi, semi_ratio = zero, zero, zero, zero
        adversarial = self.adversarial_active(step)
        if adversarial or use_unlabeled:
            d_out = discriminator_view(self.discriminator, self.opt_d, probs_d)
            if adversarial:
                loss_adv = masked_bce_with_logits(d_out[:n_l], REAL, valid_l_d)
                loss = loss + self.lambda_adv * to_device(loss_adv, g_dev)
        if use_unlabeled:
            d_out_u = d_out[n_l:]
            if self.semi_adv_active(step):
                every_pixel = torch.ones_like(d_out_u[:, 0], dtype=torch.bool)
                loss_semi_adv = masked_bce_with_logits(d_out_u, REAL, every_pixel)
                loss = loss + self.settings.lambda_semi_adv * to_device(loss_semi_adv, g_dev)
            confidence = to_device(torch.sigmoid(d_out_u.detach().float()).squeeze(1), g_dev)
            pseudo = pseudo_labels(logits_u, confidence, self.settings.mask_threshold, self.ignore_index)
            semi_ratio = (pseudo != self.ignore_index).float().mean()
            if self.semi_active(step):
                loss_semi = masked_cross_entropy(logits_u, pseudo, self.ignore_index)
                loss = loss + self.settings.lambda_semi * loss_semi
        self.opt_g.backward_and_step(loss)

        # ---- D: G's maps as fake, the gt stream's one-hot labels as real
        labels_gt = to_device(labels_gt, d_dev)
        valid_gt = labels_gt != self.ignore_index
        fake, valid_fake = probs_d[:n_l], valid_l_d
        if use_unlabeled and self.settings.d_sees_unlabeled:
            fake = probs_d
            valid_fake = torch.cat([valid_l_d, torch.ones_like(valid_l_d[:1]).expand(len(images_u), -1, -1)])
        real = one_hot_labels(labels_gt, self.num_classes, valid_gt)
        # One forward over fake and real together: DDP expects one forward per backward, and D
        # has no batch statistics, so this equals two separate forwards.
        with self.opt_d.autocast():
            fake_logits, real_logits = self.discriminator(torch.cat([fake.detach(), real])).split(
                [len(fake), len(real)]
            )
        loss_d = 0.5 * (masked_bce_with_logits(fake_logits, FAKE, valid_fake)
                        + masked_bce_with_logits(real_logits, REAL, valid_gt))
        self.opt_d.backward_and_step(loss_d)
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
        pseudo = pseudo_labels(logits, confidence, self.settings.mask_threshold, self.ignore_index)
        return PanelMaps("train/unlabeled_confidence_pseudo", images, logits.argmax(dim=1).cpu(),
                         confidence.cpu(), pseudo.cpu())
