"""The precision a checkpoint's G runs in for segadv-eval and segadv-predict: the autocast its
run's evaluations ran it under, so a checkpoint scores and predicts what its run measured."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Precision", "evaluation_precision"]


@dataclass(frozen=True)
class Precision:
    """What G's forward computes in, scored or predicting: ``name`` (float32, bfloat16 or float16),
    the config key it comes from, why (that key's value, and how ``auto`` resolved) and the
    autocast that runs it."""

    name: str
    key: str  # the amp key it comes from: amp.generator.enabled (amp.teacher.enabled)
    why: str
    autocast: Callable[[], AbstractContextManager]


def evaluation_precision(cfg: Any, network: str, device: Any) -> Precision:
    """The autocast training evaluates ``network`` (student or teacher) under: its role's
    ``amp.<role>`` in ``cfg`` (the teacher's falls back to G's), ``enabled: auto`` resolved on
    ``device`` by training's own rule (segadv/engine/amp_optimizer.py ``resolve_auto``), so a
    checkpoint scores as its run's evaluations scored it."""
    import torch

    from segadv.checkpoint.inference import NETWORKS
    from segadv.config.roles import setting
    from segadv.engine.amp_optimizer import resolve_auto

    role = NETWORKS[network]
    amp = setting(cfg.amp, role)
    key = f"amp.{role if getattr(cfg.amp, role, None) is not None else 'generator'}.enabled"
    resolved, why = resolve_auto(amp, (device,))
    name = resolved.dtype if resolved.enabled else "float32"
    if amp.is_auto:
        why = f"{key}: auto -> {'bf16' if resolved.enabled else 'off'} on {device.type} ({why})"
    else:
        why = f"{key}: {str(amp.enabled).lower()}" + (f", dtype {amp.dtype}" if amp.enabled else "")
    dtype = getattr(torch, resolved.dtype)
    enabled = bool(resolved.enabled)
    return Precision(name, key, why, lambda: torch.autocast(device.type, dtype=dtype, enabled=enabled))
