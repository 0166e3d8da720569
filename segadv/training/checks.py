"""The checks a start makes of a build before anything is built: the method against the config,
the input sizes G is given (the config's, then the images' own), the accumulation and the batches on
G's replicas, the device map against the roles, and each network's settings against its arch, its
devices, its wrapper, compile and SyncBatchNorm. ``check_build`` hands what they decided to the build
(segadv/training/build.py) as ``Checked``; segadv-train's start (segadv/training/preflight.py),
segadv-experiment's check of a grid's rows, segadv-plan and the build itself call it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from segadv.config import Config
from segadv.config.roles import ROLES, built_as, role, setting
from segadv.config.schema import DataConfig, DiscriminatorConfig
from segadv.data.batch_checks import BatchTooSmall, check_micro_batches
from segadv.data.catalog import Catalog, ImageInputs, image_inputs
from segadv.data.config_checks import input_shapes, training_shape, training_side
from segadv.data.listing import Listed
from segadv.engine.optim import check_groups, poly_horizon
from segadv.errors import UserError
from segadv.methods import method_class
from segadv.models.discriminator import check_input_side
from segadv.models.registry import generator_arch, resolve
from segadv.parallel import DeviceMap
from segadv.parallel.compile import check_compile, compile_enabled
from segadv.parallel.distributed import DistEnv
from segadv.parallel.wrap import check_batch_for_replicas, resolve_mode
from segadv.training.early_stop import check_monitor
from segadv.training.role import Role, network_settings

log = logging.getLogger(__name__)


def run_role_names(cfg: Config) -> tuple[str, ...]:
    """The roles of the networks ``cfg`` trains: its method's (``Method.networks``)."""
    names = method_class(cfg.method.name).networks(cfg)
    for name in names:
        if name not in ROLES:
            raise TypeError(f"method {cfg.method.name} trains a network of role {name!r}, which is not a role "
                            f"({', '.join(ROLES)}; segadv/config/roles.py register_role)")
    return names


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
class Checked:
    """A config checked for its build on a device map (``check_build``). segadv-train's start
    makes the checks before anything slow (segadv/training/preflight.py) and hands this on, so the
    build does not make them again; a caller that gives none (segadv-plan, a test) has them made
    by the build."""

    micro_batch: int  # the labeled micro-batch, checked against G's BatchNorm on each of its replicas
    roles: tuple[Role, ...]  # the method's networks, G first, their amp settings as the config says


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


def check_role(cfg: Config, name: str, device_map: DeviceMap, env: DistEnv, micro_batch: int) -> Role:
    """One network's checks and decisions before it is built: G's settings as its arch's builder
    would refuse them (``check``, where the builder has one: a DeepLab's encoder name) and its
    optimizer's groups against its arch, a D's depth against its input, its schedule's horizon,
    its wrapper against its devices and the launch, the micro-batch over its replicas, its compile
    and G's SyncBatchNorm."""
    generator = built_as(name) == "generator"
    trained = role(name).trained
    if generator:
        row = generator_arch(cfg.model.generator.arch)
        if row.check is not None:
            resolve(row.check)(cfg.model.generator)
        if trained:
            check_groups(setting(cfg.optim, name), row)
    else:
        check_discriminator_input(cfg, setting(cfg.model, name), f"model.{name}")
    horizon = poly_horizon(setting(cfg.optim, name), cfg.train.max_steps, name) if trained else None
    devices = device_map.devices_of(name)
    # An untrained network has no gradients to sync: under DDP each rank holds its own copy,
    # kept equal by its method (the teacher: an EMA of G's synced weights). Under FSDP the copy is
    # sharded like the network it copies (same units, same ranks), its EMA shard by shard.
    mode = resolve_mode(setting(cfg.parallel, name), name, devices, env) if trained or not env.distributed \
        else copy_mode(cfg, name)
    if mode == "fsdp" and len(device_map.stages_of(name)) > 1:
        raise UserError(f"parallel.{name}=fsdp with the device "
                        f"map {device_map} splitting the {name} into pipeline stages: FSDP shards a network held on "
                        "one device per process; drop the split (each rank then holds 1/N of it) or use ddp")
    check_fsdp_param_dtype(cfg, name, mode)
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
        raise UserError("parallel.sync_bn needs the generator under DDP (a multi-process launch)"
                        + (": FSDP shards G's parameters only, each rank's BatchNorm normalises its own batch; "
                           "set parallel.generator=ddp or parallel.sync_bn=false" if mode == "fsdp" else ""))
    if sync_bn and devices[0].type != "cuda":
        raise UserError("parallel.sync_bn needs the generator on CUDA (SyncBatchNorm has no CPU kernel)")
    return Role(role(name), network_settings(cfg, name), devices, mode, checkpointing, compiled, sync_bn, horizon)


def amp_key(cfg: Config, name: str, key: str) -> str:
    """The config key ``amp.<role>.<key>`` that ``name``'s value comes from: its own entry's, or
    where it has none the entry of the role it falls back to (the teacher: G's)."""
    spec = role(name)
    while getattr(cfg.amp, spec.name, None) is None and spec.falls_back_to is not None:
        spec = role(spec.falls_back_to)
    return f"amp.{spec.name}.{key}"


def check_fsdp_param_dtype(cfg: Config, name: str, mode: str, enabled: bool | None = None) -> None:
    """``amp.<role>.fsdp_param_dtype: amp`` only where it means something: the network sharded by
    FSDP (``mode``, its wrapper as the launch resolves it) with autocast on (``enabled``: the entry's
    ``enabled`` once ``auto`` is resolved on its devices; None: not resolved yet, the config's
    validation refused ``false``)."""
    amp = setting(cfg.amp, name)
    if amp is None or amp.fsdp_param_dtype != "amp":
        return
    key = amp_key(cfg, name, "fsdp_param_dtype")
    if mode != "fsdp":
        source = role(name).starts_as  # a copy (the teacher) is sharded where the network it copies is
        wrapper = f"parallel.{name}=fsdp" if role(name).trained or source is None else \
            f"parallel.{source}=fsdp (the {name} is sharded like it)"
        raise UserError(f"{key}=amp sets how FSDP gathers the {name}'s parameters, but the {name} is not "
                        f"sharded by FSDP (its wrapper here: {mode}): set {wrapper} under a multi-process "
                        f"launch, or {key}=float32")
    if enabled is False:
        raise UserError(f"{key}=amp gathers the {name}'s parameters in its autocast dtype, but "
                        f"{amp_key(cfg, name, 'enabled')}=auto resolved to off on this device (no bf16 compute): "
                        f"set {amp_key(cfg, name, 'enabled')}=true, or {key}=float32")


def copy_mode(cfg: Config, name: str) -> str:
    """The wrapper of an untrained network under a multi-process launch: fsdp where the network it
    starts as (the teacher's G) is sharded, so that its EMA pairs shard with shard; else none."""
    source = role(name).starts_as
    if source is not None and setting(cfg.parallel, source) == "fsdp":
        return "fsdp"
    return "none"


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
    return (f"set {key}.val_resize_to_multiple: true (each image resized to the nearest multiple, G's output "
            f"resized back to the labels: UniMatch V2's evaluation), or {key}.val_input_size: [{multiple(width, 16)}, "
            f"{multiple(height, 16)}] (G predicts at that size, its output upsampled to the labels), or pad the val "
            f"images to a multiple: {key}.val_transforms: [..., "
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
