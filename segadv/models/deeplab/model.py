"""The DeepLab rows' networks and builders: a DeepLab G on an encoder of segmentation-models-pytorch
(smp's DeepLabV3 / DeepLabV3+, UniMatch's DeepLabV3+ (unimatch.py), or DeepLab-v2 as the adversarial
references train it, deeplabv2.py),
with the aux head of multi-level adaptation or the feature-scaling keywords of UniMatch.

Pure ``nn.Module`` construction: no device, wrapper or AMP code lives here.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import segmentation_models_pytorch as smp
import torch
import torch.nn.functional as F
from torch import nn

from segadv.errors import UserError
from segadv.models.deeplab.base import DeepLabGenerator, drop_unused_stages
from segadv.models.deeplab.config import DeepLabConfig
from segadv.models.deeplab.deeplabv2 import ASPP_V2_RATES, DeepLabV2
from segadv.models.deeplab.unimatch import UniMatchDeepLabV3Plus, UniMatchDeepLabV3PlusTrained
from segadv.models.deeplab.weights import check_weights_reachable
from segadv.models.features import FeatureScalingMixin
from segadv.models.generator import local_encoder_weights

log = logging.getLogger(__name__)


class AuxOutputMixin:
    """A second, auxiliary output from the encoder's second-to-last stage (AdaptSegNet's
    multi-level G): ``forward(x)`` is the unchanged smp forward (main logits only, so evaluation
    and export never see the aux head); ``forward(x, return_aux=True)`` returns ``(main, aux)``,
    both at the input's size, from one encoder pass. Through ``forward``, so DDP and DataParallel
    wrappers see it. The head is ``aux_head`` (the model's ``aux_classifier``); its keys are the
    only ones added to the model's."""

    aux_head: nn.Module

    def forward(self, x: torch.Tensor, return_aux: bool = False, **kwargs: Any):  # type: ignore[override]
        if not return_aux:
            # kwargs: the inference class's own (DeepLab-v2's ``output_size``), passed through.
            return super().forward(x, **kwargs)  # type: ignore[misc]
        if not (torch.jit.is_scripting() or torch.jit.is_tracing()):
            self.check_input_shape(x)  # type: ignore[attr-defined]
        features = self.encoder(x)  # type: ignore[attr-defined]
        return self.main_logits(features, x), self.upsample_aux(self.aux_head(features[-2]), x)

    def main_logits(self, features: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """smp's models: their segmentation head upsamples to the input itself."""
        return self.segmentation_head(self.decoder(features))  # type: ignore[attr-defined]

    def upsample_aux(self, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The aux logits at ``x``'s size. smp's archs: ``align_corners=False``, which their runs and
        checkpoints have been trained with; DeepLab-v2 upsamples as its references do."""
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)

    def aux_classifier(self, num_classes: int) -> nn.Module:
        """A small classifier on the aux stage: 3x3 conv, BatchNorm, ReLU, 1x1 conv to the classes."""
        in_channels = self.encoder.out_channels[-2]  # type: ignore[attr-defined]
        width = min(AUX_HEAD_WIDTH, in_channels)
        return nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, num_classes, kernel_size=1),
        )


class DeepLabV3(DeepLabGenerator, smp.DeepLabV3):
    """smp's DeepLabV3 as evaluation and export build it (its own name: save_pretrained writes it)."""


class DeepLabV3Plus(DeepLabGenerator, smp.DeepLabV3Plus):
    """smp's DeepLabV3Plus as evaluation and export build it."""


class DeepLabV3Aux(AuxOutputMixin, DeepLabV3):
    pass


class DeepLabV3PlusAux(AuxOutputMixin, DeepLabV3Plus):
    pass


# The trained G without the aux head: the inference class plus the feature-scaling keywords
# (segadv/models/features.py). Evaluation and export build the plain class, which TorchScript
# can script (the mixin's ``super().forward`` it cannot).
class DeepLabV3Trained(FeatureScalingMixin, DeepLabV3):
    pass


class DeepLabV3PlusTrained(FeatureScalingMixin, DeepLabV3Plus):
    pass


class DeepLabV2Trained(FeatureScalingMixin, DeepLabV2):
    def decode_features(self, features: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return self.main_logits(features, x)


class DeepLabV2Aux(AuxOutputMixin, DeepLabV2):
    """AdaptSegNet's ``DeeplabMulti``: the aux classifier is DeepLab-v2's own, on layer3, and both
    outputs are upsampled as DeepLab-v2's (``align_corners=True``, the references' ``interp`` on
    both: AdaptSegNet's train_gta2cityscapes_multi.py, ADVENT's train_UDA.py)."""

    aux_classifier = DeepLabV2.aux_classifier
    main_logits = DeepLabV2.main_logits
    upsample_aux = DeepLabV2.upsample_logits


def aspp_settings(cfg: DeepLabConfig) -> dict[str, Any]:
    return {"decoder_atrous_rates": tuple(cfg.decoder_atrous_rates), "decoder_channels": cfg.decoder_channels}


def aspp_v2_settings(cfg: DeepLabConfig) -> dict[str, Any]:
    rates = cfg.aspp_v2_rates
    return {"classifier_rates": ASPP_V2_RATES[rates] if isinstance(rates, str) else tuple(rates),
            "encoder_layout": cfg.layout}


AUX_HEAD_WIDTH = 128


@dataclass(frozen=True)
class DeepLabBuilder:
    """A DeepLab row's builder: the inference G's class (what evaluation, export and segadv-ckpt
    build), the same with the aux output (``model.generator.aux_head``), and the class's head
    settings from the config (its other arguments are the encoder's, shared)."""

    model: type[nn.Module]
    with_aux: Optional[type[nn.Module]]  # None: no aux output (its section refuses model.generator.aux_head)
    head_settings: Callable[[DeepLabConfig], dict[str, Any]]
    trained: type[nn.Module]  # ``model`` with the feature-scaling keywords: the trained G without an aux head
    inference: bool = False  # build ``model`` (evaluation, export), not a trained class

    def __call__(self, cfg: DeepLabConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
        return build_deeplab(self, cfg, num_classes, in_channels, inference=self.inference)


def check_encoder(cfg: DeepLabConfig) -> None:
    """What the build would refuse that the config alone says, before anything is built (a
    start's checks, segadv/training/checks.py ``check_role``): an encoder smp does not have
    (``tu-<name>``: timm's, which smp finds as it builds)."""
    names = smp.encoders.get_encoder_names()
    if cfg.encoder.startswith("tu-") or cfg.encoder in names:
        return
    close = difflib.get_close_matches(cfg.encoder, names, n=3)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise UserError(f"model.generator.encoder: {cfg.encoder!r} is not one of segmentation-models-pytorch's "
                    f"{len(names)} encoders{hint} (they are listed by python -c \"import segmentation_models_pytorch "
                    "as smp; print(smp.encoders.get_encoder_names())\"; timm's encoders as tu-<name>)")


DEEPLABV3 = DeepLabBuilder(DeepLabV3, DeepLabV3Aux, aspp_settings, DeepLabV3Trained)
DEEPLABV3PLUS = DeepLabBuilder(DeepLabV3Plus, DeepLabV3PlusAux, aspp_settings, DeepLabV3PlusTrained)
DEEPLABV2 = DeepLabBuilder(DeepLabV2, DeepLabV2Aux, aspp_v2_settings, DeepLabV2Trained)
DEEPLABV3PLUS_UNIMATCH = DeepLabBuilder(UniMatchDeepLabV3Plus, None, aspp_settings, UniMatchDeepLabV3PlusTrained)
# The rows' inference builders (GeneratorArch.inference_builder): the plain classes.
DEEPLABV3_INFERENCE = replace(DEEPLABV3, inference=True)
DEEPLABV3PLUS_INFERENCE = replace(DEEPLABV3PLUS, inference=True)
DEEPLABV2_INFERENCE = replace(DEEPLABV2, inference=True)
DEEPLABV3PLUS_UNIMATCH_INFERENCE = replace(DEEPLABV3PLUS_UNIMATCH, inference=True)


def build_deeplab(arch: DeepLabBuilder, cfg: DeepLabConfig, num_classes: int, in_channels: int = 3, *,
                  inference: bool = False) -> nn.Module:
    """A DeepLab G; ``cfg.encoder_weights`` may name smp weights ("imagenet"), fetched here, or a
    local file, which this leaves to the caller: ``segadv.checkpoint.load_encoder_weights`` (called
    where the run is assembled, segadv/training/build.py) loads it into the built G. ``inference``:
    the plain class (evaluation, export), else the trained one (its aux head, or the feature-scaling
    keywords)."""
    smp_weights = None if local_encoder_weights(cfg) is not None else cfg.encoder_weights
    if smp_weights is not None:
        check_weights_reachable(cfg.encoder, smp_weights)  # an offline machine: said before any retry
    if cfg.aux_head and arch.with_aux is None:
        raise UserError(f"model.generator.aux_head: {cfg.arch} has no aux output")
    cls = arch.with_aux if cfg.aux_head else (arch.model if inference else arch.trained)
    try:
        model = cls(
            encoder_name=cfg.encoder,
            encoder_depth=cfg.encoder_depth,
            encoder_weights=smp_weights,
            encoder_output_stride=cfg.output_stride,
            in_channels=in_channels,
            classes=num_classes,
            **arch.head_settings(cfg),
        )
    except KeyError as err:
        raise UserError(f"model.generator.encoder: {err.args[0] if err.args else err}") from None
    except (OSError, RuntimeError, ValueError) as err:
        # An encoder with fewer usable stages than the schema's 1..5 (smp's own check of it).
        if isinstance(err, ValueError) and "depth" in str(err):
            raise UserError(f"model.generator.encoder_depth: {cfg.encoder_depth} does not fit encoder "
                            f"{cfg.encoder!r} ({err})") from None
        if smp_weights is None:
            raise
        raise UserError(
            f"model.generator.encoder_weights: could not get {smp_weights!r} weights for encoder "
            f"{cfg.encoder!r} ({type(err).__name__}: {err}). Nothing can be downloaded here: "
            "give a local file path instead."
        ) from None
    if cfg.encoder_depth < 5:
        dropped = drop_unused_stages(model, in_channels)
        log.info("model.generator.encoder_depth=%d: dropped the unused stages %s",
                 cfg.encoder_depth, ", ".join(dropped))
    if cfg.aux_head:
        # After the probe above (which runs the main output only, and would drop the head).
        model.aux_head = model.aux_classifier(num_classes)
    return model
