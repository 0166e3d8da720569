"""What a segadv checkpoint holds, and the periodic saving policy of a run."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn

from segadv import __version__
from segadv.checkpoint.io import save_checkpoint
from segadv.engine.amp_optimizer import AmpOptimizer
from segadv.errors import UserError
from segadv.parallel.placement import unwrap

log = logging.getLogger(__name__)

FORMAT = "segadv"
FORMAT_VERSION = 1


def training_state(
    step: int,
    generator: nn.Module,
    discriminator: nn.Module,
    opt_g: AmpOptimizer,
    opt_d: AmpOptimizer,
    config: dict[str, Any],
) -> dict[str, Any]:
    """Everything needed to resume; network weights are unwrapped (never a ``module.`` prefix)."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "segadv_version": __version__,
        "step": step,
        "generator": unwrap(generator).state_dict(),
        "discriminator": unwrap(discriminator).state_dict(),
        "optim_generator": opt_g.state_dict(),
        "optim_discriminator": opt_d.state_dict(),
        "config": config,
    }


def is_segadv_checkpoint(obj: dict[str, Any]) -> bool:
    return obj.get("format") == FORMAT


def restore_training_state(
    ckpt: dict[str, Any],
    generator: nn.Module,
    discriminator: nn.Module,
    opt_g: AmpOptimizer,
    opt_d: AmpOptimizer,
) -> int:
    """Load every piece strictly; returns the step the checkpoint was taken at."""
    if not is_segadv_checkpoint(ckpt):
        raise UserError("not a segadv training checkpoint (no 'format': 'segadv' entry)")
    unwrap(generator).load_state_dict(ckpt["generator"])
    unwrap(discriminator).load_state_dict(ckpt["discriminator"])
    opt_g.load_state_dict(ckpt["optim_generator"])
    opt_d.load_state_dict(ckpt["optim_discriminator"])
    return int(ckpt["step"])


class Checkpointer:
    """Writes ``checkpoints/step_<N>.pt`` every ``every`` steps and keeps ``last.pt`` current."""

    def __init__(self, run_dir: Path, every: int) -> None:
        self.directory = run_dir / "checkpoints"
        self.every = every

    @property
    def last_path(self) -> Path:
        return self.directory / "last.pt"

    def due(self, step: int, final: bool) -> bool:
        return final or step % self.every == 0

    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        paths = [self.last_path]
        if step % self.every == 0:
            paths.insert(0, self.directory / f"step_{step}.pt")
        save_checkpoint(state, *paths)
        log.info("checkpoint saved at step %d: %s", step, ", ".join(p.name for p in paths))
        return paths[0]
