"""The generator G: a DeepLab network from segmentation-models-pytorch.

Pure ``nn.Module`` construction: no device, wrapper or AMP code lives here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import segmentation_models_pytorch as smp
import torch
from torch import nn

from segadv.config.schema import GeneratorConfig
from segadv.errors import UserError

log = logging.getLogger(__name__)

GENERATORS: dict[str, type[nn.Module]] = {
    "deeplabv3": smp.DeepLabV3,
    "deeplabv3plus": smp.DeepLabV3Plus,
}


def generator_class(arch: str) -> type[nn.Module]:
    try:
        return GENERATORS[arch]
    except KeyError:
        raise KeyError(f"unknown generator arch {arch!r}; valid: {sorted(GENERATORS)}") from None


def build_generator(cfg: GeneratorConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
    """Build G; ``cfg.encoder_weights`` may name smp weights ("imagenet") or a local file."""
    local_weights = _local_weights_path(cfg.encoder_weights)
    smp_weights = None if local_weights is not None else cfg.encoder_weights
    try:
        model = generator_class(cfg.arch)(
            encoder_name=cfg.encoder,
            encoder_depth=cfg.encoder_depth,
            encoder_weights=smp_weights,
            encoder_output_stride=cfg.output_stride,
            decoder_atrous_rates=tuple(cfg.decoder_atrous_rates),
            in_channels=in_channels,
            classes=num_classes,
        )
    except KeyError as err:
        raise UserError(f"model.generator.encoder: {err.args[0] if err.args else err}") from None
    except (OSError, RuntimeError, ValueError) as err:
        if smp_weights is None:
            raise
        raise UserError(
            f"model.generator.encoder_weights: could not get {smp_weights!r} weights for encoder "
            f"{cfg.encoder!r} ({type(err).__name__}: {err}). Nothing can be downloaded here: "
            "give a local file path instead."
        ) from None
    if local_weights is not None:
        _load_encoder_weights(model.encoder, local_weights)
    return model


def build_generator_for_weights(cfg: GeneratorConfig, num_classes: int) -> nn.Module:
    """G for loading a checkpoint into: the checkpoint brings every weight, so no pretrained
    encoder weights are fetched or read first."""
    return build_generator(cfg.model_copy(update={"encoder_weights": None}), num_classes)


def _local_weights_path(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path
    if path.suffix in {".pt", ".pth", ".bin", ".safetensors"} or "/" in value:
        raise UserError(f"model.generator.encoder_weights: file not found: {value}")
    return None  # a named smp weight set such as "imagenet"


def _load_encoder_weights(encoder: nn.Module, path: Path) -> None:
    # Local import: the checkpoint package depends on models, not the other way round.
    from segadv.checkpoint.loader import load_weights

    try:
        load_weights(path, encoder, role="encoder")
    except UserError as err:
        raise UserError(f"model.generator.encoder_weights: {err}") from None
