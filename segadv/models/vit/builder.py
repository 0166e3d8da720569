"""What a ViT arch's row (segadv/models/registry.py) takes from every ViT arch alike: the refusal of
``encoder_weights`` that names no local file, and the encoder's numbered layers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from segadv.errors import UserError


def check_local_weights(cfg: Any, arch: str, layouts: str) -> None:
    """A ViT arch's weights come from a local file only (loaded after the build by its row's
    weight loader), never fetched: ``encoder_weights`` that is no file is a UserError naming the
    ``layouts`` the arch reads."""
    weights = cfg.encoder_weights
    if weights is not None and not Path(weights).expanduser().is_file():
        raise UserError(f"model.generator.encoder_weights={weights}: arch {arch} reads a local file ({layouts}); "
                        "nothing is downloaded")


def encoder_layers(model: nn.Module) -> tuple[dict[str, int], int]:
    """Each encoder parameter's layer for layer-wise lr decay, as BEiT and DINOv2 number them: 0 the
    embedding (patch embedding, class / register tokens, position embedding), block i at i + 1, the
    final norm (read by the head at every level) at L = depth + 1. Names as ``model.encoder``'s."""
    depth = len(model.encoder.blocks)
    layers = {}
    for name, _ in model.encoder.named_parameters():
        if name.startswith("blocks."):
            layers[name] = int(name.split(".")[1]) + 1
        elif name.startswith(("norm.", "fc_norm.")):
            layers[name] = depth + 1
        else:
            layers[name] = 0
    return layers, depth + 1
