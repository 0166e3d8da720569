"""Assemble a run's parts from a config: networks, placement, wrapping, per-network optimisation,
the method.

Kept apart from the loop so tests and ``tools/bench.py`` build exactly what training builds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from segadv.checkpoint import load_encoder_weights
from segadv.config import Config
from segadv.config.schema import DiscriminatorConfig, GeneratorConfig, NetworkAmpConfig, OptimizerConfig
from segadv.data.batch_checks import check_micro_batches
from segadv.data.config_checks import training_side
from segadv.engine.accumulation import Accumulation
from segadv.engine.amp_optimizer import AmpOptimizer, uses_float16
from segadv.engine.network import Network
from segadv.engine.optim import build_optimizer, build_poly_scheduler
from segadv.errors import UserError
from segadv.methods import Method, method_class
from segadv.models import build_discriminator, build_generator
from segadv.models.discriminator import check_input_side
from segadv.monitor.profile import PhaseTimer
from segadv.parallel import DeviceMap, place_networks
from segadv.parallel.compile import check_compile, compile_enabled
from segadv.parallel.distributed import DistEnv
from segadv.parallel.report import gather_rows, network_row, placement_table
from segadv.parallel.wrap import check_batch_for_replicas, parallelize_network, resolve_mode

log = logging.getLogger(__name__)


@dataclass
class Training:
    g: Network
    d: Network
    d_aux: Network | None  # the aux output's D (multi-level domain adaptation), else None
    method: Method  # what one training iteration does (cfg.method)
    device_map: DeviceMap
    env: DistEnv
    phases: PhaseTimer  # per-phase time of the iteration (segadv/monitor/profile.py)
    step: Accumulation  # one optimizer step: the method over train.accumulation_steps micro-batches

    def networks(self) -> list[Network]:
        """Every network trained: G, D, then the aux D if any."""
        return [self.g, self.d] + ([] if self.d_aux is None else [self.d_aux])


@dataclass(frozen=True)
class NetworkSettings:
    """One role's settings from the config's per-network sections."""

    model: GeneratorConfig | DiscriminatorConfig
    optim: OptimizerConfig
    amp: NetworkAmpConfig
    parallel: str


def network_settings(cfg: Config, role: str) -> NetworkSettings:
    """``role``'s model, optimizer, AMP and parallel settings; the aux D's that are not given are
    the main D's (each network still gets its own instances: optimizer, GradScaler, wrapper)."""

    def own(section):
        value = getattr(section, role)
        return section.discriminator if value is None and role == "discriminator_aux" else value

    return NetworkSettings(own(cfg.model), own(cfg.optim), own(cfg.amp), own(cfg.parallel))


def role_devices(device_map: DeviceMap, role: str) -> tuple[torch.device, ...]:
    return {"generator": device_map.generator_devices, "discriminator": device_map.discriminator_devices,
            "discriminator_aux": device_map.aux_discriminator_devices}[role]


def build_amp_optimizer(
    model: nn.Module, optim: OptimizerConfig, amp: NetworkAmpConfig, device: torch.device, max_steps: int,
    lr_multiplier: float = 1.0, loss_scaling: bool | None = None, name: str = "network",
    skip_nonfinite: bool = False, accumulation_steps: int = 1,
) -> AmpOptimizer:
    optimizer = build_optimizer(model, optim.model_copy(update={"lr": optim.lr * lr_multiplier}))
    scheduler = build_poly_scheduler(optimizer, max_steps, optim.poly_power)
    return AmpOptimizer(optimizer, scheduler, device, amp, loss_scaling, name, skip_nonfinite, accumulation_steps)


def build_training(cfg: Config, device_map: DeviceMap, env: DistEnv = DistEnv()) -> Training:
    method_cls = method_class(cfg.method.name)
    method_cls.check_config(cfg)
    roles = ["generator", "discriminator"]
    if method_cls.has_aux_discriminator(cfg):
        roles.append("discriminator_aux")
    elif device_map.named_aux_discriminator_devices is not None:
        raise UserError(f"device map {device_map}: d_aux names a device, but this run has no aux discriminator "
                        "(it needs model.generator.aux_head and a method that adapts each level with a D)")
    settings = {role: network_settings(cfg, role) for role in roles}
    devices = {role: role_devices(device_map, role) for role in roles}
    micro_batch = check_accumulation(cfg, replicas=len(devices["generator"]))
    check_discriminator_input(cfg, roles)
    num_classes = cfg.data.num_classes
    models = {role: (build_generator if role == "generator" else build_discriminator)(settings[role].model, num_classes)
              for role in roles}
    load_encoder_weights(models["generator"], cfg.model.generator)  # a local encoder weights file, if any
    place_networks(models["generator"], models["discriminator"], device_map, channels_last=cfg.train.channels_last,
                   aux_discriminator=models.get("discriminator_aux"))

    modes = {role: resolve_mode(settings[role].parallel, role, devices[role], env) for role in roles}
    checkpointing = {role: role == "generator" and cfg.model.generator.activation_checkpointing for role in roles}
    compiled = {role: compile_enabled(cfg.compile, role) for role in roles}
    for role in roles:
        check_batch_for_replicas(micro_batch, len(devices[role]), role)
        if compiled[role]:
            check_compile(cfg.compile, role, devices[role], modes[role], checkpointing[role])
    if cfg.parallel.sync_bn:
        if cfg.model.generator.norm == "frozen":
            raise UserError("parallel.sync_bn with model.generator.norm=frozen: G's BatchNorm statistics are fixed, "
                            "there are none to synchronise")
        if modes["generator"] != "ddp":
            raise UserError("parallel.sync_bn needs the generator under DDP (a multi-process launch)")
        if device_map.generator.type != "cuda":
            raise UserError("parallel.sync_bn needs the generator on CUDA (SyncBatchNorm has no CPU kernel)")
        models["generator"] = nn.SyncBatchNorm.convert_sync_batchnorm(models["generator"])

    max_steps = cfg.train.max_steps
    skip = cfg.train.on_nonfinite == "skip_step"
    lr_multiplier = float(env.world_size) if cfg.train.lr_scaling == "linear" else 1.0
    # G's loss passes through a D's backward when an adversarial term is on: scale it if that D is fp16.
    g_loss_scaling = uses_float16(settings["generator"].amp) or (
        method_cls.passes_generator_loss_through_discriminator(cfg)
        and any(uses_float16(settings[role].amp) for role in roles if role != "generator"))
    networks = {}
    for role in roles:
        model, own = models[role], settings[role]
        # broadcast_buffers: G's BatchNorm statistics follow rank 0, so every rank evaluates (and
        # could save) the same model; a D has no buffers, so there is nothing to broadcast.
        wrapped = parallelize_network(model, modes[role], devices[role], own.amp, broadcast_buffers=role == "generator",
                                      activation_checkpointing=checkpointing[role],
                                      compile_config=cfg.compile if compiled[role] else None, role=role)
        opt = build_amp_optimizer(model, own.optim, own.amp, devices[role][0], max_steps, lr_multiplier,
                                  loss_scaling=g_loss_scaling if role == "generator" else None, name=role,
                                  skip_nonfinite=skip, accumulation_steps=cfg.train.accumulation_steps)
        networks[role] = Network(role, wrapped, opt, devices[role])
    g, d, d_aux = networks["generator"], networks["discriminator"], networks.get("discriminator_aux")
    phases = PhaseTimer(precise=cfg.train.profile)
    method = method_cls.from_config(cfg, g, d, d_aux, phases)
    step = Accumulation(method, list(networks.values()), cfg.train.accumulation_steps)
    return Training(g, d, d_aux, method, device_map, env, phases, step)


def check_accumulation(cfg: Config, replicas: int = 1) -> int:
    """``train.accumulation_steps`` against every stream's batch size, and each micro-batch (each
    of G's ``replicas``' chunk of it) against BatchNorm where G cannot train on one sample; returns
    the labeled micro-batch's size."""
    steps = cfg.train.accumulation_steps
    method_cls = method_class(cfg.method.name)
    by_stream = method_cls.stream_batch_sizes(cfg)
    sizes = {"data.batch_size": cfg.data.batch_size, **{spec.batch_size_key: by_stream[spec.name]
                                                        for spec in method_cls.streams}}
    for key, size in sizes.items():
        if size % steps:
            raise UserError(f"train.accumulation_steps={steps} does not divide {key}={size}: each optimizer step "
                            f"takes {steps} equal micro-batches of every stream's batch")
    if not cfg.model.generator.trains_on_one_sample:
        check_micro_batches(sizes, steps, replicas)
    return cfg.data.batch_size // steps


def check_discriminator_input(cfg: Config, roles: list[str]) -> None:
    """Each D's depth against the smallest training side it is given (G's maps are at the input's
    size): the source's, and the target's under domain adaptation, where the config says it."""
    sides = [training_side(cfg.data)]
    if cfg.target_data is not None:
        sides.append(training_side(cfg.target_data, "target_data"))
    sides = [side for side in sides if side is not None]
    for role in roles:
        if role == "generator":
            continue
        for side, source in sides:
            check_input_side(network_settings(cfg, role).model, side, f"model.{role}", source)


def log_placement(parts: Training) -> None:
    """The placement table, every rank's rows, logged once by rank 0."""
    rows = [network_row(parts.env.rank, net.role, net.module, net.devices, net.opt) for net in parts.networks()]
    rows = gather_rows(rows)
    if parts.env.is_main:
        log.info("placement:\n%s", placement_table(rows))
