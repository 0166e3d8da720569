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

``UniMatchV1`` and ``UniMatchV2`` each run their reference's loop, top to bottom; ``UniMatch``
holds what they share (the strong views and their boxes, each view's pseudo labels, the strong
views' loss, D on top and its update). Each forward of G is followed by its own backward (DDP
expects one backward per forward; the gradients add up and one step follows). The views, boxes and
dropout masks come from the method's own ``torch.Generator`` (seeded from ``train.seed`` and the
rank, saved with the run). Nothing reads a tensor on the host: the confidence masks stay device
tensors.
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
from segadv.methods.unimatch.declaration import UniMatchSetup, UniMatchSpec, UniMatchV1Spec, UniMatchV2Spec
from segadv.monitor.profile import PhaseTimer
from segadv.parallel.placement import to_device

VIEWS_SEED_WORD = 59  # the views' RNG's seed: derived from train.seed, this word and the rank
# The references' loss weights, as their code sums them (unimatch.py 188, unimatch_v2.py 202-204).
V1_WEIGHTS = {"strong": 0.25, "fp": 0.5}  # each strong view 0.25, the perturbed stream 0.5; all / 2
V2_WEIGHTS = {"strong": 0.5}  # the two views' mean; all / 2


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
    """What the two references' iterations share: G, D on top and its update, the views' RNG (saved
    with the run), the two strong views with their CutMix boxes, each view's pseudo labels and the
    strong views' loss. ``UniMatchV1`` and ``UniMatchV2`` each run their reference's loop."""

    def __init__(self, setup: UniMatchSetup, nets: Mapping[str, Network], phases: PhaseTimer) -> None:
        """``nets``: G and ``discriminator`` where ``setup.lambda_adv`` > 0 (and what the
        reference's own iteration takes besides)."""
        self.g, self.d, self.phases = nets["generator"], nets.get("discriminator"), phases
        self.settings = setup.settings
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

    def batches(self, streams: Mapping[str, Stream]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The labeled batch and the unlabeled images, on G's device."""
        images_x, labels_x = streams["labeled"].next()
        images_u = self.unlabeled_images(streams["unlabeled"])
        images_x, labels_x, images_u = copy_in(self.phases, self.g.device, images_x, labels_x, images_u)
        return images_x, labels_x, images_u

    @staticmethod
    def unlabeled_images(stream: Stream) -> torch.Tensor:
        batch = stream.next()  # images only: the unlabeled labels are never read
        return batch[0] if isinstance(batch, (tuple, list)) else batch

    # ------------------------------------------------------------------ the strong views

    def strong_views(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Two strong views of ``images`` (``views.strong_view``), from the views' RNG."""
        return [views.strong_view(images, self.generator, mean=self.mean, std=self.std) for _ in range(2)]

    def cutmix_boxes(self, images: torch.Tensor) -> list[torch.Tensor]:
        """One CutMix box per image for each of the two views (``views.cutmix_boxes``)."""
        batch, shape = images.shape[0], tuple(images.shape[2:])
        return [views.cutmix_boxes(batch, shape, self.generator, self.g.device) for _ in range(2)]

    @torch.no_grad()
    def view_labels(self, boxes: Sequence[torch.Tensor], weak: tuple[torch.Tensor, torch.Tensor],
                    pasted: tuple[torch.Tensor, torch.Tensor], strong: Sequence[torch.Tensor],
                    losses: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each view's pseudo labels and confidence: the pasted image's (``pasted``) inside its box,
        the weak view's (``weak``) elsewhere; logs the weak view's confident share and keeps the first
        view for the panel."""
        pseudo_w, confidence_w = weak
        pseudo_in, confidence_in = pasted
        threshold = self.settings.confidence
        pseudo = [paste(box, pseudo_in, pseudo_w) for box in boxes]
        confidence = [paste(box, confidence_in, confidence_w) for box in boxes]
        losses["pseudo_confidence"] = (confidence_w >= threshold).float().mean()
        confident = confidence[0] >= threshold
        self.views = (strong[0], torch.where(confident, pseudo[0], self.ignore_index), confident.float())
        return pseudo, confidence

    def strong_loss(self, logits_s: torch.Tensor, pseudo: Sequence[torch.Tensor], confidence: Sequence[torch.Tensor],
                    weight: float, losses: dict[str, torch.Tensor]) -> None:
        """The two strong views' confident CEs (``logits_s``: G's logits of both views in one batch)
        backpropagated through G, each weighted ``weight`` in the references' total, which is halved:
        ``weight * (CE_1 + CE_2) / 2``; logs their mean."""
        threshold = self.settings.confidence
        logits_s1, logits_s2 = logits_s.float().chunk(2)
        loss_s1 = confident_cross_entropy(logits_s1, pseudo[0], confidence[0], threshold)
        loss_s2 = confident_cross_entropy(logits_s2, pseudo[1], confidence[1], threshold)
        self.g.opt.backward(weight * (loss_s1 + loss_s2) / 2.0)
        losses["loss_strong"] = ((loss_s1 + loss_s2) / 2.0).detach()
        losses[EMPTY_PREFIX + "loss_strong"] = empty_selection(confidence[0] >= threshold, confidence[1] >= threshold)

    # ------------------------------------------------------------------ D on top

    def adversarial(self, step: int) -> bool:
        return self.schedule.active("adversarial", step)

    def adversarial_loss(self, logits_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """AdvSemiSeg's term on G's weak-view maps, D frozen, on G's device; and the maps on D's
        device, detached, for D's update."""
        probs_u = hand_over(self.phases, logits_w.softmax(dim=1), self.g, self.d)
        loss_adv = gan_loss(discriminator_view(self.d, probs_u), GROUND_TRUTH_REAL.real)
        return to_device(loss_adv, self.g.device), probs_u.detach()

    def update_discriminator(self, streams: Mapping[str, Stream], probs_x: torch.Tensor, labels_x: torch.Tensor,
                             probs_u: torch.Tensor, losses: dict[str, torch.Tensor]) -> None:
        """AdvSemiSeg's D update: G's labeled and weak-view maps fake, the ``gt`` stream's one-hot
        labels real; logs D's loss."""
        losses["loss_d"], losses[EMPTY_PREFIX + "loss_d"] = semi_supervised_discriminator_update(
            self.phases, self.g, self.d, streams["gt"], probs_x, labels_x, probs_u,
            num_classes=self.num_classes, ignore_index=self.ignore_index)


class UniMatchV1(UniMatch, UniMatchV1Spec):
    """UniMatch's loop (unimatch.py 106-188): G labels the weak view itself, a second unlabeled
    batch is pasted into the strong views, and one forward of ``[x, u]`` gives the clean logits and
    the logits of the features' ``Dropout2d(0.5)`` copy."""

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        g, phase = self.g, self.phases.phase
        self.views = None  # the last batch's, let go before this one's tensors are made
        images_x, labels_x, images_u = self.batches(streams)
        images_mix = copy_in(self.phases, g.device, self.unlabeled_images(streams["unlabeled_mix"]))[0]
        if images_mix.shape != images_u.shape:
            raise UserError(f"method.unimatch v1 pastes one unlabeled image into another: their batches must "
                            f"match, got {tuple(images_u.shape)} and {tuple(images_mix.shape)}")
        batch = images_u.shape[0]

        # ---- G's own pseudo labels of the second batch, in eval mode (135-140)
        pseudo_mix, confidence_mix = self.own_labels(images_mix)

        # ---- two strong views of each batch; the second's pasted into the first's boxes (142-145)
        with phase("g_fwd_bwd", g.device), torch.no_grad():
            strong = self.strong_views(images_u)
            pasted = self.strong_views(images_mix)
            boxes = self.cutmix_boxes(images_u)
            strong = [paste(box, inside, view) for box, inside, view in zip(boxes, pasted, strong)]
        g.module.train()
        losses: dict[str, torch.Tensor] = {}

        # ---- [x, u] in one forward, clean and with the features' Dropout2d copy (151-159, 184-188):
        # the labeled CE, the weak view's pseudo labels, the perturbed stream's CE, D on top
        with phase("g_fwd_bwd", g.device):
            scales = views.dropout_scales(len(images_x) + batch, self.feature_channels, self.generator, g.device)
            with g.opt.autocast():
                clean, perturbed = g.module(torch.cat((images_x, images_u)), feature_scales=scales,
                                            with_unperturbed=True)
            logits_x, logits_w = clean.float().split([len(images_x), batch])
            logits_fp = perturbed.float()[len(images_x):]
            confidence_w, pseudo_w = mixing.teacher_confidence(logits_w)
            loss_x = masked_cross_entropy(logits_x, labels_x, self.ignore_index)
            loss_fp = confident_cross_entropy(logits_fp, pseudo_w, confidence_w, self.settings.confidence)
            loss = (loss_x + V1_WEIGHTS["fp"] * loss_fp) / 2.0
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

        # ---- each view's pseudo labels: the second batch's inside the box, the weak view's elsewhere
        pseudo, confidence = self.view_labels(boxes, (pseudo_w, confidence_w), (pseudo_mix, confidence_mix),
                                              strong, losses)

        # ---- the two strong views in one forward, each CE weighted 0.25 (155, 161-182, 188)
        with phase("g_fwd_bwd", g.device):
            both = torch.cat(strong)
            with g.opt.autocast():
                logits_s = g.module(both)
            self.strong_loss(logits_s, pseudo, confidence, V1_WEIGHTS["strong"], losses)
        optimizer_step(self.phases, g)

        if self.adversarial(step):
            self.update_discriminator(streams, probs_x, labels_x, probs_u, losses)
        return losses

    @torch.no_grad()
    def own_labels(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """G's own argmax and top probability in eval mode (unimatch.py 135-140: running BatchNorm
        statistics, dropout off), G back in training mode after."""
        g = self.g
        with self.phases.phase("g_fwd_bwd", g.device):
            g.module.eval()
            logits = generator_logits(g, images)
            g.module.train()
            confidence, pseudo = mixing.teacher_confidence(logits)
        return pseudo, confidence


class UniMatchV2(UniMatch, UniMatchV2Spec):
    """UniMatch V2's loop (unimatch_v2.py 152-204, the EMA 221-226): the EMA teacher labels the
    weak view, the batch reversed is pasted into the strong views, the two views share one forward
    with complementary channel dropout, and the teacher follows G after each step."""

    def __init__(self, setup: UniMatchSetup, nets: Mapping[str, Network], phases: PhaseTimer) -> None:
        """``nets``: besides UniMatch's, ``teacher``, G's EMA (no optimizer)."""
        super().__init__(setup, nets, phases)
        self.teacher = nets.get("teacher")
        if self.teacher is None:
            raise ValueError("UniMatch V2 needs its EMA teacher (the teacher role)")
        # The EMA of every parameter and floating buffer (BatchNorm's statistics: the teacher
        # predicts in eval mode with them).
        self.ema = EMATeacher(self.teacher, self.g, phases, buffers=True)

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        g, phase = self.g, self.phases.phase
        self.views = None  # the last batch's, let go before this one's tensors are made
        images_x, labels_x, images_u = self.batches(streams)
        batch = images_u.shape[0]

        # ---- the EMA teacher's pseudo labels of the weak view, in eval mode (88-89, 170-173)
        pseudo_w, confidence_w = self.teacher_labels(images_u)

        # ---- two strong views, each with the reversed batch's view pasted into its boxes (175-176)
        with phase("g_fwd_bwd", g.device), torch.no_grad():
            strong = self.strong_views(images_u)
            pasted = [s.flip(0) for s in strong]
            boxes = self.cutmix_boxes(images_u)
            strong = [paste(box, inside, view) for box, inside, view in zip(boxes, pasted, strong)]
        g.module.train()
        losses: dict[str, torch.Tensor] = {}

        # ---- the labeled CE, halved in the total (178, 202-204)
        with phase("g_fwd_bwd", g.device):
            logits_x = generator_logits(g, images_x)
            loss_x = masked_cross_entropy(logits_x, labels_x, self.ignore_index)
            g.opt.backward(loss_x / 2.0)
            probs_x = logits_x.detach().softmax(dim=1)  # D's labeled maps
        losses["loss_seg"] = loss_x.detach()
        losses[EMPTY_PREFIX + "loss_seg"] = empty_selection(labels_x != self.ignore_index)

        # ---- each view's pseudo labels: the reversed batch's inside the box, the weak view's elsewhere
        pseudo, confidence = self.view_labels(boxes, (pseudo_w, confidence_w),
                                              (pseudo_w.flip(0), confidence_w.flip(0)), strong, losses)

        # ---- the two strong views in one forward with complementary channel dropout, their CEs'
        # mean, halved in the total (179, 190-204; dpt.py 141-165)
        with phase("g_fwd_bwd", g.device):
            both = torch.cat(strong)
            with g.opt.autocast():
                scales = views.complementary_scales(batch, self.feature_channels, self.generator, g.device)
                logits_s = g.module(both, feature_scales=scales)
            self.strong_loss(logits_s, pseudo, confidence, V2_WEIGHTS["strong"], losses)

        if self.adversarial(step):  # the student never predicts the weak view: D's term has its own forward
            with phase("g_fwd_bwd", g.device):
                loss_adv, probs_u = self.adversarial_loss(generator_logits(g, images_u))
                g.opt.backward(self.lambda_adv * loss_adv)
            losses["loss_adv"] = loss_adv.detach()
        optimizer_step(self.phases, g)
        if g.opt.micro_batches == 0:  # G stepped (the last micro-batch of an accumulated step)
            self.update_teacher(step)

        if self.adversarial(step):
            self.update_discriminator(streams, probs_x, labels_x, probs_u, losses)
        return losses

    def teacher_labels(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The EMA teacher's argmax and top probability in eval mode (unimatch_v2.py 88-89,
        170-173), on its own devices and autocast, handed to G's device."""
        self.teacher.module.eval()
        return self.ema.labels(images)

    def update_teacher(self, step: int) -> None:
        """The EMA after G's step ``step`` (unimatch_v2.py 221-226: ``min(1 - 1/(iters+1), 0.996)``,
        0-based; ``EMATeacher.update``)."""
        self.ema.update(mixing.ema_decay(step, self.settings.ema_decay, warmup=True))
