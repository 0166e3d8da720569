"""Assemble a run's parts from a config: networks, placement, wrapping, per-network optimisation,
the method, as the start's checks decided them (segadv/training/checks.py).

Kept apart from the loop so tests and ``tools/bench.py`` build exactly what training builds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Iterator

import torch
from torch import nn

from segadv.config import Config
from segadv.config.roles import built_as, role
from segadv.config.schema import NetworkAmpConfig, OptimizerConfig
from segadv.engine.accumulation import Accumulation
from segadv.engine.amp_optimizer import AmpOptimizer, resolve_auto, uses_float16
from segadv.engine.network import Network
from segadv.engine.optim import build_optimizer, build_poly_scheduler
from segadv.methods import Method, method_class
from segadv.models.norm import sync_batch_norms
from segadv.monitor.profile import PhaseTimer
from segadv.parallel import DeviceMap, place_networks
from segadv.parallel.distributed import DistEnv, check_ranks_agree
from segadv.parallel.report import gather_rows, network_row, placement_table
from segadv.parallel.wrap import parallelize_network
from segadv.training.checks import Checked, check_build, check_fsdp_param_dtype
from segadv.training.role import NetworkSettings, Role

log = logging.getLogger(__name__)


@dataclass
class Training:
    roles: tuple[Role, ...]  # the method's networks (Method.networks), G first
    nets: tuple[Network, ...]  # one per role, in the same order (the untrained ones too: the teacher)
    method: Method  # what one training iteration does (cfg.method)
    device_map: DeviceMap
    env: DistEnv
    phases: PhaseTimer  # per-phase time of the iteration (segadv/monitor/profile.py)
    step: Accumulation  # one optimizer step: the method over train.accumulation_steps micro-batches

    def networks(self) -> list[Network]:
        """Every network trained (with an optimizer), G first."""
        return [net for net in self.nets if net.trained]

    def every_network(self) -> list[Network]:
        """Every network the run holds, trained or not (the teacher), G first: what is saved and placed."""
        return list(self.nets)

    def members(self) -> Iterator[tuple[Role, Network]]:
        """Each role with its network, G first (the untrained ones too)."""
        return zip(self.roles, self.nets)

    def network(self, role: str) -> Network | None:
        """The network of ``role`` (a role name), or None where the run has no such network."""
        return next((net for net in self.nets if net.role == role), None)

    @property
    def g(self) -> Network:
        return self.network("generator")

    @property
    def d(self) -> Network | None:
        """D, or None where the method trains none (MinEnt)."""
        return self.network("discriminator")

    @property
    def d_aux(self) -> Network | None:
        """The aux output's D (multi-level domain adaptation), else None."""
        return self.network("discriminator_aux")


def resolved_amp(names: tuple[str, ...], settings: list[NetworkSettings], device_map: DeviceMap,
                 env: DistEnv) -> list[NetworkSettings]:
    """Each role's settings with ``amp.<role>.enabled: auto`` resolved on the role's own devices
    (``resolve_auto``): the one place it is resolved, so everything built from a role (its
    autocast, its GradScaler, G's loss scaling) sees true or false. One log line per network says
    what was chosen and why. Under DDP every rank resolves on its own device, and the ranks must
    agree (a rank in bf16 beside one in float32 would train a different model per rank)."""
    out, chosen = [], {}
    for name, own in zip(names, settings):
        amp, why = resolve_auto(own.amp, device_map.devices_of(name))
        if own.amp.is_auto:
            chosen[f"amp.{name}.enabled: auto"] = "bf16" if amp.enabled else "off"
            if env.is_main:
                log.info("amp.%s: auto -> %s (%s)", name, chosen[f"amp.{name}.enabled: auto"], why)
        out.append(replace(own, amp=amp))
    if chosen:
        check_ranks_agree(chosen, hint="auto resolves on each rank's own device; on machines that differ "
                                       "set amp.<network>.enabled to true or false")
    return out


def network_roles(cfg: Config, device_map: DeviceMap, env: DistEnv, checked: Checked) -> tuple[Role, ...]:
    """The run's roles, G first, as ``checked`` (the start's checks) decided them, with their
    settings resolved (``amp.<role>.enabled: auto`` on their devices) and G's loss scaling."""
    names = tuple(own.name for own in checked.roles)
    settings = resolved_amp(names, [own.settings for own in checked.roles], device_map, env)
    for decided, own in zip(checked.roles, settings):  # amp.<role>.fsdp_param_dtype: amp against auto's choice
        check_fsdp_param_dtype(cfg, decided.name, decided.mode, own.amp.enabled)
    # G's loss passes through a D's backward when an adversarial term is on: scale it if that D is fp16.
    through_float16 = method_class(cfg.method.name).passes_generator_loss_through_discriminator(cfg) and any(
        uses_float16(own.amp) for decided, own in zip(checked.roles, settings) if not decided.generator)
    return tuple(replace(decided, settings=own,
                         loss_scaling=(uses_float16(own.amp) or through_float16) if decided.generator else None)
                 for decided, own in zip(checked.roles, settings))


def build_amp_optimizer(
    model: nn.Module, optim: OptimizerConfig, amp: NetworkAmpConfig, device: torch.device, horizon: int,
    lr_multiplier: float = 1.0, loss_scaling: bool | None = None, name: str = "network",
    skip_nonfinite: bool = False, accumulation_steps: int = 1,
) -> AmpOptimizer:
    """``horizon``: the steps the poly schedule decays over (``poly_horizon``, checked at start)."""
    optimizer = build_optimizer(model, optim.model_copy(update={"lr": optim.lr * lr_multiplier}))
    scheduler = build_poly_scheduler(optimizer, horizon, optim.poly_power, optim.warmup_steps, optim.poly_lag)
    return AmpOptimizer(optimizer, scheduler, device, amp, loss_scaling, name, skip_nonfinite, accumulation_steps)


def build_training(cfg: Config, device_map: DeviceMap, env: DistEnv = DistEnv(),
                   checked: Checked | None = None) -> Training:
    """The run's networks, placed, wrapped and with their optimisers, and its method built on them.
    ``checked``: the start's checks of ``cfg`` (``check_build``), made here where not given."""
    method_cls = method_class(cfg.method.name)
    roles = network_roles(cfg, device_map, env, checked or check_build(cfg, device_map, env))
    models = [role.build(role.settings.model, cfg.data.num_classes) for role in roles]
    place_networks([(role.name, model, role.devices[0], network_choice(role)) for role, model in zip(roles, models)],
                   device_map, channels_last=cfg.train.channels_last)
    nets = tuple(build_network(cfg, env, role, model) for role, model in zip(roles, models))
    if env.is_main:
        log.info("%s", batch_line(cfg, env.world_size))
    phases = PhaseTimer(precise=cfg.train.profile)
    method = method_cls.from_config(cfg, {net.role: net for net in nets}, phases)
    step = Accumulation(method, list(nets), cfg.train.accumulation_steps)
    return Training(roles, nets, method, device_map, env, phases, step)


def network_choice(role: Role) -> str:
    """The config key that chose ``role``'s network class (named where the device map splits a
    network that cannot be split)."""
    return f"model.{built_as(role.name)}.arch={role.settings.model.arch}" if role.generator else f"model.{role.name}"


def build_network(cfg: Config, env: DistEnv, role: Role, model: nn.Module) -> Network:
    """``role``'s placed network made ready to train (wrappers, optimizer, scaler, schedule)."""
    if role.sync_bn:
        model = sync_batch_norms(model)
    own = role.settings
    if not role.trained:
        model.requires_grad_(False)  # no backward ever reaches it: its method updates it in place
    wrapped = parallelize_network(model, role.mode, role.devices, own.amp, broadcast_buffers=role.broadcast_buffers,
                                  activation_checkpointing=role.checkpointing,
                                  compile_config=cfg.compile if role.compiled else None, role=role.name)
    if not role.trained:
        return Network(role.name, wrapped, None, role.devices, amp=own.amp)
    lr_multiplier = float(env.world_size) if cfg.train.lr_scaling == "linear" else 1.0
    opt = build_amp_optimizer(model, own.optim, own.amp, role.devices[0], role.horizon, lr_multiplier,
                              loss_scaling=role.loss_scaling, name=role.name,
                              skip_nonfinite=cfg.train.on_nonfinite == "skip_step",
                              accumulation_steps=cfg.train.accumulation_steps)
    return Network(role.name, wrapped, opt, role.devices)


def batch_line(cfg: Config, world_size: int) -> str:
    """The global batch a step's update sees and the learning rate it runs at: a config written for
    N GPUs keeps its global batch on fewer by a larger ``data.batch_size`` split into
    ``train.accumulation_steps`` micro-batches (the memory of one micro-batch), at the same lr."""
    per_process, steps = cfg.data.batch_size, cfg.train.accumulation_steps
    scale = world_size if cfg.train.lr_scaling == "linear" else 1
    optim = cfg.optim.generator
    head = f", its head {optim.lr * scale * optim.head_lr_mult:.3g}" if optim.head_lr_mult != 1 else ""
    return (f"global batch: {per_process * world_size} labeled images a step ({per_process} a process x {world_size} "
            f"process{'es' if world_size > 1 else ''}, in {steps} micro-batch{'es' if steps > 1 else ''} of "
            f"{per_process // steps}); G's lr {optim.lr * scale:.3g}{head}"
            f"{' (train.lr_scaling: linear)' if scale > 1 else ''}, as the config sets it for that batch")


@torch.no_grad()
def start_copies(parts: Training) -> None:
    """Each network whose role starts as another's (``RoleSpec.starts_as``: the teacher as G) made
    a copy of that network's weights, parameters and buffers: after the initial weights are loaded
    (``init.<role>``), before the first step. A resumed run then loads its own over them."""
    for net in parts.every_network():
        source = role(net.role).starts_as
        if source is None:
            continue
        original = parts.network(source)
        if original is None:
            raise TypeError(f"the {net.role} starts as the {source}, which this run does not hold")
        net.bare.load_state_dict(original.bare.state_dict())  # copies onto its own devices


def log_placement(parts: Training) -> None:
    """The placement table, every rank's rows, logged once by rank 0."""
    rows = [network_row(parts.env.rank, net.role, net.module, net.devices, net.opt) for net in parts.every_network()]
    rows = gather_rows(rows)
    if parts.env.is_main:
        log.info("placement:\n%s", placement_table(rows))
