"""The bare generator from any checkpoint the strict loader accepts, with the config it needs.

A segadv checkpoint carries its resolved config; a raw state dict (plain, DataParallel, DDP or
``torch.compile`` prefixes, or weights under ``state_dict`` / ``model`` / ``generator`` ...)
does not, so the caller must name a config file. Weights always go through
:func:`segadv.checkpoint.loader.load_weights` (strict; a clear error on any mismatch).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from torch import nn

from segadv.checkpoint.io import read_checkpoint
from segadv.checkpoint.loader import CheckpointMismatchError, load_weights
from segadv.checkpoint.state import is_segadv_checkpoint
from segadv.config import Config, config_from_dict, load_config
from segadv.errors import UserError
from segadv.export.sidecar import file_sha256
from segadv.models import build_generator_for_weights
from segadv.parallel import unwrap

log = logging.getLogger(__name__)


@dataclass
class LoadedGenerator:
    model: nn.Module  # the bare generator, eval mode, on the CPU, float32
    cfg: Config
    checkpoint: Path
    sha256: str
    kind: str  # "segadv checkpoint" or "state dict"
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


def load_generator(
    checkpoint: str | Path,
    config: Optional[str] = None,
    overrides: Sequence[str] = (),
    *,
    trusted: bool = False,
) -> LoadedGenerator:
    path = Path(checkpoint)
    ckpt = read_checkpoint(path, trusted=trusted)
    cfg, config_source = resolve_config(ckpt, path, config, overrides)
    generator = build_generator_for_weights(cfg.model.generator, cfg.data.num_classes)
    try:
        load_weights(ckpt, generator, role="generator", name=str(path))
    except CheckpointMismatchError as err:
        raise CheckpointMismatchError(f"checkpoint {path}: {err}") from None
    generator = unwrap(generator).float().eval()
    segadv_ckpt = is_segadv_checkpoint(ckpt)
    step = ckpt.get("step") if segadv_ckpt else None
    return LoadedGenerator(
        model=generator,
        cfg=cfg,
        checkpoint=path,
        sha256=file_sha256(path),
        kind="segadv checkpoint" if segadv_ckpt else "state dict",
        step=int(step) if isinstance(step, int) else None,
        config_source=config_source,
    )
