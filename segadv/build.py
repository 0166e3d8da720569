"""Assemble a run's parts from a config: networks, placement, wrapping, per-network optimisation,
the step.

Kept apart from the loop so tests and ``tools/bench.py`` build exactly what training builds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from segadv.config import Config
from segadv.config.schema import NetworkAmpConfig, OptimizerConfig
from segadv.engine.amp_optimizer import AmpOptimizer, uses_float16
from segadv.engine.optim import build_optimizer, build_poly_scheduler
from segadv.engine.step import AdversarialStep
from segadv.errors import UserError
from segadv.methods import (
    Method,
    build_method,
    check_method_config,
    has_aux_discriminator,
    passes_generator_loss_through_discriminator,
)
from segadv.models import build_discriminator, build_generator
from segadv.monitor.profile import PhaseTimer
from segadv.parallel import DeviceMap, place_networks
from segadv.parallel.distributed import DistEnv
from segadv.parallel.report import gather_rows, network_row, placement_table
from segadv.parallel.wrap import check_batch_for_replicas, resolve_mode, wrap_network

log = logging.getLogger(__name__)


@dataclass
class Training:
    generator: nn.Module  # possibly wrapped (DataParallel / DDP); unwrap() for the bare network
    discriminator: nn.Module
    opt_g: AmpOptimizer
    opt_d: AmpOptimizer
    step: AdversarialStep  # the supervised step (tests and tools/bench.py call it directly)
    method: Method  # what one training iteration does (cfg.method)
    device_map: DeviceMap
    env: DistEnv
    # The aux output's D (multi-level domain adaptation), else None.
    aux_discriminator: nn.Module | None = None
    opt_d_aux: AmpOptimizer | None = None

    @property
    def phases(self) -> PhaseTimer:
        """Per-phase time of the step (segadv/monitor/profile.py)."""
        return self.step.phases

    def networks(self) -> list[tuple[str, nn.Module, AmpOptimizer, tuple[torch.device, ...]]]:
        """``(role, wrapped network, its AmpOptimizer, its devices)`` of every network trained."""
        found = [("generator", self.generator, self.opt_g, self.device_map.generator_devices),
                 ("discriminator", self.discriminator, self.opt_d, self.device_map.discriminator_devices)]
        if self.aux_discriminator is not None and self.opt_d_aux is not None:
            found.append(("discriminator_aux", self.aux_discriminator, self.opt_d_aux,
                          self.device_map.aux_discriminator_devices))
        return found


def build_amp_optimizer(
    model: nn.Module, optim: OptimizerConfig, amp: NetworkAmpConfig, device: torch.device, max_steps: int,
    lr_multiplier: float = 1.0, loss_scaling: bool | None = None, name: str = "network",
    skip_nonfinite: bool = False,
) -> AmpOptimizer:
    optimizer = build_optimizer(model, optim.model_copy(update={"lr": optim.lr * lr_multiplier}))
    scheduler = build_poly_scheduler(optimizer, max_steps, optim.poly_power)
    return AmpOptimizer(optimizer, scheduler, device, amp, loss_scaling, name, skip_nonfinite)


def build_training(cfg: Config, device_map: DeviceMap, env: DistEnv = DistEnv()) -> Training:
    check_method_config(cfg)
    with_aux_d = has_aux_discriminator(cfg)
    if device_map.named_aux_discriminator_devices is not None and not with_aux_d:
        raise UserError(f"device map {device_map}: d_aux names a device, but this run has no aux discriminator "
                        "(it needs model.generator.aux_head and method adaptsegnet or advent)")
    num_classes = cfg.data.num_classes
    generator = build_generator(cfg.model.generator, num_classes)
    discriminator = build_discriminator(cfg.model.discriminator, num_classes)
    aux_discriminator = None
    if with_aux_d:
        aux_discriminator = build_discriminator(cfg.model.discriminator_aux or cfg.model.discriminator, num_classes)
    place_networks(generator, discriminator, device_map, channels_last=cfg.train.channels_last,
                   aux_discriminator=aux_discriminator)

    g_mode = resolve_mode(cfg.parallel.generator, "generator", device_map.generator_devices, env)
    d_mode = resolve_mode(cfg.parallel.discriminator, "discriminator", device_map.discriminator_devices, env)
    for role, devices in (("generator", device_map.generator_devices), ("discriminator", device_map.discriminator_devices)):
        check_batch_for_replicas(cfg.data.batch_size, len(devices), role)
    if cfg.parallel.sync_bn:
        if g_mode != "ddp":
            raise UserError("parallel.sync_bn needs the generator under DDP (a multi-process launch)")
        if device_map.generator.type != "cuda":
            raise UserError("parallel.sync_bn needs the generator on CUDA (SyncBatchNorm has no CPU kernel)")
        generator = nn.SyncBatchNorm.convert_sync_batchnorm(generator)
    # broadcast_buffers: G's BatchNorm statistics follow rank 0, so every rank evaluates (and
    # could save) the same model; D has no buffers, so there is nothing to broadcast.
    wrapped_g = wrap_network(generator, g_mode, device_map.generator_devices, cfg.amp.generator, broadcast_buffers=True)
    wrapped_d = wrap_network(discriminator, d_mode, device_map.discriminator_devices, cfg.amp.discriminator,
                             broadcast_buffers=False)
    amp_d_aux = cfg.amp.discriminator_aux or cfg.amp.discriminator
    wrapped_d_aux = None
    if aux_discriminator is not None:
        d_aux_mode = resolve_mode(cfg.parallel.discriminator_aux or cfg.parallel.discriminator, "discriminator_aux",
                                  device_map.aux_discriminator_devices, env)
        check_batch_for_replicas(cfg.data.batch_size, len(device_map.aux_discriminator_devices), "discriminator_aux")
        wrapped_d_aux = wrap_network(aux_discriminator, d_aux_mode, device_map.aux_discriminator_devices, amp_d_aux,
                                     broadcast_buffers=False)

    max_steps = cfg.train.max_steps
    skip = cfg.train.on_nonfinite == "skip_step"
    lr_multiplier = float(env.world_size) if cfg.train.lr_scaling == "linear" else 1.0
    # G's loss passes through D's backward when the adversarial term is on: scale it if D's is fp16.
    g_loss_scaling = uses_float16(cfg.amp.generator) or (
        passes_generator_loss_through_discriminator(cfg)
        and (uses_float16(cfg.amp.discriminator) or (aux_discriminator is not None and uses_float16(amp_d_aux)))
    )
    opt_g = build_amp_optimizer(generator, cfg.optim.generator, cfg.amp.generator, device_map.generator,
                                max_steps, lr_multiplier, loss_scaling=g_loss_scaling, name="generator",
                                skip_nonfinite=skip)
    opt_d = build_amp_optimizer(discriminator, cfg.optim.discriminator, cfg.amp.discriminator,
                                device_map.discriminator, max_steps, lr_multiplier, name="discriminator",
                                skip_nonfinite=skip)
    opt_d_aux = None
    if aux_discriminator is not None:
        opt_d_aux = build_amp_optimizer(aux_discriminator, cfg.optim.discriminator_aux or cfg.optim.discriminator,
                                        amp_d_aux, device_map.aux_discriminator, max_steps, lr_multiplier,
                                        name="discriminator_aux", skip_nonfinite=skip)
    step = AdversarialStep(
        wrapped_g,
        wrapped_d,
        opt_g,
        opt_d,
        device_map,
        num_classes=num_classes,
        ignore_index=cfg.data.ignore_index,
        lambda_adv=cfg.loss.lambda_adv,
        adv_warmup_steps=cfg.loss.adv_warmup_steps,
        phases=PhaseTimer(precise=cfg.train.profile),
    )
    method = build_method(cfg, step, None if wrapped_d_aux is None else (wrapped_d_aux, opt_d_aux))
    return Training(wrapped_g, wrapped_d, opt_g, opt_d, step, method, device_map, env, wrapped_d_aux, opt_d_aux)


def log_placement(parts: Training) -> None:
    """The placement table, every rank's rows, logged once by rank 0."""
    rows = [network_row(parts.env.rank, role, module, devices, opt)
            for role, module, opt, devices in parts.networks()]
    rows = gather_rows(rows)
    if parts.env.is_main:
        log.info("placement:\n%s", placement_table(rows))
