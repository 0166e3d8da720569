"""Assemble a run's parts from a config: networks, placement, wrapping, per-network optimisation,
the method.

Kept apart from the loop so tests and ``tools/bench.py`` build exactly what training builds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch
from torch import nn

from segadv.checkpoint import load_encoder_weights
from segadv.config import Config
from segadv.config.archs import generator_arch, resolve
from segadv.config.roles import ROLES, built_as, role, setting
from segadv.config.schema import (
    DataConfig,
    DiscriminatorConfig,
    GeneratorConfig,
    InitSource,
    NetworkAmpConfig,
    OptimizerConfig,
)
from segadv.data.batch_checks import BatchTooSmall, check_micro_batches
from segadv.data.catalog import Catalog, ImageInputs, image_inputs
from segadv.data.config_checks import input_shapes, training_shape, training_side
from segadv.data.listing import Listed
from segadv.engine.accumulation import Accumulation
from segadv.engine.amp_optimizer import AmpOptimizer, resolve_auto, uses_float16
from segadv.engine.network import Network
from segadv.engine.optim import build_optimizer, build_poly_scheduler, check_groups, poly_horizon
from segadv.errors import UserError
from segadv.methods import Method, method_class
from segadv.models import build_discriminator, build_generator
from segadv.models.discriminator import check_input_side
from segadv.monitor.profile import PhaseTimer
from segadv.parallel import DeviceMap, place_networks
from segadv.parallel.compile import check_compile, compile_enabled
from segadv.parallel.distributed import DistEnv, check_ranks_agree
from segadv.parallel.report import gather_rows, network_row, placement_table
from segadv.parallel.wrap import check_batch_for_replicas, parallelize_network, resolve_mode
from segadv.training.early_stop import check_monitor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NetworkSettings:
    """One role's settings from the config's per-network sections."""

    model: GeneratorConfig | DiscriminatorConfig
    optim: OptimizerConfig
    amp: NetworkAmpConfig
    parallel: str
    init: InitSource | None  # weights to start from (init.<role>), or None


@dataclass(frozen=True)
class Role:
    """One network of the run and everything decided for it before it is built: the one place
    where the generator and the discriminators differ (``network_roles``). The rest of the package
    loops over a run's roles and asks them."""

    name: str  # its role (segadv/config/roles.py): its config key and checkpoint keys
    short: str  # its role's short name: the device map's, and its scalars' (train/lr_g, amp/scale_d_aux)
    settings: NetworkSettings
    devices: tuple[torch.device, ...]  # devices[0]: where its parameters live and its output is gathered
    mode: str  # its wrapper: none, dp or ddp
    checkpointing: bool  # activation checkpointing of its blocks
    compiled: bool  # torch.compile of its forward
    build: Callable[[GeneratorConfig | DiscriminatorConfig, int], nn.Module]  # (model settings, classes) -> network
    # Under DDP: G's BatchNorm statistics follow rank 0, so every rank evaluates (and could save)
    # the same model; a D has no buffers, so there is nothing to broadcast.
    broadcast_buffers: bool
    loss_scaling: bool | None  # scale its loss whatever its own AMP says (None: as its AMP says)
    sync_bn: bool  # its BatchNorm layers synchronised across ranks
    # Trained by a backward and an optimizer step (RoleSpec.trained); else no optimizer, no
    # GradScaler, no gradient-syncing wrapper, no gradients: its method updates it (the teacher).
    trained: bool = True
    horizon: int | None = None  # the steps its poly schedule decays over (trained only; poly_horizon)


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


def run_role_names(cfg: Config) -> tuple[str, ...]:
    """The roles of the networks ``cfg`` trains: its method's (``Method.networks``)."""
    names = method_class(cfg.method.name).networks(cfg)
    for name in names:
        if name not in ROLES:
            raise TypeError(f"method {cfg.method.name} trains a network of role {name!r}, which is not a role "
                            f"({', '.join(ROLES)}; segadv/config/roles.py register_role)")
    return names


def network_settings(cfg: Config, role: str) -> NetworkSettings:
    """``role``'s model, optimizer, AMP and parallel settings, its own or where it has none those of
    the role it falls back to (each network still gets its own instances: optimizer, GradScaler,
    wrapper); and its ``init`` weights, its own only: a role without an ``init`` key starts from its
    own initialisation."""
    return NetworkSettings(*(setting(section, role) for section in (cfg.model, cfg.optim, cfg.amp, cfg.parallel)),
                           getattr(cfg.init, role, None))


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


def check_map_roles(device_map: DeviceMap, names: tuple[str, ...], method: str, env: DistEnv) -> None:
    """The roles the device map names against those the run trains. G and D may be named on any
    run (each fills the other in; a MinEnt run trains no D): one line says what is not used. A role
    beyond them (one that falls back to another) named where the run lacks it is refused: the
    config does not train what the map was written for."""
    unused = [role(name) for name in device_map.named if name not in names]
    for spec in unused:
        if spec.falls_back_to is not None:
            raise UserError(f"device map {device_map}: {spec.short} names a device, but this run trains no {spec.name} "
                            f"(the {method} method trains {', '.join(names)} here)")
    if unused and env.is_main:
        log.info("device map %s: %s not used (the %s method trains %s)", device_map,
                 ", ".join(spec.short for spec in unused), method, ", ".join(names))


@dataclass(frozen=True)
class CheckedRole:
    """What the start's checks decided for one of the run's networks from the config and the
    device map alone (``check_build``), before it is built: ``network_roles`` makes its ``Role``
    of it."""

    name: str
    devices: tuple[torch.device, ...]
    mode: str  # its wrapper: none, dp or ddp
    checkpointing: bool
    compiled: bool
    sync_bn: bool
    trained: bool
    horizon: int | None  # the steps its poly schedule decays over (None: untrained, no schedule)


@dataclass(frozen=True)
class Checked:
    """A config checked for its build on a device map (``check_build``). segadv-train's start
    makes the checks before anything slow (segadv/training/preflight.py) and hands this on, so the
    build does not make them again; a caller that gives none (segadv-plan, a test) has them made
    by the build."""

    micro_batch: int  # the labeled micro-batch, checked against G's BatchNorm on each of its replicas
    roles: tuple[CheckedRole, ...]  # the method's networks, G first


def check_build(cfg: Config, device_map: DeviceMap, env: DistEnv = DistEnv()) -> Checked:
    """Every check of a build that the config, the device map and the launch (``env``) decide,
    none of them building anything: the method against the model and the data (its
    ``check_config``; ``train.early_stop``'s score against what its evaluations compute), G
    against the input sizes the config fixes, the accumulation and the micro-batches on G's
    replicas (``check_accumulation``), the device map against the networks the method trains, and
    each network's input, wrapper, compile and SyncBatchNorm (``check_role``). segadv-train's start
    and segadv-experiment's check of a grid's rows make them (segadv/training/preflight.py)."""
    method_class(cfg.method.name).check_config(cfg)
    check_monitor(cfg, method_class(cfg.method.name))
    for data in (cfg.data, cfg.target_data):
        for height, width, source in input_shapes(data, "data" if data is cfg.data else "target_data") if data else ():
            cfg.model.generator.check_input_size(height, width, source)
    micro_batch = check_accumulation(cfg, replicas=len(device_map.devices_of("generator")))
    names = run_role_names(cfg)
    check_map_roles(device_map, names, cfg.method.name, env)
    return Checked(micro_batch, tuple(check_role(cfg, name, device_map, env, micro_batch) for name in names))


def check_role(cfg: Config, name: str, device_map: DeviceMap, env: DistEnv, micro_batch: int) -> CheckedRole:
    """One network's checks and decisions before it is built: G's settings as its arch's builder
    would refuse them (``check``, where the builder has one: a DeepLab's encoder name) and its
    optimizer's groups against its arch, a D's depth against its input, its schedule's horizon,
    its wrapper against its devices and the launch, the micro-batch over its replicas, its compile
    and G's SyncBatchNorm."""
    generator = built_as(name) == "generator"
    trained = role(name).trained
    if generator:
        row = generator_arch(cfg.model.generator.arch)
        check = getattr(resolve(row.builder), "check", None)
        if check is not None:
            check(cfg.model.generator)
        if trained:
            check_groups(setting(cfg.optim, name), row)
    else:
        check_discriminator_input(cfg, setting(cfg.model, name), f"model.{name}")
    horizon = poly_horizon(setting(cfg.optim, name), cfg.train.max_steps, name) if trained else None
    devices = device_map.devices_of(name)
    # An untrained network has no gradients to sync: under DDP each rank holds its own copy,
    # kept equal by its method (the teacher: an EMA of G's synced weights).
    mode = resolve_mode(setting(cfg.parallel, name), name, devices, env) if trained or not env.distributed else "none"
    checkpointing = generator and trained and cfg.model.generator.activation_checkpointing
    compiled = compile_enabled(cfg.compile, name)
    check_batch_for_replicas(micro_batch, len(devices), name)
    if compiled:
        check_compile(cfg.compile, name, devices, mode, checkpointing)
    sync_bn = generator and trained and cfg.parallel.sync_bn
    if sync_bn and cfg.model.generator.norm == "frozen":
        raise UserError("parallel.sync_bn with model.generator.norm=frozen: G's BatchNorm statistics are fixed, "
                        "there are none to synchronise")
    if sync_bn and mode != "ddp":
        raise UserError("parallel.sync_bn needs the generator under DDP (a multi-process launch)")
    if sync_bn and devices[0].type != "cuda":
        raise UserError("parallel.sync_bn needs the generator on CUDA (SyncBatchNorm has no CPU kernel)")
    return CheckedRole(name, devices, mode, checkpointing, compiled, sync_bn, trained, horizon)


def network_roles(cfg: Config, device_map: DeviceMap, env: DistEnv, checked: Checked) -> tuple[Role, ...]:
    """The run's roles, G first, as ``checked`` (the start's checks) decided them, each with its
    settings (``amp.<role>.enabled: auto`` resolved on its devices)."""
    names = tuple(own.name for own in checked.roles)
    settings = resolved_amp(names, [network_settings(cfg, name) for name in names], device_map, env)
    # G's loss passes through a D's backward when an adversarial term is on: scale it if that D is fp16.
    through_float16 = method_class(cfg.method.name).passes_generator_loss_through_discriminator(cfg) and any(
        uses_float16(own.amp) for name, own in zip(names, settings) if built_as(name) != "generator")
    roles = []
    for decided, own in zip(checked.roles, settings):
        # The one place a generator and a discriminator differ: a role is built as one or the other.
        generator = built_as(decided.name) == "generator"
        roles.append(Role(
            decided.name, role(decided.name).short, own, decided.devices, decided.mode,
            checkpointing=decided.checkpointing, compiled=decided.compiled,
            build=generator_model if generator else build_discriminator, broadcast_buffers=generator,
            loss_scaling=(uses_float16(own.amp) or through_float16) if generator else None, sync_bn=decided.sync_bn,
            trained=decided.trained, horizon=decided.horizon))
    return tuple(roles)


def generator_model(cfg: GeneratorConfig, num_classes: int) -> nn.Module:
    """G, with the local encoder weights file ``model.generator.encoder_weights`` names, if any."""
    model = build_generator(cfg, num_classes)
    load_encoder_weights(model, cfg)
    return model


def build_amp_optimizer(
    model: nn.Module, optim: OptimizerConfig, amp: NetworkAmpConfig, device: torch.device, horizon: int,
    lr_multiplier: float = 1.0, loss_scaling: bool | None = None, name: str = "network",
    skip_nonfinite: bool = False, accumulation_steps: int = 1,
) -> AmpOptimizer:
    """``horizon``: the steps the poly schedule decays over (``poly_horizon``, checked at start)."""
    optimizer = build_optimizer(model, optim.model_copy(update={"lr": optim.lr * lr_multiplier}))
    scheduler = build_poly_scheduler(optimizer, horizon, optim.poly_power, optim.warmup_steps)
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
    arch = getattr(role.settings.model, "arch", None)
    return f"model.{built_as(role.name)}.arch={arch}" if arch is not None else f"model.{role.name}"


def build_network(cfg: Config, env: DistEnv, role: Role, model: nn.Module) -> Network:
    """``role``'s placed network made ready to train (wrappers, optimizer, scaler, schedule)."""
    if role.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
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


def check_accumulation(cfg: Config, replicas: int = 1) -> int:
    """``train.accumulation_steps`` against every stream's batch size, and each micro-batch (each
    of G's ``replicas``' chunk of it) against BatchNorm where G cannot train on one sample at the
    training sizes the config fixes; returns the labeled micro-batch's size."""
    steps = cfg.train.accumulation_steps
    sizes = stream_batch_sizes(cfg)
    for key, size in sizes.items():
        if size % steps:
            raise UserError(f"train.accumulation_steps={steps} does not divide {key}={size}: each optimizer step "
                            f"takes {steps} equal micro-batches of every stream's batch")
    if not cfg.model.generator.trains_on_one_sample:
        check_micro_batches(sizes, steps, replicas)
    else:
        check_one_cell(cfg, one_cell_size(cfg), replicas)
    return cfg.data.batch_size // steps


def stream_batch_sizes(cfg: Config) -> dict[str, int]:
    """Every stream's batch size by its config key, ``data.batch_size`` first."""
    method_cls = method_class(cfg.method.name)
    by_stream = method_cls.stream_batch_sizes(cfg)
    return {"data.batch_size": cfg.data.batch_size, **{spec.batch_size_key: by_stream[spec.name]
                                                       for spec in method_cls.data_streams(cfg)}}


def check_one_cell(cfg: Config, one_cell: str | None, replicas: int) -> None:
    """Where G's deepest feature map is 1x1 at a training size (``one_cell``: where that size comes
    from; None: at none), every micro-batch and replica chunk of two or more: its BatchNorm on
    batch statistics (``model.generator.norm``) would see one value per channel in a batch of one."""
    if one_cell is None:
        return
    try:
        check_micro_batches(stream_batch_sizes(cfg), cfg.train.accumulation_steps, replicas)
    except BatchTooSmall as err:
        g = cfg.model.generator
        keys = ", ".join(f"{key}={getattr(g, key)}" for key in ("encoder_depth", "output_stride") if hasattr(g, key))
        raise BatchTooSmall(
            f"{one_cell}: model.generator.arch={g.arch}{f' ({keys})' if keys else ''} makes G's deepest feature "
            f"map 1x1 there, where its BatchNorm (model.generator.norm={g.norm}: batch statistics) has one value "
            f"per channel in a batch of one, and {err}; or train on larger images (data.train_transforms)") from None


def one_cell_size(cfg: Config, catalog: Catalog | None = None) -> str | None:
    """Where G's deepest feature map is 1x1 at a training size while its BatchNorm trains on batch
    statistics, if anywhere: there even an arch without image pooling (DeepLab-v2) cannot train on
    one sample. The sizes the config fixes (``training_shape``: the key they come from), and with
    ``catalog``, where the config leaves the training images their own sizes, theirs (reading
    their headers: the split and its first such image)."""
    generator = cfg.model.generator
    if not generator.trains_batch_statistics:
        return None
    for data, key, listed in training_sections(cfg, catalog):
        shape = training_shape(data, key)
        if shape is not None:
            if generator.deepest_map(shape[0], shape[1]) == (1, 1):
                return shape[2]
            continue
        inputs = image_inputs(listed, key, "train") if listed is not None else None
        cells = [group for group in inputs.groups if generator.deepest_map(*group[0]) == (1, 1)] if inputs else []
        if cells:
            return inputs.source(cells)
    return None


def trains_on_one_sample(cfg: Config, catalog: Catalog | None = None) -> bool:
    """Whether a batch of one sample trains G at the run's training sizes
    (``GeneratorConfig.trains_on_one_sample``, and no 1x1 deepest map: :func:`one_cell_size`,
    with ``catalog`` at the training images' own sizes too)."""
    return cfg.model.generator.trains_on_one_sample and one_cell_size(cfg, catalog) is None


def training_sections(cfg: Config, catalog: Catalog | None) -> list[tuple[DataConfig, str, Listed | None]]:
    """``data`` and, under domain adaptation, ``target_data``, each with its key and, with
    ``catalog``, its listing."""
    sections = [(cfg.data, "data", catalog.source if catalog is not None else None)]
    if cfg.target_data is not None:
        sections.append((cfg.target_data, "target_data", catalog.target if catalog is not None else None))
    return sections


def evaluated_sections(cfg: Config, catalog: Catalog) -> list[tuple[str, Listed]]:
    """The sections whose val split the run evaluates, with their listings: the target's under
    domain adaptation (and the source's with ``train.eval_source``), else the source's
    (segadv/data/loaders.py ``build_run_loaders``)."""
    if catalog.target is None:
        return [("data", catalog.source)]
    return [("target_data", catalog.target)] + ([("data", catalog.source)] if cfg.train.eval_source else [])


def check_image_inputs(cfg: Config, catalog: Catalog, replicas: int = 1) -> None:
    """G against the input sizes the images give where the config leaves them their own (the
    sizes it fixes are ``check_build``'s): each evaluated val split's images through its pipeline,
    and the training images where their pipeline keeps their size, against G's input divisor
    (``GeneratorConfig.check_input_size``, naming the split, an image and the fix); and a 1x1
    deepest map at a training image's size in a batch of one (:func:`check_one_cell`). The headers
    are read only where a check needs them (a divisor, a batch of one)."""
    generator = cfg.model.generator
    divisor = generator.input_divisor
    if divisor > 1:
        found = [image_inputs(listed, key, "val") for key, listed in evaluated_sections(cfg, catalog)]
        found += [image_inputs(listed, key, "train") for _, key, listed in training_sections(cfg, catalog)
                  if listed is not None]
        problems = []
        for inputs in (inputs for inputs in found if inputs is not None):
            bad = [group for group in inputs.groups if group[0][0] % divisor or group[0][1] % divisor]
            try:
                if bad:
                    height, width = bad[0][0]
                    generator.check_input_size(height, width, inputs.source(bad),
                                               input_fix(inputs, height, width, divisor))
            except UserError as err:
                problems.append(str(err))
        if len(problems) > 1:
            raise UserError(f"{len(problems)} splits' images reach G at sizes it cannot take:\n"
                            + "\n".join(f"  {problem}" for problem in problems))
        if problems:
            raise UserError(problems[0])
    if generator.trains_on_one_sample and one_cell_size(cfg) is None:  # the config's sizes: check_accumulation's
        try:
            check_micro_batches(stream_batch_sizes(cfg), cfg.train.accumulation_steps, replicas)
        except BatchTooSmall:  # a batch of one: the images' own sizes decide
            check_one_cell(cfg, one_cell_size(cfg, catalog), replicas)


def input_fix(inputs: ImageInputs, height: int, width: int, divisor: int) -> str:
    """What makes a split's images ``height`` x ``width`` reach G at a multiple of ``divisor``."""
    def multiple(side: int, least: int = 1) -> int:
        return max(round(side / divisor), -(-least // divisor), 1) * divisor

    key = inputs.key
    if inputs.split == "train":  # a crop no larger than the images, or where they are smaller, a resize
        step = "RandomCrop" if min(height, width) >= divisor else "Resize"
        return (f"crop or resize them to a multiple in {key}.train_transforms, e.g. {{name: {step}, height: "
                f"{max(height // divisor, 1) * divisor}, width: {max(width // divisor, 1) * divisor}}}")
    return (f"set {key}.val_input_size: [{multiple(width, 16)}, {multiple(height, 16)}] (G predicts at that size, its "
            f"output upsampled to the labels), or pad the val images to a multiple: {key}.val_transforms: [..., "
            f"{{name: PadIfNeeded, min_height: null, min_width: null, pad_height_divisor: {divisor}, pad_width_divisor: "
            f"{divisor}, position: top_left}}] (the padding is not scored)")


def check_discriminator_input(cfg: Config, model: DiscriminatorConfig, key: str) -> None:
    """A D's depth (``model``, at config ``key``) against the smallest training side it is given
    (G's maps are at the input's size): the source's, and the target's under domain adaptation,
    where the config says it."""
    sides = [training_side(cfg.data)]
    if cfg.target_data is not None:
        sides.append(training_side(cfg.target_data, "target_data"))
    for side, source in (side for side in sides if side is not None):
        check_input_side(model, side, key, source)


def log_placement(parts: Training) -> None:
    """The placement table, every rank's rows, logged once by rank 0."""
    rows = [network_row(parts.env.rank, net.role, net.module, net.devices, net.opt) for net in parts.every_network()]
    rows = gather_rows(rows)
    if parts.env.is_main:
        log.info("placement:\n%s", placement_table(rows))
