"""The generator G, built by its arch's row (segadv/models/registry.py): the one entry point every
reader takes (training, evaluation, export, segadv-ckpt), whatever the arch.

Pure ``nn.Module`` construction: no device, wrapper or AMP code lives here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from segadv.config.schema import GeneratorConfig
from segadv.errors import UserError
from segadv.models.base import Generator
from segadv.models.norm import apply_norm, batch_norms, in_eval_mode
from segadv.models.registry import generator_arch, resolve

log = logging.getLogger(__name__)


def build_generator(cfg: GeneratorConfig, num_classes: int, in_channels: int = 3, *,
                    inference: bool = False) -> Generator:
    """Build G with its arch's builder (its row in segadv/models/registry.py), checked to be a
    :class:`~segadv.models.base.Generator`, then set how its
    BatchNorm trains (``model.generator.norm``). The built G carries its arch's name, by which
    activation checkpointing and the optimizer's groups find its row. ``inference``: G to load
    weights into and predict with: its row's ``inference_builder`` where it has one (no training-only
    forward keywords, segadv/models/features.py)."""
    row = generator_arch(cfg.arch)
    builder = row.inference_builder if inference and row.inference_builder is not None else row.builder
    model = resolve(builder)(cfg, num_classes, in_channels)
    if not isinstance(model, Generator):
        raise TypeError(f"arch {cfg.arch}: its builder made a {type(model).__name__}, not a "
                        "segadv.models.base.Generator")
    model.generator_arch = cfg.arch
    # Last: a builder's probes need every trainable parameter to take a gradient.
    count = apply_norm(model, cfg.norm)
    if cfg.norm != "train":
        log.info("model.generator.norm=%s: %d BatchNorm layers with their weight and bias fixed%s", cfg.norm, count,
                 ", in eval mode (running statistics fixed)" if cfg.norm == "frozen" else "")
    if cfg.freeze_encoder:
        frozen = freeze_encoder(model, row.backbone)
        log.info("model.generator.freeze_encoder: %s fixed (%d parameters, no gradients or optimizer state)",
                 row.backbone, frozen)
    return model


def freeze_encoder(model: nn.Module, backbone: str | None) -> int:
    """``model``'s submodule ``backbone`` (its arch row's encoder) fixed, in place: its parameters
    take no gradient (so no optimizer holds them, DDP skips them and weight decay leaves them), and
    its BatchNorm layers stay in eval mode (mmsegmentation's frozen stages), so its running
    statistics do not move either and every tensor of the encoder stays as loaded. Its other
    layers (LayerNorm, dropout, drop path) keep G's mode. Names and the state dict are unchanged.
    Returns the number of parameters fixed."""
    if backbone is None:
        raise UserError(f"model.generator.freeze_encoder: arch {model.generator_arch} names no encoder to freeze")
    encoder = model.get_submodule(backbone)
    params = list(encoder.parameters())
    for p in params:
        p.requires_grad_(False)
    for norm in batch_norms(encoder):
        in_eval_mode(norm)
    return sum(p.numel() for p in params)


def build_generator_for_weights(cfg: GeneratorConfig, num_classes: int) -> Generator:
    """G for inference, to load a checkpoint into (eval, export, predict, convert): the
    checkpoint brings every weight, so no pretrained encoder weights are fetched or read first,
    the training-only aux head is left out (the loader skips its keys), and BatchNorm is plain
    (in eval mode ``model.generator.norm`` changes nothing; the model stays the class it names)."""
    return build_generator(cfg.model_copy(update={"encoder_weights": None, "aux_head": False, "norm": "train",
                                                   "freeze_encoder": False}),
                           num_classes, inference=True)


def logits_at(model: nn.Module, network: Generator, x: torch.Tensor, output_size: Sequence[int]) -> torch.Tensor:
    """G's main logits for input ``x`` at ``output_size`` (H, W): the label's size, larger than
    ``x``'s when evaluation predicts at a resized input (``data.val_input_size``). ``model`` is G
    as evaluation calls it (maybe wrapped: DataParallel, torch.compile and AutocastForward pass
    keyword arguments on), ``network`` the bare G behind it, whose class says how
    (:attr:`~segadv.models.base.Generator.takes_output_size`). DeepLab-v2 upsamples its raw logits once, straight to ``output_size`` (align_corners=True), as AdaptSegNet's
    and ADVENT's evaluation does. smp's archs upsample inside their head (to ``x``'s size, with
    ``UpsamplingBilinear2d``: align_corners=True), so their output is resampled from there the same way."""
    output_size = tuple(int(n) for n in output_size)
    if tuple(x.shape[-2:]) == output_size:
        return model(x)  # the prediction at the image's own size: no resampling
    if network.takes_output_size:
        return model(x, output_size=output_size)
    return F.interpolate(model(x), size=output_size, mode="bilinear", align_corners=True)


def local_encoder_weights(cfg: GeneratorConfig) -> Path | None:
    """The local file ``cfg.encoder_weights`` names, or None (no weights, or a named smp set such
    as "imagenet"). UserError for a path that does not exist."""
    if cfg.encoder_weights is None:
        return None
    path = Path(cfg.encoder_weights).expanduser()
    if path.is_file():
        return path
    if path.suffix in {".pt", ".pth", ".bin", ".safetensors"} or "/" in cfg.encoder_weights:
        raise UserError(f"model.generator.encoder_weights: file not found: {cfg.encoder_weights}")
    return None  # a named smp weight set such as "imagenet"
