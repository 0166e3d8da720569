"""s4GAN (Mittal, Tatarchenko, Brox, TPAMI 2019): semi-supervised segmentation with an image-level D.

Each iteration draws a labeled batch (x_l, y_l), an unlabeled batch x_u and a separately shuffled
labeled batch (x_gt, y_gt) that D sees as real (three streams, each resumable on its own). D
(``model.discriminator.kind: image``) scores an image with its class maps as a whole: its input is
[softmax G(x_u), x_u] (fake) or [onehot(y_gt), x_gt] (real), each image scaled to [0, 1].

G's loss, with D frozen:
    CE(G(x_l), y_l)
  + lambda_fm * mean |mean_batch F(real) - mean_batch F(fake)|                     [feature matching]
  + lambda_st * CE(G(x_u), argmax G(x_u)) over the images whose sigmoid(D(fake)) > threshold,
    from st_start                                                                  [self-training]
with F D's pooled features. D's loss: (BCE(D(fake), 0) + BCE(D(real), 1)) / 2, fake detached: D
sees only the unlabeled predictions as fake.

As in the reference, G runs on the labeled batch and on the unlabeled one in separate forwards
(BatchNorm's batch statistics stay per batch); each forward is followed by its own backward (as
DDP expects) and one step follows. The reference's D forwards are kept in its order (fake then
real for G's loss, the same for D's update), so D's dropout draws in the same order. Where segadv
differs: D returns logits and the losses take BCE with logits (the reference's D ends in a
sigmoid); images are scaled to [0, 1] each by its own range (the reference scaled the batch by
the batch's, the real one by the labeled batch's); an iteration where no image passes the
threshold contributes a zero self-training term (the same as the reference's, without a branch).
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch
import torch.nn.functional as F

from segadv.data.streams import Stream
from segadv.engine.losses import EMPTY_PREFIX, empty_selection, masked_cross_entropy, one_hot_labels
from segadv.engine.network import Network
from segadv.methods.adversarial import (
    GROUND_TRUTH_REAL as LABELS,
    DiscriminatorBatch,
    copy_in,
    discriminator_backward,
    discriminator_view,
    generator_logits,
    hand_over,
    optimizer_step,
    realness,
)
from segadv.methods.schedule import Schedule
from segadv.methods.s4gan.declaration import S4GanSetup, S4GanSpec
from segadv.monitor.diagnostics import d_accuracy
from segadv.monitor.profile import PhaseTimer
from segadv.parallel.placement import to_device


def unit_range(images: torch.Tensor) -> torch.Tensor:
    """Each (C,H,W) image of a batch scaled to [0, 1] by its own minimum and maximum."""
    low, high = torch.aminmax(images.flatten(1), dim=1)
    low, high = low.view(-1, 1, 1, 1), high.view(-1, 1, 1, 1)
    return (images - low) / (high - low).clamp_min(torch.finfo(images.dtype).tiny)


def feature_matching(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference between the batch means of D's features on real and on fake."""
    return (real.float().mean(dim=0) - fake.float().mean(dim=0)).abs().mean()


def selected_pseudo_labels(logits: torch.Tensor, scores: torch.Tensor, threshold: float,
                           ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """G's argmax on the images whose D score (N,) exceeds ``threshold``, ``ignore_index`` on the
    others; and which images those are, (N,) bool."""
    selected = scores > threshold
    labels = logits.detach().argmax(dim=1)
    return torch.where(selected[:, None, None], labels, torch.full_like(labels, ignore_index)), selected


class S4Gan(S4GanSpec):
    def __init__(self, setup: S4GanSetup, nets: Mapping[str, Network], phases: PhaseTimer) -> None:
        self.g, self.d, self.phases = nets["generator"], nets["discriminator"], phases
        self.settings = setup.settings
        self.num_classes = setup.num_classes
        self.ignore_index = setup.ignore_index
        self.schedule = Schedule(st=(setup.settings.lambda_st, setup.settings.st_start))

    def st_active(self, step: int) -> bool:
        return self.schedule.active("st", step)

    def discriminator_realness(self, images: torch.Tensor, logits: torch.Tensor) -> Optional[torch.Tensor]:
        """Its image-level D's probability that G's softmax maps with their images are ground truth
        (``Method.discriminator_realness``): one per image."""
        if images.shape[-2:] != logits.shape[-2:]:  # data.val_input_size: G predicted at a resized input
            images = F.interpolate(images.float(), size=logits.shape[-2:], mode="bilinear", align_corners=False)
        return realness(self.d, torch.cat([logits.softmax(dim=1), unit_range(images)], dim=1), LABELS)

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        g, d, phase, s, ignore = self.g, self.d, self.phases.phase, self.settings, self.ignore_index
        images_l, labels_l = streams["labeled"].next()
        host_u = streams["unlabeled"].next()
        images_gt, labels_gt = streams["gt"].next()
        images_l, labels_l, images_u = copy_in(self.phases, g.device, images_l, labels_l, host_u)
        images_u_d = images_u if d.device == g.device else copy_in(self.phases, d.device, host_u)[0]
        images_gt, labels_gt = copy_in(self.phases, d.device, images_gt, labels_gt)
        g.module.train()
        d.module.train()

        # ---- G, with D frozen: the labeled CE (forward, backward), then the unlabeled terms
        # (forward, backward); the gradients add up, one step follows.
        with phase("g_fwd_bwd", g.device):
            loss_seg = masked_cross_entropy(generator_logits(g, images_l), labels_l, ignore)
            g.opt.backward(loss_seg)
            logits_u = generator_logits(g, images_u)
            probs_u = logits_u.softmax(dim=1)
        probs_u_d = hand_over(self.phases, probs_u, g, d)
        with phase("g_fwd_bwd", g.device):
            fake = torch.cat([probs_u_d, unit_range(images_u_d)], dim=1)
            real = torch.cat([one_hot_labels(labels_gt, self.num_classes, labels_gt != ignore),
                              unit_range(images_gt)], dim=1)
            fake_logits, fake_features = discriminator_view(d, fake, return_features=True)
            with torch.no_grad():  # D frozen and real maps constant: nothing to differentiate
                _, real_features = discriminator_view(d, real, return_features=True)
            loss_fm = feature_matching(real_features, fake_features)
            scores = to_device(torch.sigmoid(fake_logits.detach().float()).squeeze(1), g.device)
            pseudo, selected = selected_pseudo_labels(logits_u, scores, s.threshold, ignore)
            loss = s.lambda_fm * to_device(loss_fm, g.device)
            loss_st = empty_st = torch.zeros((), device=g.device)  # 0 while off
            if self.st_active(step):
                loss_st = masked_cross_entropy(logits_u, pseudo, ignore)
                empty_st = empty_selection(selected)
                loss = loss + s.lambda_st * loss_st
            g.opt.backward(loss)
        optimizer_step(self.phases, g)

        # ---- D: the unlabeled maps as fake, the gt stream's as real; the mean of the two. As in
        # the reference, fake then real, each its own forward (and here its own backward); one step.
        (loss_fake, (logits_fake,)), (loss_real, (logits_real,)) = [
            discriminator_backward(self.phases, d, [DiscriminatorBatch(maps, label)], weight=0.5)
            for maps, label in ((fake, LABELS.fake), (real, LABELS.real))]
        optimizer_step(self.phases, d)
        return {
            "loss_seg": loss_seg.detach(),
            "loss_fm": loss_fm.detach(),
            "loss_st": loss_st.detach(),
            "loss_d": loss_fake + loss_real,
            "st_image_ratio": selected.float().mean(),
            "d_acc_real": d_accuracy(logits_real, LABELS.real),
            "d_acc_fake": d_accuracy(logits_fake, LABELS.fake),
            EMPTY_PREFIX + "loss_seg": empty_selection(labels_l != ignore),
            EMPTY_PREFIX + "loss_st": empty_st,
        }
