"""What every adversarial method does, whatever its paper: the batch onto the networks' devices,
G's forward under its autocast, D's frozen view of G's maps for G's loss, D's update on fake
against real maps, the optimizer steps and the GAN losses, with one label convention.

Networks may live on different devices: a method moves G's maps to D's device in the forward and
the adversarial gradient returns to G's device through autograd. Nothing here reads a tensor on
the host: losses come back as detached tensors, read at log time. Each piece marks its phase of
the iteration (segadv/monitor/profile.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from segadv.engine.losses import empty_selection, masked_bce_with_logits, one_hot_labels
from segadv.engine.network import Network
from segadv.methods.schedule import Schedule
from segadv.monitor.profile import PhaseTimer, transfer_device
from segadv.parallel.placement import to_device

if TYPE_CHECKING:
    from segadv.data.streams import Stream
    from segadv.methods.supervised.declaration import SupervisedSetup


@dataclass(frozen=True)
class Labels:
    """D's targets. One convention in every method: ``real`` is what G's output is pushed towards
    (ground truth maps, the source domain), ``fake`` is G's output (its predictions, the target
    domain). The values are each paper's reference implementation's."""

    real: float
    fake: float


GROUND_TRUTH_REAL = Labels(real=1.0, fake=0.0)  # AdvSemiSeg (Hung et al.): ground truth 1, prediction 0
SOURCE_REAL = Labels(real=0.0, fake=1.0)  # AdaptSegNet, ADVENT (Tsai et al., Vu et al.): source 0, target 1


def gan_loss(
    logits: torch.Tensor, label: float, valid: Optional[torch.Tensor] = None, kind: str = "bce"
) -> torch.Tensor:
    """D's (N,1,H,W) logits against a constant label: BCE with logits, averaged over the ``valid``
    (N,H,W) pixels where given, else over every pixel; or least squares (``ls``: MSE of the raw
    logits, every pixel)."""
    if valid is not None:
        if kind != "bce":
            raise ValueError(f"a pixel mask needs the BCE GAN loss, not {kind!r}")
        return masked_bce_with_logits(logits, label, valid)
    logits = logits.float()
    target = torch.full_like(logits, label)
    if kind == "ls":
        return F.mse_loss(logits, target)
    return F.binary_cross_entropy_with_logits(logits, target)


# ---------------------------------------------------------------------------- moving tensors


def copy_in(phases: PhaseTimer, device: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """The loader's tensors onto a network's device (host-to-device copies run on the target's stream)."""
    with phases.phase("input_copy", transfer_device(tensors[0].device, device)):
        return [to_device(t, device) for t in tensors]


def hand_over(phases: PhaseTimer, maps: torch.Tensor, source: Network, target: Network) -> torch.Tensor:
    """G's maps onto D's device, in the forward (autograd brings the gradient back)."""
    with phases.phase("transfer", transfer_device(source.device, target.device)):
        return to_device(maps, target.device)


# ---------------------------------------------------------------------------- forwards


def generator_logits(
    g: Network, images: torch.Tensor, *, return_aux: bool = False, module: Optional[nn.Module] = None
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """G's forward under its own autocast; float32 logits (losses and softmax in full precision),
    a (main, aux) tuple with ``return_aux``. ``module``: G as evaluated (default: as trained)."""
    module = g.module if module is None else module
    with g.opt.autocast():
        out = module(images, return_aux=True) if return_aux else module(images)
    return tuple(o.float() for o in out) if return_aux else out.float()


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """Stop gradients reaching ``module``'s parameters (they still flow through to its input)."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def discriminator_view(d: Network, maps: torch.Tensor, **forward_kwargs) -> Any:
    """D's logits on G's maps for G's loss: D frozen, so the gradient reaches only G.
    ``forward_kwargs`` go to D's forward (the image-level D's ``return_features``).

    Through the bare module: a frozen D must not take part in D's wrapper's gradient sync.
    """
    with frozen(d.bare), d.opt.autocast():
        return d.bare(maps, **forward_kwargs)


@torch.no_grad()
def realness(d: Network, maps: torch.Tensor, labels: Labels) -> torch.Tensor:
    """D's probability that ``maps`` (moved to D's device) are on ``labels.real``'s side, per D
    output, float32 on D's device: what ``Method.discriminator_realness`` returns. The maps are
    given to D in float32, as training's ``generator_logits`` gives them: an evaluation's G may
    return its autocast dtype, which a float32 D's convolution refuses (D's own autocast, where on,
    casts them as before)."""
    with d.opt.autocast():
        probability = torch.sigmoid(d.bare(to_device(maps, d.device).float()).float())
    return probability if labels.real == 1.0 else 1.0 - probability


# ---------------------------------------------------------------------------- updates


@dataclass
class DiscriminatorBatch:
    """Maps D learns to tell apart: G's (detached) maps labelled fake, or real maps labelled real."""

    maps: torch.Tensor  # (N,C,H,W) on D's device
    label: float  # a Labels value
    valid: Optional[torch.Tensor] = None  # (N,H,W) pixels its loss averages over; None: every pixel


def discriminator_backward(
    phases: PhaseTimer, d: Network, batches: Sequence[DiscriminatorBatch], *, weight: float = 1.0, kind: str = "bce"
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """D's forward over ``batches`` together, ``weight`` times the sum of their GAN losses, backward.
    Returns the detached loss and D's detached logits per batch.

    One forward over fake and real together: DDP expects one forward per backward, and D has no
    batch statistics, so this equals separate forwards.
    """
    with phases.phase("d_fwd_bwd", d.device):
        maps = [b.maps.detach() for b in batches]
        with d.opt.autocast():
            logits = d.module(maps[0] if len(maps) == 1 else torch.cat(maps)).split([len(m) for m in maps])
        losses = [gan_loss(out, b.label, b.valid, kind) for out, b in zip(logits, batches)]
        loss = losses[0]
        for term in losses[1:]:
            loss = loss + term
        loss = weight * loss
        d.opt.backward(loss)
    return loss.detach(), [out.detach() for out in logits]


def optimizer_step(phases: PhaseTimer, net: Network) -> None:
    """The network's optimizer step (skipped on inf/nan gradients), scale update, LR step."""
    with phases.phase("optimizer", net.device):
        net.opt.step()


def semi_supervised_discriminator_update(phases: PhaseTimer, g: Network, d: Network, gt: Stream,
                                         probs_l: torch.Tensor, labels_l: torch.Tensor, probs_u: torch.Tensor, *,
                                         num_classes: int, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """D on top of a self-training method, as AdvSemiSeg trains it: G's labeled maps ``probs_l``
    (on G's device; their ``labels_l`` mark the valid pixels) and unlabeled maps ``probs_u`` (on
    D's device) as fake, the ``gt`` stream's one-hot labels as real, each half weighted 1/2, one
    forward and backward, D's step. Returns D's detached loss and its ``empty/loss_d`` (a half
    with no valid pixel)."""
    d.module.train()
    probs_l_d = hand_over(phases, probs_l, g, d)
    _, labels_gt = gt.next()  # only its labels: D's real maps
    (labels_gt, labels_l_d) = copy_in(phases, d.device, labels_gt, labels_l)
    with phases.phase("d_fwd_bwd", d.device):
        valid_gt = labels_gt != ignore_index
        valid_l = labels_l_d != ignore_index
        real = one_hot_labels(labels_gt, num_classes, valid_gt)
        fake = torch.cat([probs_l_d, probs_u])
        valid_fake = torch.cat([valid_l, torch.ones_like(valid_l[:1]).expand(len(probs_u), -1, -1)])
    loss_d, _ = discriminator_backward(phases, d, [DiscriminatorBatch(fake, GROUND_TRUTH_REAL.fake, valid_fake),
                                                   DiscriminatorBatch(real, GROUND_TRUTH_REAL.real, valid_gt)],
                                       weight=0.5)
    optimizer_step(phases, d)
    return loss_d, empty_selection(valid_fake, valid_gt)


# ---------------------------------------------------------------------------- methods


class LabeledAdversarial:
    """What the supervised method and AdvSemiSeg share: G, its pixel-level D and the phase timer,
    the label space, the labeled adversarial term (``loss.*``: ``lambda_adv`` times D's GAN loss
    on G's labeled maps, from step ``adv_warmup_steps`` on), and D's update on G's maps against
    one-hot ground truth (``GROUND_TRUTH_REAL``)."""

    def __init__(self, setup: SupervisedSetup, nets: Mapping[str, Network], phases: PhaseTimer) -> None:
        self.g, self.d, self.phases = nets["generator"], nets["discriminator"], phases
        self.num_classes = setup.num_classes
        self.ignore_index = setup.ignore_index
        self.lambda_adv = setup.lambda_adv
        self.schedule = Schedule(adversarial=(setup.lambda_adv, setup.adv_warmup_steps))

    def adversarial_active(self, step: int) -> bool:
        return self.schedule.active("adversarial", step)

    def discriminator_realness(self, images: torch.Tensor, logits: torch.Tensor) -> Optional[torch.Tensor]:
        """D's probability that G's softmax maps are ground truth (``Method.discriminator_realness``)."""
        return realness(self.d, logits.softmax(dim=1), GROUND_TRUTH_REAL)

    def labeled_batch(
        self, images: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """An iteration's start: the images onto G's device, their labels onto G's and D's (one
        copy per distinct device), G and D in training mode. Returns ``(images, labels on G's
        device, labels on D's, their valid pixels on D's)``."""
        images, labels_g = copy_in(self.phases, self.g.device, images, labels)
        labels_d = labels_g if self.d.device == self.g.device else copy_in(self.phases, self.d.device, labels)[0]
        valid_d = labels_d != self.ignore_index
        self.g.module.train()
        self.d.module.train()
        return images, labels_g, labels_d, valid_d

    def update_discriminator(
        self, fake: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, *,
        valid_fake: Optional[torch.Tensor] = None, weight: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """D's update: G's maps ``fake`` against the one-hot ``labels`` as real (``valid``: their
        pixels; ``valid_fake``: fake's, by default the same), all on D's device, ``weight`` times
        the sum of the two GAN losses; then D's step. Returns D's detached loss and its detached
        logits on the fake and the real maps."""
        with self.phases.phase("d_fwd_bwd", self.d.device):
            real = one_hot_labels(labels, self.num_classes, valid)
        loss_d, (fake_logits, real_logits) = discriminator_backward(self.phases, self.d, [
            DiscriminatorBatch(fake, GROUND_TRUTH_REAL.fake, valid if valid_fake is None else valid_fake),
            DiscriminatorBatch(real, GROUND_TRUTH_REAL.real, valid)], weight=weight)
        optimizer_step(self.phases, self.d)
        return loss_d, fake_logits, real_logits
