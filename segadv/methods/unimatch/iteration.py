"""UniMatch (V1) and UniMatch V2: weak-to-strong consistency with feature perturbation, with
AdvSemiSeg's D on top as one key.

Each iteration draws a labeled batch (x, y) and an unlabeled batch u (V1 also a second one, u'),
as the references' loops (LiheYoung/UniMatch ``unimatch.py`` at 0324f3d; LiheYoung/UniMatch-V2
``unimatch_v2.py`` at f6afb4d; line numbers there):

V1                                                                        [unimatch.py]
    p', c' = argmax / max softmax G_eval(u'),  no_grad                    [pseudo labels of u', 135-140]
    s1, s2 = strong(u), strong(u);  s_k <- box_k ? strong(u')_k : s_k     [views, CutMix, 142-145]
    (G(x), G(u)), (G_fp(x), G_fp(u)) = G([x, u], features and Dropout2d(0.5) copy)     [151-153]
    p, c = argmax / max softmax G(u), detached                            [157-159]
    CE_k = mean(CE(G(s_k), box_k ? p' : p) * [conf >= 0.95])              [161-182]
    loss = (CE(G(x), y) + 0.25 CE_1 + 0.25 CE_2 + 0.5 mean(CE(G_fp(u), p) * [c >= 0.95])) / 2   [184-188]
V2                                                                        [unimatch_v2.py]
    p, c = argmax / max softmax T(u),  T the EMA teacher in eval mode     [88-89, 170-173]
    s1, s2 = strong(u), strong(u);  s_k <- box_k ? flip(s_k) : s_k        [the batch's reverse, 175-176]
    G(s1), G(s2) with complementary channel dropout across the two views  [178-179, dpt.py 141-165]
    loss = (CE(G(x), y) + (CE_1 + CE_2) / 2) / 2                          [181-204]
    G steps; T <- r T + (1 - r) G, r = min(1 - 1/(i+1), 0.996), parameters and buffers   [221-226]
  + lambda_adv * GAN(D(softmax G(u)), real)     D on top (lambda_adv > 0): G's weak-view maps

Each forward of G is followed by its own backward (DDP expects one backward per forward; the
gradients add up and one step follows). The views, boxes and dropout masks come from the method's
own ``torch.Generator`` (seeded from ``train.seed`` and the rank, saved with the run). Nothing reads
a tensor on the host: the confidence masks stay device tensors.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F

from segadv.data.resumable import derived_seed
from segadv.data.streams import Stream
from segadv.engine.losses import EMPTY_PREFIX, empty_selection, masked_cross_entropy
from segadv.engine.network import Network
from segadv.errors import UserError
from segadv.methods import mixing
from segadv.methods.adversarial import (
    GROUND_TRUTH_REAL,
    copy_in,
    discriminator_view,
    gan_loss,
    generator_logits,
    hand_over,
    optimizer_step,
    realness,
    semi_supervised_discriminator_update,
)
from segadv.methods.base import TrainingViews
from segadv.methods.ema_teacher import EMATeacher
from segadv.methods.method_rng import MixingRNG, this_rank
from segadv.methods.schedule import Schedule
from segadv.methods.unimatch import views
from segadv.methods.unimatch.declaration import UniMatchSetup, UniMatchSpec
from segadv.monitor.profile import PhaseTimer
from segadv.parallel.placement import to_device

VIEWS_SEED_WORD = 59  # the views' RNG's seed: derived from train.seed, this word and the rank
# The references' loss weights, as their code sums them (unimatch.py 188, unimatch_v2.py 202-204).
V1_WEIGHTS = {"strong": 0.25, "fp": 0.5}  # each strong view 0.25, the perturbed stream 0.5; all / 2
V2_WEIGHTS = {"strong": 0.5, "fp": 0.0}  # the two views' mean; all / 2


def confident_cross_entropy(logits: torch.Tensor, pseudo: torch.Tensor, confidence: torch.Tensor,
                            threshold: float) -> torch.Tensor:
    """The references' unlabeled loss: per-pixel CE against the pseudo labels where their confidence
    reaches ``threshold``, summed and divided by the count of pixels (every pixel: the reference
    divides by those not padded, and segadv's unlabeled crops carry no padding mask)."""
    loss = F.cross_entropy(logits, pseudo, reduction="none")
    return (loss * (confidence >= threshold)).sum() / pseudo.numel()


def paste(box: torch.Tensor, inside: torch.Tensor, outside: torch.Tensor) -> torch.Tensor:
    """``inside`` in each image's box, ``outside`` elsewhere (images or per-pixel maps)."""
    return mixing.mix(box, inside, outside)


class UniMatch(UniMatchSpec):
    def __init__(self, setup: UniMatchSetup, nets: Mapping[str, Network], phases: PhaseTimer) -> None:
        """``nets``: G, V2's ``teacher`` (its EMA: no optimizer) and ``discriminator`` where
        ``setup.lambda_adv`` > 0."""
        self.g, self.teacher, self.d, self.phases = nets["generator"], nets.get("teacher"), nets.get("discriminator"), phases
        self.settings = settings = setup.settings
        self.v2 = settings.variant == "v2"
        if self.v2 and self.teacher is None:
            raise ValueError("UniMatch V2 needs its EMA teacher (the teacher role)")
        self.weights = V2_WEIGHTS if self.v2 else V1_WEIGHTS
        self.num_classes, self.ignore_index = setup.num_classes, setup.ignore_index
        self.mean, self.std = setup.mean, setup.std
        self.lambda_adv = setup.lambda_adv
        self.schedule = Schedule(adversarial=(setup.lambda_adv, 0))
        if self.schedule.active("adversarial", 0) and self.d is None:
            raise ValueError("loss.lambda_adv > 0 needs UniMatch's discriminator")
        self.rank = this_rank()
        # On the host: its draws are copied to G's device pinned and non_blocking (mixing.py).
        self.generator = torch.Generator().manual_seed(derived_seed(setup.seed, VIEWS_SEED_WORD, self.rank))
        self.feature_channels: Sequence[int] = self.g.bare.feature_channels()
        self.views: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None  # training_views()
        # V2's EMA of every parameter and floating buffer (BatchNorm's statistics: its teacher
        # predicts in eval mode with them).
        self.ema = EMATeacher(self.teacher, self.g, phases, buffers=True) if self.v2 else None

    def discriminator_realness(self, images: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        if self.d is None:
            return None
        return realness(self.d, logits.softmax(dim=1), GROUND_TRUTH_REAL)

    def checkpoint_state(self) -> Mapping[str, Any]:
        return {"mixing_rng": MixingRNG(self.generator, self.rank)}

    def training_views(self) -> Optional[TrainingViews]:
        """The last iteration's first strong view as G saw it (its CutMix box pasted), the labels
        its loss read (the pasted image's inside the box; ignore where not confident) and each
        pixel's weight (1 where confident): ``train/mixed_batch``. None before the first iteration."""
        if self.views is None:
            return None
        images, labels, weight = self.views
        return TrainingViews(images, labels, weight, titles=("strong view 1", "pseudo label", "confident"))

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        g, phase = self.g, self.phases.phase
        self.views = None  # the last batch's, let go before this one's tensors are made
        images_x, labels_x = streams["labeled"].next()
        images_u = self.unlabeled_images(streams["unlabeled"])
        images_x, labels_x, images_u = copy_in(self.phases, g.device, images_x, labels_x, images_u)
        images_mix = None
        if not self.v2:
            images_mix = copy_in(self.phases, g.device, self.unlabeled_images(streams["unlabeled_mix"]))[0]
            if images_mix.shape != images_u.shape:
                raise UserError(f"method.unimatch v1 pastes one unlabeled image into another: their batches must "
                                f"match, got {tuple(images_u.shape)} and {tuple(images_mix.shape)}")

        # ---- the pseudo labels of the image pasted into each view: V1 G's own (eval mode) on the
        # second batch, V2 the teacher's on the batch (reversed when pasted)
        if self.v2:
            pseudo_w, confidence_w = self.teacher_labels(images_u)
            pseudo_in, confidence_in = pseudo_w.flip(0), confidence_w.flip(0)
        else:
            pseudo_in, confidence_in = self.own_labels(images_mix)

        # ---- the strong views and their CutMix boxes
        with phase("g_fwd_bwd", g.device), torch.no_grad():
            batch, shape = images_u.shape[0], tuple(images_u.shape[2:])
            strong = [views.strong_view(images_u, self.generator, mean=self.mean, std=self.std) for _ in range(2)]
            if self.v2:
                pasted = [s.flip(0) for s in strong]
            else:
                pasted = [views.strong_view(images_mix, self.generator, mean=self.mean, std=self.std) for _ in range(2)]
            boxes = [views.cutmix_boxes(batch, shape, self.generator, g.device) for _ in range(2)]
            strong = [paste(box, inside, view) for box, inside, view in zip(boxes, pasted, strong)]
        g.module.train()
        losses: dict[str, torch.Tensor] = {}

        # ---- the labeled batch (V1: with the weak view and its perturbed features, in one forward)
        with phase("g_fwd_bwd", g.device):
            if self.v2:
                logits_x = generator_logits(g, images_x)
                loss_x = masked_cross_entropy(logits_x, labels_x, self.ignore_index)
                g.opt.backward(loss_x / 2.0)
            else:
                scales = views.dropout_scales(len(images_x) + batch, self.feature_channels, self.generator, g.device)
                with g.opt.autocast():
                    clean, perturbed = g.module(torch.cat((images_x, images_u)), feature_scales=scales,
                                                with_unperturbed=True)
                logits_x, logits_w = clean.float().split([len(images_x), batch])
                logits_fp = perturbed.float()[len(images_x):]
                confidence_w, pseudo_w = mixing.teacher_confidence(logits_w)
                loss_x = masked_cross_entropy(logits_x, labels_x, self.ignore_index)
                loss_fp = confident_cross_entropy(logits_fp, pseudo_w, confidence_w, self.settings.confidence)
                loss = (loss_x + self.weights["fp"] * loss_fp) / 2.0
                if self.adversarial(step):
                    loss_adv, probs_u = self.adversarial_loss(logits_w)
                    loss = loss + self.lambda_adv * loss_adv
                    losses["loss_adv"] = loss_adv.detach()
                g.opt.backward(loss)
                losses["loss_fp"] = loss_fp.detach()
                losses[EMPTY_PREFIX + "loss_fp"] = empty_selection(confidence_w >= self.settings.confidence)
            probs_x = logits_x.detach().softmax(dim=1)  # D's labeled maps
        losses["loss_seg"] = loss_x.detach()
        losses[EMPTY_PREFIX + "loss_seg"] = empty_selection(labels_x != self.ignore_index)

        # ---- the pseudo labels of each view: the weak view's, the pasted image's inside the box
        with torch.no_grad():
            threshold = self.settings.confidence
            pseudo = [paste(box, pseudo_in, pseudo_w) for box in boxes]
            confidence = [paste(box, confidence_in, confidence_w) for box in boxes]
            losses["pseudo_confidence"] = (confidence_w >= threshold).float().mean()
            confident = confidence[0] >= threshold
            self.views = (strong[0], torch.where(confident, pseudo[0], self.ignore_index), confident.float())

        # ---- the two strong views in one forward (V2: complementary channel dropout across them)
        with phase("g_fwd_bwd", g.device):
            both = torch.cat(strong)
            with g.opt.autocast():
                if self.v2:
                    scales = views.complementary_scales(batch, self.feature_channels, self.generator, g.device)
                    logits_s = g.module(both, feature_scales=scales)
                else:
                    logits_s = g.module(both)
            logits_s1, logits_s2 = logits_s.float().chunk(2)
            loss_s1 = confident_cross_entropy(logits_s1, pseudo[0], confidence[0], threshold)
            loss_s2 = confident_cross_entropy(logits_s2, pseudo[1], confidence[1], threshold)
            g.opt.backward(self.weights["strong"] * (loss_s1 + loss_s2) / 2.0)
        losses["loss_strong"] = ((loss_s1 + loss_s2) / 2.0).detach()
        losses[EMPTY_PREFIX + "loss_strong"] = empty_selection(confident, confidence[1] >= threshold)

        if self.v2 and self.adversarial(step):  # V2's student never predicts the weak view: D's own forward
            with phase("g_fwd_bwd", g.device):
                loss_adv, probs_u = self.adversarial_loss(generator_logits(g, images_u))
                g.opt.backward(self.lambda_adv * loss_adv)
            losses["loss_adv"] = loss_adv.detach()
        optimizer_step(self.phases, g)
        if self.v2 and g.opt.micro_batches == 0:  # G stepped (the last micro-batch of an accumulated step)
            self.update_teacher(step)

        if self.adversarial(step):
            losses["loss_d"], losses[EMPTY_PREFIX + "loss_d"] = semi_supervised_discriminator_update(
                self.phases, g, self.d, streams["gt"], probs_x, labels_x, probs_u,
                num_classes=self.num_classes, ignore_index=self.ignore_index)
        return losses

    @staticmethod
    def unlabeled_images(stream: Stream) -> torch.Tensor:
        batch = stream.next()  # images only: the unlabeled labels are never read
        return batch[0] if isinstance(batch, (tuple, list)) else batch

    def adversarial(self, step: int) -> bool:
        return self.schedule.active("adversarial", step)

    def adversarial_loss(self, logits_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """AdvSemiSeg's term on G's weak-view maps, D frozen, on G's device; and the maps on D's
        device, detached, for D's update."""
        probs_u = hand_over(self.phases, logits_w.softmax(dim=1), self.g, self.d)
        loss_adv = gan_loss(discriminator_view(self.d, probs_u), GROUND_TRUTH_REAL.real)
        return to_device(loss_adv, self.g.device), probs_u.detach()

    # ------------------------------------------------------------------ the pseudo labels

    @torch.no_grad()
    def own_labels(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """V1: G's own argmax and top probability in eval mode (unimatch.py 135-140: running
        BatchNorm statistics, dropout off), G back in training mode after."""
        g = self.g
        with self.phases.phase("g_fwd_bwd", g.device):
            g.module.eval()
            logits = generator_logits(g, images)
            g.module.train()
            confidence, pseudo = mixing.teacher_confidence(logits)
        return pseudo, confidence

    def teacher_labels(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """V2: the EMA teacher's argmax and top probability in eval mode (unimatch_v2.py 88-89,
        170-173), on its own devices and autocast, handed to G's device."""
        self.teacher.module.eval()
        return self.ema.labels(images)

    def update_teacher(self, step: int) -> None:
        """V2's EMA after G's step ``step`` (unimatch_v2.py 221-226: ``min(1 - 1/(iters+1), 0.996)``,
        0-based; ``EMATeacher.update``)."""
        self.ema.update(mixing.ema_decay(step, self.settings.ema_decay, warmup=True))
