"""Unsupervised domain adaptation: AdaptSegNet (Tsai et al., CVPR 2018) and ADVENT / MinEnt (Vu
et al., CVPR 2019), single- or multi-level.

Each iteration draws a labeled source batch (x_s, y_s) and an unlabeled target batch x_t (two
streams, each resumable on its own; the target's labels are never read). Levels: ``main``, and
``aux`` when G has the aux head (``model.generator.aux_head``), each with its own D.

G's loss, with every D frozen:
    CE(main_s, y_s) + lambda_seg_aux * CE(aux_s, y_s)                                [source]
  + sum over levels: lambda_adv_<level> * GAN(D_<level>(m(<level>_t)), real)             [target]
  + sum over levels: lambda_ent_<level> * mean normalised entropy of <level>_t        [MinEnt]
D_<level>'s loss: (GAN(D(m(<level>_s)), real) + GAN(D(m(<level>_t)), fake)) / 2, detached.
m: softmax (AdaptSegNet) or the weighted self-information map (ADVENT); GAN: BCE with logits or
least squares on the logits. The source domain is real, the target fake; their labels are the
references' (source 0, target 1: ``SOURCE_REAL``). MinEnt trains no D.

As in the references, G runs on the source batch (forward, backward), then on the target batch
(forward, backward), then steps once: the domains may differ in size, BatchNorm's batch
statistics stay per domain, and each forward is followed by its own backward (as DDP expects).
Each D does the same with its source and target halves.

G's target pass draws its random numbers (dropout masks: smp's DeepLabV3+ decoder has a Dropout)
from a stream of its own (``own_random_stream``): the random state every later step starts from is
the one it would be without that pass, so the BatchNorm control (AdaptSegNet with no target term)
and source only, with BatchNorm frozen, train G bitwise alike (docs/methods.md).
"""

from __future__ import annotations

import hashlib
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Optional

import torch
import torch.nn.functional as F

from segadv.checkpoint.loader import has_values
from segadv.data.streams import Stream
from segadv.engine.losses import EMPTY_PREFIX, empty_selection, masked_cross_entropy
from segadv.engine.network import Network
from segadv.methods.adversarial import (
    SOURCE_REAL as LABELS,
    DiscriminatorBatch,
    copy_in,
    discriminator_backward,
    discriminator_view,
    gan_loss,
    generator_logits,
    hand_over,
    optimizer_step,
    realness,
)
from segadv.methods.schedule import Schedule
from segadv.methods.domain_adaptation.declaration import (
    AdaptSegNetSpec,
    AdventSpec,
    DomainAdaptationConfig,
    DomainAdaptationSetup,
    MinEntSpec,
)
from segadv.monitor.diagnostics import d_accuracy
from segadv.monitor.profile import PhaseTimer
from segadv.parallel.placement import device_module, is_accelerator, to_device


def softmax_maps(logits: torch.Tensor) -> torch.Tensor:
    """AdaptSegNet's D input: the class probabilities."""
    return logits.softmax(dim=1)


def self_information(logits: torch.Tensor) -> torch.Tensor:
    """ADVENT's weighted self-information map ``-P log2(P) / log2(C)`` of ``softmax(logits)``, C
    channels; its channel sum is the pixel's entropy normalised to [0, 1]. Computed from log-softmax
    (no ``+ 1e-30``: exact where P underflows to 0, whose term is 0)."""
    log_p = F.log_softmax(logits.float(), dim=1)
    return -log_p.exp() * log_p / math.log(logits.shape[1])


def mean_entropy(logits: torch.Tensor) -> torch.Tensor:
    """MinEnt's loss: the mean over pixels of the normalised entropy."""
    return self_information(logits).sum(dim=1).mean()


def _derived_seed(state: torch.Tensor) -> int:
    """A seed that is a function of a generator's state: a hash, so the derived stream shares no
    numbers with the state's own (the next source pass's dropout masks). Under segadv-plan's dry
    run a state's bytes cannot be read (nothing is drawn there either): any seed does."""
    if not has_values(state):
        return 0
    digest = hashlib.blake2b(state.cpu().numpy().tobytes(), digest_size=8, person=b"segadv-target").digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes a non-negative int64


@contextmanager
def own_random_stream(devices: Iterable[torch.device]) -> Iterator[None]:
    """Run a block on random streams of its own: the CPU generator and each accelerator's among
    ``devices`` are reseeded from a hash of their state and restored afterwards, so what the block
    draws leaves every later draw as it would be without it. Each stream is a function of the state
    it starts from, which the checkpoint holds (``capture_rng_state``): a resumed run draws the
    same numbers. A generator that no training step uses (segadv-plan's stand-in has none to
    reseed) is left as it is."""
    accelerators = list(dict.fromkeys(d for d in devices if is_accelerator(d)))
    saved_cpu = torch.get_rng_state()
    saved = [(d, device_module(d).get_rng_state(d)) for d in accelerators]
    try:
        torch.default_generator.manual_seed(_derived_seed(saved_cpu))
        for device, state in saved:
            module = device_module(device)
            generators = getattr(module, "default_generators", ())  # none on segadv-plan's stand-in
            index = device.index if device.index is not None else module.current_device()
            if index < len(generators):
                generators[index].manual_seed(_derived_seed(state))
        yield
    finally:
        torch.set_rng_state(saved_cpu)
        for device, state in saved:
            device_module(device).set_rng_state(state, device)


@dataclass
class Level:
    """One adapted output level: its D (None for MinEnt) and weights."""

    name: str  # "main" or "aux"
    d: Optional[Network]
    lambda_adv: float
    lambda_ent: float

    @property
    def suffix(self) -> str:
        """Of its loss names: loss_adv, loss_adv_aux."""
        return "" if self.name == "main" else "_aux"


class DomainAdaptation:
    """The iteration the three methods share; each method's class (below) joins it to its
    declaration (``declaration.py``) and gives the map its D sees."""

    settings: DomainAdaptationConfig
    has_discriminator: bool  # from the declaration
    # The map D sees, from G's logits (a staticmethod); None without a D (MinEnt).
    discriminator_input: Optional[Callable[[torch.Tensor], torch.Tensor]]

    def __init__(self, setup: DomainAdaptationSetup, nets: Mapping[str, Network], phases: PhaseTimer) -> None:
        """``nets``: G, and where the method trains them (not MinEnt) the main level's D
        (``discriminator``) and with two levels the aux level's (``discriminator_aux``). The main
        level's adversarial weight is ``setup.lambda_adv`` (``loss.lambda_adv``), the aux level's
        ``settings.lambda_adv_aux``."""
        self.g, self.phases = nets["generator"], phases
        self.settings = settings = setup.settings
        self.schedule = Schedule()  # every term from the first step
        self.ignore_index = setup.ignore_index
        self.multi_level = multi_level = setup.multi_level
        if not self.has_discriminator:  # MinEnt: entropy terms only
            self.levels = [Level("main", None, 0.0, settings.lambda_ent_main)]
            if multi_level:
                self.levels.append(Level("aux", None, 0.0, settings.lambda_ent_aux))
            return
        self.levels = [Level("main", nets["discriminator"], setup.lambda_adv, settings.lambda_ent_main)]
        if multi_level:
            if "discriminator_aux" not in nets:
                raise ValueError("multi-level adversarial adaptation needs the aux discriminator")
            self.levels.append(Level("aux", nets["discriminator_aux"], settings.lambda_adv_aux,
                                     settings.lambda_ent_aux))

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        g, s, phase = self.g, self.settings, self.phases.phase
        images_s, labels_s = streams["source"].next()
        images_t = streams["target"].next()  # images only: the target's labels are never read
        labels_s, images_s, images_t = copy_in(self.phases, g.device, labels_s, images_s, images_t)
        g.module.train()
        adversarial = [level for level in self.levels if level.d is not None]
        for level in adversarial:
            level.d.module.train()
        losses: dict[str, torch.Tensor] = {}

        # ---- G, with every D frozen. Source, then target, each forward followed by its backward
        # (the references' order; the two domains may differ in size, and DDP expects one
        # backward per forward). The gradients add up; one step follows.
        with phase("g_fwd_bwd", g.device):
            logits = self.generator_levels(images_s)
            loss = masked_cross_entropy(logits["main"], labels_s, self.ignore_index)
            losses["loss_seg"] = loss.detach()
            losses[EMPTY_PREFIX + "loss_seg"] = empty_source = empty_selection(labels_s != self.ignore_index)
            if self.multi_level:
                loss_seg_aux = masked_cross_entropy(logits["aux"], labels_s, self.ignore_index)
                losses["loss_seg_aux"] = loss_seg_aux.detach()
                losses[EMPTY_PREFIX + "loss_seg_aux"] = empty_source
                loss = loss + s.lambda_seg_aux * loss_seg_aux
        with torch.no_grad():  # D's source half, from G before its step
            source_maps = {level.name: self.discriminator_maps(level, logits[level.name]) for level in adversarial}
        with phase("g_fwd_bwd", g.device):
            g.opt.backward(loss)
        # The target pass on random streams of its own: what it draws (G's dropout masks) leaves
        # the random state of every later source pass as it would be without it.
        with own_random_stream([*g.devices, *(d for level in adversarial for d in level.d.devices)]):
            target_maps = self.generator_target(images_t, losses)
        optimizer_step(self.phases, g)

        # ---- each D: source maps as real, target maps as fake; the mean of the two. As in the
        # references, each half is its own forward and backward; one step follows.
        for level in adversarial:
            (loss_source, (logits_source,)), (loss_target, (logits_target,)) = [
                discriminator_backward(self.phases, level.d, [DiscriminatorBatch(maps[level.name], label)],
                                       weight=0.5, kind=s.gan)
                for maps, label in ((source_maps, LABELS.real), (target_maps, LABELS.fake))]
            losses[f"loss_d{level.suffix}"] = loss_source + loss_target
            losses[f"d_acc_source{level.suffix}"] = d_accuracy(logits_source, LABELS.real)
            losses[f"d_acc_target{level.suffix}"] = d_accuracy(logits_target, LABELS.fake)
            optimizer_step(self.phases, level.d)
        return losses

    def generator_target(self, images_t: torch.Tensor, losses: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """G's target forward, its terms (into ``losses``) and their backward; returns each
        adversarial level's detached target maps, for its D."""
        g, s, phase = self.g, self.settings, self.phases.phase
        with phase("g_fwd_bwd", g.device):
            logits = self.generator_levels(images_t)
            # Zero-weighted outputs, so every parameter takes part even when no target term is on (DDP).
            loss = 0.0 * sum(level_logits.sum() for level_logits in logits.values())
        target_maps = {}
        for level in self.levels:
            if level.lambda_ent > 0:
                with phase("g_fwd_bwd", g.device):
                    loss_ent = mean_entropy(logits[level.name])
                    losses[f"loss_ent{level.suffix}"] = loss_ent.detach()
                    loss = loss + level.lambda_ent * loss_ent
            if level.d is None:
                continue
            maps = self.discriminator_maps(level, logits[level.name])
            target_maps[level.name] = maps.detach()
            if level.lambda_adv > 0:
                with phase("g_fwd_bwd", g.device):
                    # target maps made to look like source (real)
                    loss_adv = gan_loss(discriminator_view(level.d, maps), LABELS.real, kind=s.gan)
                    losses[f"loss_adv{level.suffix}"] = loss_adv.detach()
                    loss = loss + level.lambda_adv * to_device(loss_adv, g.device)
        with phase("g_fwd_bwd", g.device):
            g.opt.backward(loss)
        return target_maps

    def generator_levels(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """G's float32 logits per level."""
        out = generator_logits(self.g, images, return_aux=True) if self.multi_level else (
            generator_logits(self.g, images),)
        return dict(zip(("main", "aux"), out))

    def discriminator_maps(self, level: Level, logits: torch.Tensor) -> torch.Tensor:
        """The level's D input from G's logits, on that D's device."""
        with self.phases.phase("g_fwd_bwd", self.g.device):
            maps = self.discriminator_input(logits)
        return hand_over(self.phases, maps, self.g, level.d)

    def discriminator_realness(self, images: torch.Tensor, logits: torch.Tensor) -> Optional[torch.Tensor]:
        """The main level's D's probability that G's maps are the source's
        (``Method.discriminator_realness``); None without a D (MinEnt)."""
        d = self.levels[0].d
        return None if d is None else realness(d, self.discriminator_input(logits), LABELS)


class AdaptSegNet(AdaptSegNetSpec, DomainAdaptation):
    """AdaptSegNet's iteration: its Ds see the softmax maps."""

    discriminator_input = staticmethod(softmax_maps)
    discriminator_realness = DomainAdaptation.discriminator_realness


class Advent(AdventSpec, DomainAdaptation):
    """ADVENT's AdvEnt iteration: its Ds see the weighted self-information maps."""

    discriminator_input = staticmethod(self_information)
    discriminator_realness = DomainAdaptation.discriminator_realness


class MinEnt(MinEntSpec, DomainAdaptation):
    """ADVENT's MinEnt iteration: entropy terms only, no D."""

    discriminator_input = None
