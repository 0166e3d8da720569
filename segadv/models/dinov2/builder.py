"""The DINOv2 row's entries in the arch table (segadv/models/registry.py): G from its config section,
a local weight file's tensors into its encoder, and its encoder's numbered layers
(segadv/models/vit/builder.py's)."""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from segadv.models.dinov2.dpt import DinoV2DPT
from segadv.models.dinov2.weights import load_encoder_weights
from segadv.models.vit.builder import check_local_weights, encoder_layers


def build_dinov2(cfg: Any, num_classes: int, in_channels: int = 3) -> DinoV2DPT:
    """G for a ``model.generator`` section with ``arch: dinov2`` (segadv/models/dinov2/config.py)."""
    check_local_weights(cfg, "dinov2", "timm's or the official DINOv2 layout")
    return DinoV2DPT(cfg.encoder, num_classes, in_channels=in_channels, depth=cfg.depth, layers=cfg.layers,
                     features=cfg.head_features, out_channels=cfg.head_out_channels, attention=cfg.attention,
                     drop_path_rate=cfg.drop_path_rate, img_size=cfg.img_size, input_name="G's input")


def load_weights(model: nn.Module, tensors: Mapping[str, Any], name: str) -> None:
    """A local file's tensors (read by segadv/checkpoint's reader) into the encoder, strictly, in
    timm's or the official DINOv2 layout."""
    load_encoder_weights(model, tensors, name=name)


__all__ = ["build_dinov2", "encoder_layers", "load_weights"]
