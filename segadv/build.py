"""Assemble a run's parts from a config: networks, placement, per-network optimisation, the step.

Kept apart from the loop so tests and ``tools/bench.py`` build exactly what training builds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from segadv.config import Config
from segadv.config.schema import NetworkAmpConfig, OptimizerConfig
from segadv.engine.amp_optimizer import AmpOptimizer
from segadv.engine.optim import build_optimizer, build_poly_scheduler
from segadv.engine.step import AdversarialStep
from segadv.models import build_discriminator, build_generator
from segadv.parallel import DeviceMap, place_networks


@dataclass
class Training:
    generator: nn.Module
    discriminator: nn.Module
    opt_g: AmpOptimizer
    opt_d: AmpOptimizer
    step: AdversarialStep
    device_map: DeviceMap


def build_amp_optimizer(
    model: nn.Module, optim: OptimizerConfig, amp: NetworkAmpConfig, device: torch.device, max_steps: int
) -> AmpOptimizer:
    optimizer = build_optimizer(model, optim)
    scheduler = build_poly_scheduler(optimizer, max_steps, optim.poly_power)
    return AmpOptimizer(optimizer, scheduler, device, amp)


def build_training(cfg: Config, device_map: DeviceMap) -> Training:
    num_classes = cfg.data.num_classes
    generator = build_generator(cfg.model.generator, num_classes)
    discriminator = build_discriminator(cfg.model.discriminator, num_classes)
    place_networks(generator, discriminator, device_map)
    max_steps = cfg.train.max_steps
    opt_g = build_amp_optimizer(generator, cfg.optim.generator, cfg.amp.generator, device_map.generator, max_steps)
    opt_d = build_amp_optimizer(
        discriminator, cfg.optim.discriminator, cfg.amp.discriminator, device_map.discriminator, max_steps
    )
    step = AdversarialStep(
        generator,
        discriminator,
        opt_g,
        opt_d,
        device_map,
        num_classes=num_classes,
        ignore_index=cfg.data.ignore_index,
        lambda_adv=cfg.loss.lambda_adv,
        adv_warmup_steps=cfg.loss.adv_warmup_steps,
    )
    return Training(generator, discriminator, opt_g, opt_d, step, device_map)
