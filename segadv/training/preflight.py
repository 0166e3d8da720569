"""What a start of ``segadv-train`` checks before anything slow (building networks, fetching
pretrained weights, reading checkpoints), in the order a user would fix them: the config alone
(:func:`check_config`: the trackers it turns on, ``log.wandb`` and ``log.mlflow``, with their
packages installed; the method against the model and the data; G against the input sizes the
config fixes; the accumulation, the device map and each network's wrapper, compile and
SyncBatchNorm, segadv/training/checks.py ``check_build``), the files the config names
(``init.*``, a local ``model.generator.encoder_weights``, ``--resume PATH``), and the data: each
section checked against itself, its splits listed, each stream's batch against its pool and G
against the input sizes the images give where the config leaves them their own (the val split's
through its pipeline, and the training images' where their pipeline keeps their size: a header
read each, no file decoded).

The same functions check every row of a grid before its first run (``segadv-experiment run`` and
its ``--dry-run``, segadv/experiment/launcher.py ``start_problems``): :func:`check_config`,
:func:`missing_files` and :func:`missing_data`, which name every problem rather than the first,
and :func:`check_data`. A mistake in any of them is one UserError naming the key, before a
download's retries or a network's build: ``segadv-train --config voc data.root=/nonexistent``
answers at once. The data so listed, the ``Catalog``, is handed on to the data builders
(segadv/training/run_data.py), which read on from it, as the checks of the config for its build
are handed to the build: each check runs once. The device map is parsed before this
(segadv/training/loop.py ``start_processes``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from segadv.config import Config
from segadv.errors import UserError
from segadv.fsutil import user_path

if TYPE_CHECKING:
    from segadv.data.catalog import Catalog
    from segadv.methods import Method
    from segadv.parallel.device_map import DeviceMap
    from segadv.parallel.distributed import DistEnv
    from segadv.training.checks import Checked

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """What a start's checks established, for the builders to read on from."""

    checked: "Checked"  # the config checked for its build (segadv/training/checks.py)
    catalog: "Catalog"  # the data as listed


def check_start(cfg: Config, resume: str | None, device_map: "DeviceMap", env: "DistEnv | None" = None) -> Start:
    """Every cheap check of a start, in the order a user would fix them (``env``: the launch;
    None: one process)."""
    from segadv.methods import method_class

    checked = check_config(cfg, device_map, env)
    method = method_class(cfg.method.name)
    check_files(cfg, resume, method)
    return Start(checked, check_data(cfg, method, env.world_size if env is not None else 1,
                                     replicas=len(device_map.devices_of("generator"))))


def check_config(cfg: Config, device_map: "DeviceMap", env: "DistEnv | None" = None) -> "Checked":
    """The checks of the config alone, on ``device_map`` and in the launch ``env`` (None: one
    process), no file opened: the trackers' packages, then the build's (``check_build``)."""
    from segadv.monitor.trackers import check_installed
    from segadv.parallel.distributed import DistEnv
    from segadv.training.checks import check_build

    check_installed(cfg.log)  # log.wandb / log.mlflow on without their package
    return check_build(cfg, device_map, env if env is not None else DistEnv())


def check_files(cfg: Config, resume: str | None, method: "type[Method]") -> None:
    """The weights files the config names for the networks ``method`` trains, and ``--resume
    PATH``, exist: a UserError naming each that does not."""
    trained = method.networks(cfg)
    for role in type(cfg.init).model_fields:
        if role not in trained and getattr(cfg.init, role) is not None:
            log.info("init.%s: not used (the %s method trains %s)", role, method.name, ", ".join(trained))
    missing = missing_files(cfg, resume, method)
    if missing:
        raise UserError("; ".join(problem.message for problem in missing))


@dataclass(frozen=True)
class Missing:
    """A file or folder a start reads that is not there (or cannot be read)."""

    key: str  # the config key or option that names it
    message: str  # the start's error: the key, what is wrong and the path
    path: str | None = None  # the one file the key names, as the config gives it (None: a data section's)


def missing_files(cfg: Config, resume: str | None, method: "type[Method]") -> list[Missing]:
    """Each weights file the config names for the networks ``method`` trains (``init.<role>.path``,
    a local ``model.generator.encoder_weights``) and ``--resume PATH`` that does not exist, all of
    them (:func:`check_files` and ``segadv-experiment``'s check of a grid)."""
    found = []
    weights = cfg.model.generator.encoder_weights
    if weights is not None:  # (the models' module brings torch: only where there is a file to look for)
        from segadv.models.generator import local_encoder_weights

        try:
            local_encoder_weights(cfg.model.generator)  # a named set (imagenet) is no file
        except UserError as err:
            found.append(Missing("model.generator.encoder_weights", str(err), weights))
    for role in method.networks(cfg):
        source = getattr(cfg.init, role, None)
        if source is None:
            continue
        key = f"init.{role}.path"
        try:
            exists = user_path(source.path, key).exists()
        except UserError as err:  # an empty path
            found.append(Missing(key, str(err), source.path))
            continue
        if not exists:
            found.append(Missing(key, f"{key}: checkpoint not found: {source.path}", source.path))
    if resume not in (None, "auto") and not user_path(resume, "--resume").is_file():
        found.append(Missing("--resume", f"--resume {resume}: no such checkpoint file (--resume auto finds the "
                                         "newest in the run dir)", resume))
    return found


def missing_data(cfg: Config) -> list[Missing]:
    """What listing ``data`` and ``target_data`` meets (a root, a folder its layout reads or a list
    file missing, a key that does not fit the kind), each section listed apart so that a problem
    in each is named: the checks of :func:`check_data`'s catalog, without the batches."""
    from segadv.data.catalog import Catalog

    return [Missing(key, message) for key, message in Catalog.problems(cfg.data, cfg.target_data)]


def check_data(cfg: Config, method: "type[Method]", world_size: int, catalog: "Catalog | None" = None,
               replicas: int = 1) -> "Catalog":
    """``data`` and ``target_data`` each checked against itself and listed (segadv/data/catalog.py;
    ``catalog``: as listed already, for the rows of a grid that share their data), each of
    ``method``'s streams' batch against its pool as listed, on ``world_size`` ranks, G (on
    ``replicas`` devices) against the input sizes the images give (``check_image_inputs``), and the
    labeled training masks surveyed: none holding a labelled pixel is a UserError naming them."""
    from segadv.data.catalog import Catalog
    from segadv.training.checks import check_image_inputs

    if catalog is None:
        catalog = Catalog.open(cfg.data, cfg.target_data)
    catalog.check_streams(method.data_streams(cfg), method.stream_batch_sizes(cfg), world_size)
    check_image_inputs(cfg, catalog, replicas)
    return catalog.surveyed()
