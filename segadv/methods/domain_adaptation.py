"""Unsupervised domain adaptation: AdaptSegNet (Tsai et al., CVPR 2018) and ADVENT / MinEnt (Vu
et al., CVPR 2019), single- or multi-level.

Each iteration draws a labeled source batch (x_s, y_s) and an unlabeled target batch x_t (two
streams, each resumable on its own; the target's labels are never read). Levels: ``main``, and
``aux`` when G has the aux head (``model.generator.aux_head``), each with its own D.

G's loss, with every D frozen:
    CE(main_s, y_s) + lambda_seg_aux * CE(aux_s, y_s)                                [source]
  + sum over levels: lambda_adv_<level> * GAN(D_<level>(m(<level>_t)), SOURCE)           [target]
  + sum over levels: lambda_ent_<level> * mean normalised entropy of <level>_t        [MinEnt]
D_<level>'s loss: (GAN(D(m(<level>_s)), SOURCE) + GAN(D(m(<level>_t)), TARGET)) / 2, detached.
m: softmax (AdaptSegNet) or the weighted self-information map (ADVENT); GAN: BCE with logits or
least squares on the logits. Labels as the references: source 0, target 1. MinEnt trains no D.

As in the references, G runs on the source batch (forward, backward), then on the target batch
(forward, backward), then steps once: the domains may differ in size, BatchNorm's batch
statistics stay per domain, and each forward is followed by its own backward (as DDP expects).
Each D does the same with its source and target halves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from segadv.config.schema import DomainAdaptationConfig
from segadv.data.streams import Stream, StreamSpec
from segadv.engine.amp_optimizer import AmpOptimizer
from segadv.engine.step import AdversarialStep, discriminator_view
from segadv.methods.base import PanelMaps
from segadv.monitor.profile import transfer_device
from segadv.parallel.placement import to_device

SOURCE, TARGET = 0.0, 1.0


def self_information(logits: torch.Tensor) -> torch.Tensor:
    """ADVENT's weighted self-information map ``-P log2(P) / log2(C)`` of ``softmax(logits)``, C
    channels; its channel sum is the pixel's entropy normalised to [0, 1]. Computed from log-softmax
    (no ``+ 1e-30``: exact where P underflows to 0, whose term is 0)."""
    log_p = F.log_softmax(logits.float(), dim=1)
    return -log_p.exp() * log_p / math.log(logits.shape[1])


def mean_entropy(logits: torch.Tensor) -> torch.Tensor:
    """MinEnt's loss: the mean over pixels of the normalised entropy."""
    return self_information(logits).sum(dim=1).mean()


def gan_loss(logits: torch.Tensor, label: float, kind: str) -> torch.Tensor:
    """BCE with logits, or least squares (``ls``: MSE of the raw logits), against a constant label."""
    logits = logits.float()
    target = torch.full_like(logits, label)
    if kind == "ls":
        return F.mse_loss(logits, target)
    return F.binary_cross_entropy_with_logits(logits, target)


@dataclass
class Level:
    """One adapted output level: its D (None for MinEnt) and weights."""

    name: str  # "main" or "aux"
    discriminator: Optional[nn.Module]
    opt_d: Optional[AmpOptimizer]
    device: torch.device  # its D's device (G's when it has none)
    lambda_adv: float
    lambda_ent: float

    @property
    def suffix(self) -> str:
        """Of its loss names: loss_adv, loss_adv_aux."""
        return "" if self.name == "main" else "_aux"


class DomainAdaptation:
    # The source stream is the labeled split as the supervised method draws it (same seed).
    streams = (
        StreamSpec("source", "labeled"),
        StreamSpec("target", "target", seed_word=3, batch_size_key="method.<name>.target_batch_size"),
    )
    panel_stream = None

    def __init__(
        self,
        base: AdversarialStep,
        settings: DomainAdaptationConfig,
        discriminator_input: Optional[Callable[[torch.Tensor], torch.Tensor]],
        aux_discriminator: Optional[tuple[nn.Module, AmpOptimizer]] = None,
        multi_level: bool = False,
    ) -> None:
        """``discriminator_input``: the map D sees, from G's logits (softmax for AdaptSegNet,
        self-information for ADVENT); None: no D (MinEnt). ``base``: the supervised step, whose
        G, main D, optimizers and device map this method trains. ``aux_discriminator``: the aux
        level's D and its optimizer (multi-level with a D)."""
        self.base = base
        self.settings = settings
        self.discriminator_input = discriminator_input
        self.generator, self.opt_g = base.generator, base.opt_g
        self.device_map = base.device_map
        self.multi_level = multi_level
        g_dev = self.device_map.generator
        if discriminator_input is None:  # MinEnt: entropy terms only
            self.levels = [Level("main", None, None, g_dev, 0.0, settings.lambda_ent_main)]
            if multi_level:
                self.levels.append(Level("aux", None, None, g_dev, 0.0, settings.lambda_ent_aux))
            return
        self.levels = [Level("main", base.discriminator, base.opt_d, self.device_map.discriminator,
                             settings.lambda_adv_main, settings.lambda_ent_main)]
        if multi_level:
            if aux_discriminator is None:
                raise ValueError("multi-level adversarial adaptation needs the aux discriminator")
            self.levels.append(Level("aux", *aux_discriminator, self.device_map.aux_discriminator,
                                     settings.lambda_adv_aux, settings.lambda_ent_aux))

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        base, s = self.base, self.settings
        g_dev = self.device_map.generator
        images_s, labels_s = streams["source"].next()
        images_t = streams["target"].next()  # images only: the target's labels are never read
        phase = base.phases.phase
        with phase("input_copy", transfer_device(labels_s.device, g_dev)):
            labels_s = to_device(labels_s, g_dev)
            images_s = to_device(images_s, g_dev)
            images_t = to_device(images_t, g_dev)
        self.generator.train()
        adversarial = [level for level in self.levels if level.discriminator is not None]
        for level in adversarial:
            level.discriminator.train()
        losses: dict[str, torch.Tensor] = {}

        # ---- G, with every D frozen. Source, then target, each forward followed by its backward
        # (the references' order; the two domains may differ in size, and DDP expects one
        # backward per forward). The gradients add up; one step follows.
        with phase("g_fwd_bwd", g_dev):
            logits = self.generator_levels(images_s)
            loss = F.cross_entropy(logits["main"], labels_s, ignore_index=base.ignore_index)
            losses["loss_seg"] = loss.detach()
            if self.multi_level:
                loss_seg_aux = F.cross_entropy(logits["aux"], labels_s, ignore_index=base.ignore_index)
                losses["loss_seg_aux"] = loss_seg_aux.detach()
                loss = loss + s.lambda_seg_aux * loss_seg_aux
        with torch.no_grad():  # D's source half, from G before its step
            source_maps = {level.name: self.discriminator_maps(level, logits[level.name]) for level in adversarial}
        with phase("g_fwd_bwd", g_dev):
            self.opt_g.backward(loss)
            logits = self.generator_levels(images_t)
            # Zero-weighted outputs, so every parameter takes part even when no target term is on (DDP).
            loss = 0.0 * sum(level_logits.sum() for level_logits in logits.values())
        target_maps = {}
        for level in self.levels:
            if level.lambda_ent > 0:
                with phase("g_fwd_bwd", g_dev):
                    loss_ent = mean_entropy(logits[level.name])
                    losses[f"loss_ent{level.suffix}"] = loss_ent.detach()
                    loss = loss + level.lambda_ent * loss_ent
            if level.discriminator is None:
                continue
            maps = self.discriminator_maps(level, logits[level.name])
            target_maps[level.name] = maps.detach()
            if level.lambda_adv > 0:
                with phase("g_fwd_bwd", g_dev):
                    d_out = discriminator_view(level.discriminator, level.opt_d, maps)
                    loss_adv = gan_loss(d_out, SOURCE, s.gan)  # target maps made to look like source
                    losses[f"loss_adv{level.suffix}"] = loss_adv.detach()
                    loss = loss + level.lambda_adv * to_device(loss_adv, g_dev)
        with phase("g_fwd_bwd", g_dev):
            self.opt_g.backward(loss)
        with phase("optimizer", g_dev):
            self.opt_g.step()

        # ---- each D: source maps as SOURCE, target maps as TARGET, each half its own backward
        for level in adversarial:
            with phase("d_fwd_bwd", level.device):
                loss_d = 0.0
                for maps, label in ((source_maps[level.name], SOURCE), (target_maps[level.name], TARGET)):
                    with level.opt_d.autocast():
                        d_out = level.discriminator(maps)
                    half = 0.5 * gan_loss(d_out, label, s.gan)
                    level.opt_d.backward(half)
                    loss_d = loss_d + half.detach()
                losses[f"loss_d{level.suffix}"] = loss_d
            with phase("optimizer", level.device):
                level.opt_d.step()
        return losses

    def generator_levels(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """G's float32 logits per level (G's forward under its own autocast)."""
        with self.opt_g.autocast():
            out = self.generator(images, return_aux=True) if self.multi_level else (self.generator(images),)
        return dict(zip(("main", "aux"), (o.float() for o in out)))

    def discriminator_maps(self, level: Level, logits: torch.Tensor) -> torch.Tensor:
        """The level's D input from G's logits, on that D's device."""
        g_dev = self.device_map.generator
        with self.base.phases.phase("g_fwd_bwd", g_dev):
            maps = self.discriminator_input(logits)
        with self.base.phases.phase("transfer", transfer_device(g_dev, level.device)):
            return to_device(maps, level.device)

    def panel(self, images: torch.Tensor) -> Optional[PanelMaps]:
        return None
