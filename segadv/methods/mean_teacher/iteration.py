"""Mean teacher: self-training with an EMA teacher of G on mixed images (DACS, Tranheden et al.,
WACV 2021; French et al., BMVC 2020), with AdvSemiSeg's or AdaptSegNet's D on top as one key.

Each iteration draws a labeled batch (x_l, y_l) and an unlabeled batch x_u (semi-supervised:
``labeled`` and ``unlabeled``; adaptation: ``source`` and ``target``), as DACS's trainUDA.py
(line numbers of vikolss/DACS at cc6a87f2):

    CE(G(x_l), y_l)                                                        [supervised, 395-410]
    p, c = argmax / max softmax T(x_u)      T the teacher, no_grad         [pseudo labels, 416-422]
    M = ClassMix(y_l) or CutMix box                                        [mask, 424-435]
    x_m = strong(M * x_l + (1 - M) * x_u),  y_m = M * y_l + (1 - M) * p    [mix, jitter, blur, 437-464]
  + lambda_unsup * mean(w * CE(G(x_m), y_m)),  w = 1 on M, the confidence weight elsewhere  [466-486]
  + lambda_adv * GAN(D(softmax G(x_u)), real)                              [D on top, lambda_adv > 0]
G steps; then T <- decay * T + (1 - decay) * G                             [EMA, 508-511]
D (lambda_adv > 0): AdvSemiSeg's update (G's labeled and unlabeled maps fake, one-hot y_gt real)
or AdaptSegNet's (source maps real, target maps fake), each half weighted 1/2.

Each forward of G is followed by its own backward (DDP expects one backward per forward; the
gradients add up and one step follows), as the adaptation methods do. The mixing draws come from
the method's own ``torch.Generator`` (seeded from ``train.seed`` and the rank, saved with the run).
Nothing reads a tensor on the host: the confidence weight stays a device tensor. The last mixed
batch (its image, labels and pixel weights) is kept by reference for TensorBoard's
``train/mixed_batch`` panel (``training_views``), copied to the host only when it is drawn.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from segadv.data.resumable import derived_seed
from segadv.data.streams import Stream
from segadv.engine.losses import EMPTY_PREFIX, empty_selection, masked_cross_entropy
from segadv.engine.network import Network
from segadv.errors import UserError
from segadv.methods import mixing
from segadv.methods.method_rng import MixingRNG, this_rank
from segadv.methods.adversarial import (
    GROUND_TRUTH_REAL,
    SOURCE_REAL,
    DiscriminatorBatch,
    copy_in,
    discriminator_backward,
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
from segadv.methods.mean_teacher.declaration import MeanTeacherSetup, MeanTeacherSpec
from segadv.methods.schedule import Schedule
from segadv.monitor.profile import PhaseTimer
from segadv.parallel.placement import to_device

MIXING_SEED_WORD = 47  # the mixing RNG's seed: derived from train.seed, this word and the rank


def set_teacher_mode(module: torch.nn.Module, batchnorm: str) -> None:
    """The teacher's mode for its pseudo labels: eval mode, and with ``batch`` its BatchNorm layers
    in train mode, normalising with the batch's statistics (DACS's ``ema_model.train()``,
    trainUDA.py 265). Everything else stays in eval mode, as DAFormer's DACS module sets dropout
    and drop-path before its teacher's forward (dacs.py 263-268): DACS's DeepLab-v2 has neither,
    smp's ASPP has a dropout of 0.5, and with it on the pseudo labels would be a random draw."""
    module.eval()
    if batchnorm == "batch":
        for m in module.modules():
            if isinstance(m, _BatchNorm):
                m.train()


class MeanTeacher(MeanTeacherSpec):
    def __init__(self, setup: MeanTeacherSetup, nets: Mapping[str, Network], phases: PhaseTimer) -> None:
        """``nets``: G the student, ``teacher`` its EMA (the ``teacher`` role: no optimizer) and
        ``discriminator`` where ``setup.lambda_adv`` > 0 (``loss.lambda_adv`` as the method reads
        it, ``Method.adversarial_weight``); ``setup.adapts``: source/target streams."""
        g, teacher = nets["generator"], nets["teacher"]
        self.g, self.teacher, self.d, self.phases = g, teacher, nets.get("discriminator"), phases
        self.settings = settings = setup.settings
        self.adapts = setup.adapts
        self.labeled, self.unlabeled = ("source", "target") if setup.adapts else ("labeled", "unlabeled")
        # D's sides, as the method D comes from labels them: AdaptSegNet's source "real", AdvSemiSeg's ground truth.
        self.d_labels = SOURCE_REAL if setup.adapts else GROUND_TRUTH_REAL
        self.num_classes, self.ignore_index = setup.num_classes, setup.ignore_index
        self.aux_head = setup.aux_head
        self.mean, self.std = setup.mean, setup.std
        self.lambda_adv = setup.lambda_adv
        self.schedule = Schedule(unsup=(settings.lambda_unsup, 0), adversarial=(setup.lambda_adv, 0))
        if self.schedule.active("adversarial", 0) and self.d is None:
            raise ValueError("loss.lambda_adv > 0 needs the mean teacher's discriminator")
        self.rank = this_rank()
        # On the host: its draws are copied to G's device pinned and non_blocking (mixing.py).
        self.generator = torch.Generator().manual_seed(derived_seed(setup.seed, MIXING_SEED_WORD, self.rank))
        # DACS's EMA of the parameters, or with running BatchNorm statistics French et al.'s of
        # every float tensor (the statistics must follow the student when the teacher predicts with them).
        self.ema = EMATeacher(teacher, g, phases, buffers=settings.teacher_batchnorm == "running")
        # The last mixed batch (image, labels, pixel weights) as the loss read it: references, no copy.
        self.mixed_batch: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None

    def discriminator_realness(self, images: torch.Tensor, logits: torch.Tensor) -> Optional[torch.Tensor]:
        """D's probability that the student's softmax maps are real (ground truth; in adaptation the
        source's); None where D is off (``Method.discriminator_realness``)."""
        if self.d is None:
            return None
        return realness(self.d, logits.softmax(dim=1), self.d_labels)

    def checkpoint_state(self) -> Mapping[str, Any]:
        return {"mixing_rng": MixingRNG(self.generator, self.rank)}

    def training_views(self) -> Optional[TrainingViews]:
        """The last mixed batch: the strongly augmented mixed images, their labels (the labeled/source
        pixels pasted, the teacher's pseudo labels elsewhere) and the loss's pixel weights (1 on the
        pasted pixels, the confidence weight elsewhere), detached on G's device; None before the
        first iteration (``Method.training_views``)."""
        if self.mixed_batch is None:
            return None
        images, labels, weight = self.mixed_batch
        return TrainingViews(images.detach(), labels.detach(), weight.detach())

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        g, d, s, phase = self.g, self.d, self.settings, self.phases.phase
        self.mixed_batch = None  # the last batch's, let go before this one's tensors are made
        adversarial = self.schedule.active("adversarial", step)
        images_l, labels_l = streams[self.labeled].next()
        unlabeled = streams[self.unlabeled].next()  # images only: the unlabeled/target labels are never read
        images_u_host = unlabeled[0] if isinstance(unlabeled, (tuple, list)) else unlabeled
        if images_u_host.shape[0] != images_l.shape[0] or images_u_host.shape[2:] != images_l.shape[2:]:
            raise UserError(f"method.mean_teacher mixes one {self.labeled} image with one {self.unlabeled} image: their "
                            f"batches must match, got {tuple(images_l.shape)} and {tuple(images_u_host.shape)} (batch "
                            "sizes and crops)")
        images_l, labels_l, images_u = copy_in(self.phases, g.device, images_l, labels_l, images_u_host)
        g.module.train()
        losses: dict[str, torch.Tensor] = {}

        # ---- the supervised loss on the labeled/source batch (its forward, then its backward)
        with phase("g_fwd_bwd", g.device):
            logits_l, unused = self.student(images_l)
            loss_seg = masked_cross_entropy(logits_l, labels_l, self.ignore_index)
            probs_l = logits_l.detach().softmax(dim=1)  # D's labeled/source maps
            g.opt.backward(loss_seg + unused)
        losses["loss_seg"] = loss_seg.detach()
        losses[EMPTY_PREFIX + "loss_seg"] = empty_selection(labels_l != self.ignore_index)

        # ---- the teacher's pseudo labels on the unmixed unlabeled/target images
        pseudo, confidence = self.pseudo_labels(images_u)

        # ---- the mixed batch, its labels, its strong augmentation; the student's weighted loss
        with phase("g_fwd_bwd", g.device), torch.no_grad():
            if s.mix == "classmix":  # half the classes of each labeled/source label map, pasted
                mask = mixing.class_mix_mask(labels_l, self.generator, self.num_classes, self.ignore_index)
            else:  # one box of half the area
                mask = mixing.box_mask(len(images_l), tuple(images_l.shape[2:]), self.generator, device=g.device)
            mixed = mixing.mix(mask, images_l, images_u)
            mixed_labels = mixing.mix(mask, labels_l, pseudo)
            if s.color_jitter:
                mixed = mixing.dacs_color_jitter(mixed, self.generator, mean=self.mean, std=self.std)
            if s.blur:
                mixed = mixing.dacs_gaussian_blur(mixed, self.generator)
            pseudo_weight = self.pseudo_weight(confidence)
            pixel_weight = mixing.dacs_mixed_pixel_weight(mask, pseudo_weight)  # 1 on the pasted labeled pixels
        losses["pseudo_confidence"] = pseudo_weight.mean()
        self.mixed_batch = (mixed, mixed_labels, pixel_weight)

        if adversarial:  # the student on the unmixed unlabeled/target images, D frozen
            with phase("g_fwd_bwd", g.device):
                logits_u, unused = self.student(images_u)
                probs_u = logits_u.softmax(dim=1)
            probs_u_d = hand_over(self.phases, probs_u, g, d)
            with phase("g_fwd_bwd", g.device):
                loss_adv = gan_loss(discriminator_view(d, probs_u_d), self.d_labels.real)
                g.opt.backward(self.lambda_adv * to_device(loss_adv, g.device) + unused)
            losses["loss_adv"] = loss_adv.detach()

        with phase("g_fwd_bwd", g.device):
            logits_m, unused = self.student(mixed)
            loss_unsup = mixing.pixel_weighted_cross_entropy(logits_m, mixed_labels, pixel_weight, self.ignore_index)
            g.opt.backward(s.lambda_unsup * loss_unsup + unused)
        losses["loss_unsup"] = loss_unsup.detach()
        # its mean is over every pixel (DACS's): defined when none has a label of non-zero weight, and then 0
        losses[EMPTY_PREFIX + "loss_unsup"] = empty_selection((mixed_labels != self.ignore_index) & (pixel_weight > 0))
        optimizer_step(self.phases, g)
        if g.opt.micro_batches == 0:  # G stepped (the last micro-batch of an accumulated step)
            self.update_teacher(step)

        if adversarial:
            losses["loss_d"], losses[EMPTY_PREFIX + "loss_d"] = self.update_discriminator(
                streams, probs_l, labels_l, probs_u_d.detach())
        return losses

    def student(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float]:
        """G's main logits and, where G has an aux head (configs/uda.yaml's, for multi-level
        adaptation), its output at weight 0: the references' DeepLab-v2 has one output, and every
        parameter must take part in each backward under DDP."""
        if not self.aux_head:
            return generator_logits(self.g, images), 0.0
        main, aux = generator_logits(self.g, images, return_aux=True)
        return main, 0.0 * aux.sum()

    # ------------------------------------------------------------------ the teacher

    @torch.no_grad()
    def pseudo_labels(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's argmax and top probability on ``images``, on G's device. The teacher runs
        on its own devices, under its own autocast, with its BatchNorm as ``teacher_batchnorm`` says
        (:func:`set_teacher_mode`)."""
        set_teacher_mode(self.teacher.module, self.settings.teacher_batchnorm)
        return self.ema.labels(images)

    def pseudo_weight(self, confidence: torch.Tensor) -> torch.Tensor:
        """The pseudo labels' weight per pixel (B, H, W): DACS's share of pixels at least
        ``dacs_threshold`` confident, or French et al.'s confidence mask at ``french_threshold``;
        counted over the batch (the references'), each image, or each pixel."""
        s = self.settings
        share = s.confidence_share
        if s.confidence == "dacs" and share != "pixel":
            return mixing.dacs_pseudo_weight(confidence, s.dacs_threshold, per_image=share == "image")
        threshold = s.dacs_threshold if s.confidence == "dacs" else s.french_threshold
        if s.confidence == "french" and share == "batch":
            # French et al. test the teacher's top probability itself (conf_tea >= conf_thresh): one
            # channel holding it, so the mask's max over classes is the confidence, never 1 - it
            return mixing.french_confidence_mask(confidence[:, None], threshold).expand_as(confidence)
        confident = (confidence >= threshold).to(confidence.dtype)
        return confident if share == "pixel" else confident.mean(dim=(1, 2), keepdim=True).expand_as(confidence)

    def update_teacher(self, step: int) -> None:
        """The EMA of G after its step ``step`` (DACS trainUDA.py 508-511; ``EMATeacher.update``)."""
        self.ema.update(mixing.ema_decay(step, self.settings.ema_decay, warmup=self.settings.ema_warmup))

    # ------------------------------------------------------------------ D on top

    def update_discriminator(self, streams: Mapping[str, Stream], probs_l: torch.Tensor, labels_l: torch.Tensor,
                             probs_u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """D's update as the method it comes from: AdvSemiSeg's (G's labeled and unlabeled maps as
        fake against the ``gt`` stream's one-hot labels as real) or AdaptSegNet's (source maps real,
        target maps fake, each its own forward and backward); each half weighted 1/2. Returns D's
        detached loss and its ``empty/loss_d`` (AdaptSegNet's halves average over every pixel: 0)."""
        d = self.d
        if self.adapts:
            d.module.train()
            probs_l_d = hand_over(self.phases, probs_l, self.g, d)
            loss_source, _ = discriminator_backward(self.phases, d, [DiscriminatorBatch(probs_l_d, self.d_labels.real)],
                                                    weight=0.5)
            loss_target, _ = discriminator_backward(self.phases, d, [DiscriminatorBatch(probs_u, self.d_labels.fake)],
                                                    weight=0.5)
            optimizer_step(self.phases, d)
            return loss_source + loss_target, torch.zeros((), device=d.device)
        return semi_supervised_discriminator_update(self.phases, self.g, d, streams["gt"], probs_l, labels_l, probs_u,
                                                    num_classes=self.num_classes, ignore_index=self.ignore_index)
