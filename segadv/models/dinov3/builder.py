"""The DINOv3 row's entries in the arch table (segadv/models/registry.py): G from its config section,
a local weight file's tensors into its encoder, and its encoder's numbered layers
(segadv/models/vit/builder.py's)."""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from segadv.models.dinov3.model import DinoV3DPT
from segadv.models.dinov3.weights import load_encoder_weights
from segadv.models.vit.builder import check_local_weights, encoder_layers


def build_dinov3(cfg: Any, num_classes: int, in_channels: int = 3) -> DinoV3DPT:
    """G for a ``model.generator`` section with ``arch: dinov3`` (segadv/models/dinov3/config.py)."""
    check_local_weights(cfg, "dinov3", "timm's or Meta's DINOv3 layout")
    return DinoV3DPT(cfg.encoder, num_classes, in_channels=in_channels, depth=cfg.depth, layers=cfg.layers,
                     features=cfg.head_features, out_channels=cfg.head_out_channels,
                     drop_path_rate=cfg.drop_path_rate, input_name="G's input")


def load_weights(model: nn.Module, tensors: Mapping[str, Any], name: str) -> None:
    """A local file's tensors (read by segadv/checkpoint's reader) into the encoder, strictly, in
    timm's or Meta's DINOv3 layout."""
    load_encoder_weights(model, tensors, name=name)


__all__ = ["build_dinov3", "encoder_layers", "load_weights"]
