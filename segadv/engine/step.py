"""The adversarial training step (AdvSemiSeg's fully supervised part).

G's update:  CE(G(x), y) + lambda_adv * BCE(D(softmax(G(x))), real), with D frozen.
D's update:  BCE(D(onehot(y)), real) + BCE(D(softmax(G(x)).detach()), fake).

G and D may live on different devices: G's probabilities and the labels move to D's device in the
forward, and the adversarial gradient returns to G's device through autograd. Nothing here calls
``.item()``: losses come back as detached tensors and are read at log time. The only host syncs
are the float16 GradScalers' inf checks (one per scaled network).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from segadv.engine.amp_optimizer import AmpOptimizer
from segadv.engine.losses import masked_bce_with_logits, one_hot_labels
from segadv.monitor.profile import PhaseTimer, transfer_device
from segadv.parallel.device_map import DeviceMap
from segadv.parallel.placement import to_device, unwrap

REAL, FAKE = 1.0, 0.0


@dataclass
class StepLosses:
    """Detached losses of one step, each on the device that computed it."""

    loss_seg: torch.Tensor
    loss_adv: torch.Tensor
    loss_d: torch.Tensor

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {"loss_seg": self.loss_seg, "loss_adv": self.loss_adv, "loss_d": self.loss_d}


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


def generator_logits(generator: nn.Module, opt_g: AmpOptimizer, images: torch.Tensor) -> torch.Tensor:
    """G's forward under its own autocast; float32 logits (losses and softmax in full precision)."""
    with opt_g.autocast():
        logits = generator(images)
    return logits.float()


def discriminator_view(discriminator: nn.Module, opt_d: AmpOptimizer, maps: torch.Tensor) -> torch.Tensor:
    """D's logits on G's maps for G's update: D frozen, so the gradient reaches only G.

    Through the bare module: a frozen D must not take part in D's wrapper's gradient sync.
    """
    with frozen(discriminator), opt_d.autocast():
        return unwrap(discriminator)(maps)


class AdversarialStep:
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
        adv_warmup_steps: int = 0,
        phases: PhaseTimer | None = None,
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
        # Per-phase time (segadv/monitor/profile.py); methods built on this step share it.
        self.phases = phases if phases is not None else PhaseTimer()

    def adversarial_active(self, step: int) -> bool:
        return self.lambda_adv > 0 and step >= self.adv_warmup_steps

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, step: int) -> StepLosses:
        """One G update then one D update. ``step`` counts completed steps before this one."""
        g_dev, d_dev = self.device_map.generator, self.device_map.discriminator
        # The loader's batch to the devices (host-to-device copies run on the target's stream).
        with self.phases.phase("input_copy", transfer_device(images.device, g_dev)):
            images = to_device(images, g_dev)
            labels_g = to_device(labels, g_dev)
        with self.phases.phase("input_copy", transfer_device(labels.device, d_dev)):
            labels_d = labels_g if d_dev == g_dev else to_device(labels, d_dev)
        valid_d = labels_d != self.ignore_index
        self.generator.train()
        self.discriminator.train()

        probs_d, loss_seg, loss_adv = self.update_generator(images, labels_g, valid_d, step)
        loss_d, fake_logits = self.update_discriminator(probs_d, labels_d, valid_d)
        if loss_adv is None:
            # Same value G's update would have seen: D was frozen there and G's output is the same.
            loss_adv = masked_bce_with_logits(fake_logits, REAL, valid_d)
        return StepLosses(loss_seg, loss_adv, loss_d)

    def update_generator(
        self, images: torch.Tensor, labels: torch.Tensor, valid_d: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Returns G's detached probabilities on D's device, the CE loss and the adversarial loss
        (None while the adversarial term is off)."""
        g_dev, d_dev = self.device_map.generator, self.device_map.discriminator
        with self.phases.phase("g_fwd_bwd", g_dev):
            logits = generator_logits(self.generator, self.opt_g, images)
            loss_seg = F.cross_entropy(logits, labels, ignore_index=self.ignore_index)
            probs = logits.softmax(dim=1)
        with self.phases.phase("transfer", transfer_device(g_dev, d_dev)):
            probs_d = to_device(probs, d_dev)
        with self.phases.phase("g_fwd_bwd", g_dev):
            loss = loss_seg
            loss_adv = None
            if self.adversarial_active(step):
                d_out = discriminator_view(self.discriminator, self.opt_d, probs_d)
                loss_adv = masked_bce_with_logits(d_out, REAL, valid_d)
                # G's scaler also scales this term when D runs in float16 (build.py): unscaled, its
                # per-pixel gradient underflows to zero in D's float16 backward.
                loss = loss_seg + self.lambda_adv * to_device(loss_adv, loss_seg.device)
            self.opt_g.backward(loss)
        with self.phases.phase("optimizer", g_dev):
            self.opt_g.step()
        return probs_d.detach(), loss_seg.detach(), None if loss_adv is None else loss_adv.detach()

    def update_discriminator(
        self, probs_d: torch.Tensor, labels_d: torch.Tensor, valid_d: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns D's loss and its (detached) logits on the fake maps."""
        d_dev = self.device_map.discriminator
        with self.phases.phase("d_fwd_bwd", d_dev):
            real_maps = one_hot_labels(labels_d, self.num_classes, valid_d)
            # One forward over fake and real together: DDP expects one forward per backward, and D
            # has no batch statistics, so this equals two separate forwards.
            with self.opt_d.autocast():
                fake_logits, real_logits = self.discriminator(torch.cat([probs_d, real_maps])).chunk(2)
            loss_d = masked_bce_with_logits(fake_logits, FAKE, valid_d) + masked_bce_with_logits(
                real_logits, REAL, valid_d
            )
            self.opt_d.backward(loss_d)
        with self.phases.phase("optimizer", d_dev):
            self.opt_d.step()
        return loss_d.detach(), fake_logits.detach()
