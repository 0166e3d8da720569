"""The DINOv2 row's entries in the arch table (segadv/models/registry.py): G from its config section,
a local weight file's tensors into its encoder, and its encoder's numbered layers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from torch import nn

from segadv.errors import UserError
from segadv.models.dinov2.dpt import DinoV2DPT
from segadv.models.dinov2.weights import load_encoder_weights


def build_dinov2(cfg: Any, num_classes: int, in_channels: int = 3) -> DinoV2DPT:
    """G for a ``model.generator`` section with ``arch: dinov2`` (segadv/models/dinov2/config.py). Its
    weights come from a local file only (loaded after the build: ``load_weights``), never fetched."""
    weights = cfg.encoder_weights
    if weights is not None and not Path(weights).expanduser().is_file():
        raise UserError(f"model.generator.encoder_weights={weights}: arch dinov2 reads a local file (timm's or the "
                        "official DINOv2 layout); nothing is downloaded")
    return DinoV2DPT(cfg.encoder, num_classes, in_channels=in_channels, depth=cfg.depth, layers=cfg.layers,
                     features=cfg.head_features, out_channels=cfg.head_out_channels, attention=cfg.attention,
                     drop_path_rate=cfg.drop_path_rate, img_size=cfg.img_size, input_name="G's input")


def load_weights(model: nn.Module, tensors: Mapping[str, Any], name: str) -> None:
    """A local file's tensors (read by segadv/checkpoint's reader) into the encoder, strictly, in
    timm's or the official DINOv2 layout."""
    load_encoder_weights(model, tensors, name=name)


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
