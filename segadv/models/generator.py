"""The generator G, built by its arch's row (segadv/config/archs.py), and the DeepLab rows' builder:
a DeepLab network on an encoder of segmentation-models-pytorch (smp's DeepLabV3 / DeepLabV3+, or
DeepLab-v2 as the adversarial references train it, deeplabv2.py).

Pure ``nn.Module`` construction: no device, wrapper or AMP code lives here.
"""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import segmentation_models_pytorch as smp
import torch
import torch.nn.functional as F
from torch import nn

from segadv.config.archs import ARCH_ATTRIBUTE, generator_arch, resolve
from segadv.config.deeplab import DeepLabConfig
from segadv.config.schema import GeneratorConfig
from segadv.errors import UserError
from segadv.models.deeplabv2 import ASPP_V2_RATES, DeepLabV2
from segadv.models.features import FeatureScalingMixin
from segadv.models.norm import apply_norm

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


class DroppedStage(nn.Identity):
    """What an encoder stage that a shallow ``encoder_depth`` never runs is replaced with
    (:func:`drop_unused_stages`). Its own type, so loaders can tell a full-depth weight file's
    keys for it from keys that do not fit."""


class DeepLabV3Aux(AuxOutputMixin, smp.DeepLabV3):
    pass


class DeepLabV3PlusAux(AuxOutputMixin, smp.DeepLabV3Plus):
    pass


# The trained G without the aux head: the inference class plus the feature-scaling keywords
# (segadv/models/features.py). Evaluation and export build the plain class, which TorchScript
# can script (the mixin's ``super().forward`` it cannot).
class DeepLabV3Trained(FeatureScalingMixin, smp.DeepLabV3):
    pass


class DeepLabV3PlusTrained(FeatureScalingMixin, smp.DeepLabV3Plus):
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


def logits_at(model: nn.Module, network: nn.Module, x: torch.Tensor, output_size: Sequence[int]) -> torch.Tensor:
    """G's main logits for input ``x`` at ``output_size`` (H, W): the label's size, larger than
    ``x``'s when evaluation predicts at a resized input (``data.val_input_size``). ``model`` is G
    as evaluation calls it (maybe wrapped: DataParallel, torch.compile and AutocastForward pass
    keyword arguments on), ``network`` the bare G behind it, whose class says how. DeepLab-v2
    upsamples its raw logits once, straight to ``output_size`` (align_corners=True), as AdaptSegNet's
    and ADVENT's evaluation does. smp's archs upsample inside their head (to ``x``'s size, with
    ``UpsamplingBilinear2d``: align_corners=True), so their output is resampled from there the same way."""
    output_size = tuple(int(n) for n in output_size)
    if tuple(x.shape[-2:]) == output_size:
        return model(x)  # the prediction at the image's own size: no resampling
    if isinstance(network, DeepLabV2):
        return model(x, output_size=output_size)
    return F.interpolate(model(x), size=output_size, mode="bilinear", align_corners=True)


def aspp_settings(cfg: DeepLabConfig) -> dict[str, Any]:
    return {"decoder_atrous_rates": tuple(cfg.decoder_atrous_rates), "decoder_channels": cfg.decoder_channels}


def aspp_v2_settings(cfg: DeepLabConfig) -> dict[str, Any]:
    rates = cfg.aspp_v2_rates
    return {"classifier_rates": ASPP_V2_RATES[rates] if isinstance(rates, str) else tuple(rates),
            "encoder_layout": cfg.layout}


AUX_HEAD_PREFIX = "aux_head."
AUX_HEAD_WIDTH = 128


def build_generator(cfg: GeneratorConfig, num_classes: int, in_channels: int = 3, *,
                    inference: bool = False) -> nn.Module:
    """Build G with its arch's builder (its row in segadv/config/archs.py), then set how its
    BatchNorm trains (``model.generator.norm``). The built G carries its arch's name, by which
    activation checkpointing and the optimizer's groups find its row. ``inference``: G to load
    weights into and predict with: its row's ``inference_builder`` where it has one (no training-only
    forward keywords, segadv/models/features.py)."""
    row = generator_arch(cfg.arch)
    builder = row.inference_builder if inference and row.inference_builder is not None else row.builder
    model = resolve(builder)(cfg, num_classes, in_channels)
    setattr(model, ARCH_ATTRIBUTE, cfg.arch)
    # Last: a builder's probes need every trainable parameter to take a gradient.
    count = apply_norm(model, cfg.norm)
    if cfg.norm != "train":
        log.info("model.generator.norm=%s: %d BatchNorm layers with their weight and bias fixed%s", cfg.norm, count,
                 ", in eval mode (running statistics fixed)" if cfg.norm == "frozen" else "")
    return model


@dataclass(frozen=True)
class DeepLabBuilder:
    """A DeepLab row's builder: the inference G's class (what evaluation, export and segadv-ckpt
    build), the same with the aux output (``model.generator.aux_head``), and the class's head
    settings from the config (its other arguments are the encoder's, shared)."""

    model: type[nn.Module]
    with_aux: type[nn.Module]
    head_settings: Callable[[DeepLabConfig], dict[str, Any]]
    trained: type[nn.Module]  # ``model`` with the feature-scaling keywords: the trained G without an aux head
    inference: bool = False  # build ``model`` (evaluation, export), not a trained class

    def __call__(self, cfg: DeepLabConfig, num_classes: int, in_channels: int = 3) -> nn.Module:
        return build_deeplab(self, cfg, num_classes, in_channels, inference=self.inference)

    @staticmethod
    def check(cfg: DeepLabConfig) -> None:
        """What the build would refuse that the config alone says, before anything is built (a
        start's checks, segadv/training/build.py ``check_role``): an encoder smp does not have
        (``tu-<name>``: timm's, which smp finds as it builds)."""
        names = smp.encoders.get_encoder_names()
        if cfg.encoder.startswith("tu-") or cfg.encoder in names:
            return
        close = difflib.get_close_matches(cfg.encoder, names, n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise UserError(f"model.generator.encoder: {cfg.encoder!r} is not one of segmentation-models-pytorch's "
                        f"{len(names)} encoders{hint} (they are listed by python -c \"import segmentation_models_pytorch "
                        "as smp; print(smp.encoders.get_encoder_names())\"; timm's encoders as tu-<name>)")


DEEPLABV3 = DeepLabBuilder(smp.DeepLabV3, DeepLabV3Aux, aspp_settings, DeepLabV3Trained)
DEEPLABV3PLUS = DeepLabBuilder(smp.DeepLabV3Plus, DeepLabV3PlusAux, aspp_settings, DeepLabV3PlusTrained)
DEEPLABV2 = DeepLabBuilder(DeepLabV2, DeepLabV2Aux, aspp_v2_settings, DeepLabV2Trained)
# The rows' inference builders (GeneratorArch.inference_builder): the plain classes.
DEEPLABV3_INFERENCE = replace(DEEPLABV3, inference=True)
DEEPLABV3PLUS_INFERENCE = replace(DEEPLABV3PLUS, inference=True)
DEEPLABV2_INFERENCE = replace(DEEPLABV2, inference=True)


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


def encoder_stages_and_decoder(generator: nn.Module) -> list[str]:
    """The DeepLab rows' blocks for activation checkpointing: the encoder's stages that hold
    weights (a ResNet's ``layer1``-``layer4``; a MobileNet's or other ``features`` encoder's blocks)
    and the decoder where it has weights (DeepLab-v2's classifier, a few convolutions to the
    classes, keeps no more than its input)."""
    encoder = generator.encoder
    names = [name for name, _ in encoder.named_children() if re.fullmatch(r"layer\d", name)]
    if not names and isinstance(getattr(encoder, "features", None), nn.Sequential):
        names = [f"features.{name}" for name, _ in encoder.features.named_children()]
    if not names:
        raise UserError(f"model.generator.activation_checkpointing: segadv does not know the stages of the "
                        f"{type(encoder).__name__} encoder (it checkpoints ResNet layers and `features` blocks)")

    def has_weights(name: str) -> bool:  # not a dropped stage, nor DeepLab-v2's decoder (its last stage as it is)
        return any(True for _ in generator.get_submodule(name).parameters())

    return [name for name in [f"encoder.{name}" for name in names] + ["decoder"] if has_weights(name)]


def drop_unused_stages(model: nn.Module, in_channels: int) -> list[str]:
    """Replace the encoder stages a shallow ``encoder_depth`` never uses with :class:`DroppedStage`.

    smp builds every stage of the encoder whatever its depth, and leaves the deeper ones unused
    (never run, or run with the result thrown away). Parameters that never get a gradient make DDP
    (``find_unused_parameters=False``) fail at its second step, take weight decay, and bloat the
    checkpoints. Which stages are unused is found by one probe backward, so this holds for every
    encoder. The strict loader leaves a full-depth weight file's keys for the dropped stages out, so
    such a file still fits. Returns the names of the modules dropped.
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
            setattr(model.get_submodule(parent_name), child, DroppedStage())
            dropped.append(name)
    return dropped


def build_generator_for_weights(cfg: GeneratorConfig, num_classes: int) -> nn.Module:
    """G for inference, to load a checkpoint into (eval, export, predict, convert): the
    checkpoint brings every weight, so no pretrained encoder weights are fetched or read first,
    the training-only aux head is left out (the loader skips its keys), and BatchNorm is plain
    (in eval mode ``model.generator.norm`` changes nothing; the model stays the class it names)."""
    return build_generator(cfg.model_copy(update={"encoder_weights": None, "aux_head": False, "norm": "train"}),
                           num_classes, inference=True)


# How long the one probe of the weights' host may take before the machine counts as offline.
PROBE_TIMEOUT_S = 3.0
OFFLINE_HINT = ("on an offline machine give model.generator.encoder_weights a local file (smp's encoder, or "
                "torchvision's or timm's ImageNet ResNet state dict: its fc head is left out), copy the Hugging "
                "Face cache over from a machine that has it, or set model.generator.encoder_weights=null to "
                "train from scratch")


def check_weights_reachable(encoder: str, weights: str) -> None:
    """Before smp fetches named weights ("imagenet") from the Hugging Face Hub, whose client
    retries for tens of seconds on a machine without a network: pass when they are in the local
    cache; else a UserError at once when the Hub is set offline (``HF_HUB_OFFLINE``) or its host
    does not answer one connection within :data:`PROBE_TIMEOUT_S`. Behind a proxy the probe is
    left to the download itself."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, hf_hub_download
    from segmentation_models_pytorch.encoders import encoders

    settings = encoders.get(encoder, {}).get("pretrained_settings", {}).get(weights)
    if settings is None or "repo_id" not in settings:
        return  # smp's own error names the encoders and weights it knows (a KeyError, made a UserError by the caller)
    repo, revision = settings["repo_id"], settings.get("revision")
    try:
        for filename in ("config.json", "model.safetensors"):
            hf_hub_download(repo, filename=filename, revision=revision, local_files_only=True)
        return  # downloaded before: no network needed
    except Exception:  # not in the cache (LocalEntryNotFoundError, or a cache it cannot read)
        pass
    what = f"model.generator.encoder_weights: {weights!r} weights for encoder {encoder!r} are not in the " \
           f"Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise UserError(f"{what} and HF_HUB_OFFLINE is set, so nothing is downloaded; {OFFLINE_HINT}")
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as err:
        raise UserError(f"{what} and {host} cannot be reached ({err.strerror or err}): this machine looks "
                        f"offline; {OFFLINE_HINT}") from None


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
