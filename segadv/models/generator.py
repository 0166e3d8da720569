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
    if cfg.encoder_depth < 5:
        dropped = drop_unused_stages(model, in_channels)
        log.info("model.generator.encoder_depth=%d: dropped the unused stages %s",
                 cfg.encoder_depth, ", ".join(dropped))
    return model


def drop_unused_stages(model: nn.Module, in_channels: int) -> list[str]:
    """Replace the encoder stages a shallow ``encoder_depth`` never uses with ``nn.Identity``.

    smp builds every stage of the encoder whatever its depth, and leaves the deeper ones unused
    (never run, or run with the result thrown away). Parameters that never get a gradient make DDP
    (``find_unused_parameters=False``) fail at its second step, take weight decay, and bloat the
    checkpoints. Which stages are unused is found by one probe backward, so this holds for every
    encoder; it runs after the encoder weights are loaded, so a full-depth weight file still fits.
    Returns the names of the modules dropped.
    """
    was_training = model.training
    model.eval()  # no BatchNorm statistics move during the probe
    probe = torch.zeros(1, in_channels, 64, 64)
    model(probe).sum().backward()
    model.train(was_training)
    unused = {name for name, p in model.named_parameters() if p.grad is None}
    model.zero_grad(set_to_none=True)
    dropped = []
    for name, module in list(model.named_modules()):
        params = [f"{name}.{n}" for n, _ in module.named_parameters()]
        if name and params and all(p in unused for p in params) and not any(
            name.startswith(f"{d}.") for d in dropped
        ):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, nn.Identity())
            dropped.append(name)
    return dropped


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
