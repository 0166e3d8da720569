"""The one inference loader: a checkpoint, a weights file or an smp directory (+ an optional
config) -> the bare generator, for segadv-eval, segadv-ckpt convert, segadv-export and
segadv-predict.

- A segadv checkpoint carries its resolved config (a config file, if named, replaces it).
- A raw state dict (``.pt``/``.pth``/``.safetensors``: plain, DataParallel, DDP or
  ``torch.compile`` prefixes, or weights under ``state_dict`` / ``model`` / ``generator`` ...)
  carries none, so the caller must name a config file.
- A run dir means its best checkpoint (``checkpoints/best.pt``; ``last.pt`` before any evaluation:
  segadv/checkpoint/run_checkpoint.py), for every command that takes a checkpoint.
- A directory written by smp's ``save_pretrained`` (segadv/checkpoint/smp_dir.py) describes G in
  its ``config.json``; the rest (data: classes, normalisation) comes from the named config file,
  whose generator must be the one described, or else from the embedded default config.

Weights always go through :func:`segadv.checkpoint.loader.load_weights` (strict; a clear error
on any mismatch).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

from segadv.checkpoint.io import read_checkpoint
from segadv.checkpoint.loader import CheckpointMismatchError, load_weights
from segadv.checkpoint.run_checkpoint import checkpoint_of_run
from segadv.checkpoint.smp_dir import CONFIG_FILE, WEIGHTS_FILE, check_smp_config, config_overrides, read_smp_config
from segadv.checkpoint.state import is_segadv_checkpoint
from segadv.config import Config, config_from_dict, load_config
from segadv.errors import UserError
from segadv.fsutil import file_sha256
from segadv.models import build_generator_for_weights

log = logging.getLogger(__name__)


@dataclass
class LoadedGenerator:
    model: nn.Module  # the bare generator, eval mode, on the CPU, float32
    cfg: Config
    checkpoint: Path
    sha256: str  # of the weights file (an smp directory's model.safetensors)
    kind: str  # "segadv checkpoint", "state dict" or "smp directory"
    step: Optional[int]
    config_source: str  # where the config came from

    def source_info(self) -> dict[str, Any]:
        return {
            "checkpoint": str(self.checkpoint),
            "sha256": self.sha256,
            "kind": self.kind,
            "step": self.step,
            "config": self.config_source,
        }


def checkpoint_path(checkpoint: str | Path, *, say: bool = True) -> Path:
    """The file (or smp directory) ``checkpoint`` names: a run dir's best checkpoint, said in the log
    unless ``say`` is false."""
    in_run = checkpoint_of_run(checkpoint)
    if in_run is None:
        return Path(checkpoint)
    if say:
        log.info("%s", in_run.note)
    return in_run.path


def read_files(checkpoint: str | Path, config: Optional[str] = None,
               name: str = "--checkpoint") -> list[tuple[str, str]]:
    """``(what, path)`` of every file :func:`load_generator` reads: none may be an output.
    ``name``: how the command's user gave the checkpoint (an option or an argument)."""
    path = checkpoint_path(checkpoint, say=False)  # load_generator says it
    files = [(name, str(path))]
    if path.is_dir():
        files += [(f"{name}'s {file}", str(path / file)) for file in (CONFIG_FILE, WEIGHTS_FILE)]
    return files + ([("--config", str(config))] if config else [])


def load_generator(
    checkpoint: str | Path,
    config: Optional[str] = None,
    overrides: Sequence[str] = (),
    *,
    trusted: bool = False,
) -> LoadedGenerator:
    path = checkpoint_path(checkpoint)
    if path.is_dir():
        return _load_smp_dir(path, config, overrides)
    ckpt = read_checkpoint(path, trusted=trusted)
    cfg, config_source = resolve_config(ckpt, path, config, overrides)
    segadv_ckpt = is_segadv_checkpoint(ckpt)
    step = ckpt.get("step") if segadv_ckpt else None
    return LoadedGenerator(
        model=_load_into(build_generator_for_weights(cfg.model.generator, cfg.data.num_classes), ckpt, path),
        cfg=cfg,
        checkpoint=path,
        sha256=file_sha256(path),
        kind="segadv checkpoint" if segadv_ckpt else "state dict",
        step=int(step) if isinstance(step, int) else None,
        config_source=config_source,
    )


def resolve_config(ckpt: dict, path: Path, config: Optional[str], overrides: Sequence[str]) -> tuple[Config, str]:
    if config is not None:
        return load_config(config, overrides), str(config)
    if isinstance(ckpt.get("config"), dict):
        source = f"config saved in {path}"
        return config_from_dict(ckpt["config"], overrides=overrides, source=source), source
    raise UserError(
        f"{path} carries no config (a raw state dict, not a segadv checkpoint): pass --config FILE "
        "(and key=value overrides) describing the generator it was trained with"
    )


def _load_smp_dir(directory: Path, config: Optional[str], overrides: Sequence[str]) -> LoadedGenerator:
    smp_config = read_smp_config(directory)
    if config is not None:
        cfg, config_source = load_config(config, overrides), str(config)
    else:
        cfg = load_config(None, [*config_overrides(smp_config), *overrides])
        config_source = f"{directory / CONFIG_FILE} over the default config"
    generator = build_generator_for_weights(cfg.model.generator, cfg.data.num_classes)
    check_smp_config(smp_config, generator, directory, config_source)
    weights = directory / WEIGHTS_FILE
    return LoadedGenerator(
        model=_load_into(generator, read_checkpoint(weights), weights),
        cfg=cfg,
        checkpoint=directory,
        sha256=file_sha256(weights),
        kind="smp directory",
        step=None,
        config_source=config_source,
    )


def _load_into(generator: nn.Module, weights: Mapping[str, torch.Tensor], path: Path) -> nn.Module:
    try:
        load_weights(weights, generator, role="generator", name=str(path))
    except CheckpointMismatchError as err:
        raise CheckpointMismatchError(f"checkpoint {path}: {err}") from None
    return generator.float().eval()
