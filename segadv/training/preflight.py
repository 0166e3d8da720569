"""What a start of ``segadv-train`` checks before anything slow (building networks, fetching
pretrained weights, reading checkpoints): the method against the model and the data, the files
the config names (``init.*``, a local ``model.generator.encoder_weights``, ``--resume PATH``), the
trackers it turns on (``log.wandb``, ``log.mlflow``: their packages installed),
and the data: each section checked against itself, its splits listed (no file opened) and each
stream's batch against its pool. A mistake in any of them is one UserError naming the key, before
a download's retries or a network's build: ``segadv-train --config voc data.root=/nonexistent``
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
    from segadv.training.build import Checked

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """What a start's checks established, for the builders to read on from."""

    checked: "Checked"  # the config checked for its build (segadv/training/build.py)
    catalog: "Catalog"  # the data as listed


def check_start(cfg: Config, resume: str | None, device_map: "DeviceMap", world_size: int = 1) -> Start:
    """Every cheap check of a start, in the order a user would fix them."""
    from segadv.methods import method_class
    from segadv.monitor.trackers import check_installed
    from segadv.training.build import check_build

    check_installed(cfg.log)  # log.wandb / log.mlflow on without their package
    checked = check_build(cfg, device_map)
    method = method_class(cfg.method.name)
    check_files(cfg, resume, method)
    return Start(checked, check_data(cfg, method, world_size))


def check_files(cfg: Config, resume: str | None, method: "type[Method]") -> None:
    """The weights files the config names for the networks ``method`` trains, and ``--resume
    PATH``, exist."""
    from segadv.models.generator import local_encoder_weights

    local_encoder_weights(cfg.model.generator)  # a path that does not exist is a UserError naming the key
    trained = method.networks(cfg)
    for role in type(cfg.init).model_fields:
        if role not in trained and getattr(cfg.init, role) is not None:
            log.info("init.%s: not used (the %s method trains %s)", role, method.name, ", ".join(trained))
    for role in trained:
        source = getattr(cfg.init, role, None)
        if source is not None and not user_path(source.path, f"init.{role}.path").exists():
            raise UserError(f"init.{role}.path: checkpoint not found: {source.path}")
    if resume not in (None, "auto") and not user_path(resume, "--resume").is_file():
        raise UserError(f"--resume {resume}: no such checkpoint file (--resume auto finds the newest in the run dir)")


def check_data(cfg: Config, method: "type[Method]", world_size: int) -> "Catalog":
    """``data`` and ``target_data`` each checked against itself and listed (segadv/data/catalog.py),
    and each of ``method``'s streams' batch against its pool as listed, on ``world_size`` ranks."""
    from segadv.data.catalog import Catalog

    return Catalog.for_streams(cfg.data, cfg.target_data, method.data_streams(cfg), method.stream_batch_sizes(cfg),
                               world_size)
