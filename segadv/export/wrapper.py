"""The module that is exported: the bare generator, optionally with normalisation and argmax.

``InferenceModel`` is scriptable and traceable. Its inputs, by ``preprocess``:

- ``None``: float NCHW, already normalised as the generator saw it in training
  (``data.normalization``: ``(pixel / 255 - mean) / std``, on BGR channels for a BGR convention);
- ``"uint8"``: uint8 NCHW RGB pixels 0..255, normalised in the graph (a BGR convention's channels
  reversed there too);
- ``"unit"``: float NCHW RGB pixels 0..1, normalised in the graph.

Outputs: logits ``N x C x H x W`` or, with ``argmax``, int64 class ids ``N x H x W``.
With ``half`` the generator runs in float16; in-graph normalisation still happens in float32 and
is cast afterwards, so uint8 inputs lose nothing to float16's coarse steps near 255.
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Sequence

import torch
from torch import nn

from segadv import __version__
from segadv.config.normalization import Normalization
from segadv.export.sidecar import FORMAT, FORMAT_VERSION, FORMAT_VERSION_RGB
from segadv.parallel import unwrap

PREPROCESS_KINDS = ("uint8", "unit")
INPUT_NAME = "input"


class InferenceModel(nn.Module):
    def __init__(
        self,
        generator: nn.Module,
        normalization: Normalization,
        preprocess: Optional[str] = None,
        argmax: bool = False,
        half: bool = False,
    ) -> None:
        super().__init__()
        if preprocess is not None and preprocess not in PREPROCESS_KINDS:
            raise ValueError(f"preprocess must be one of {PREPROCESS_KINDS} or None, got {preprocess!r}")
        generator = unwrap(generator)
        self.generator = copy.deepcopy(generator).half() if half else generator
        scale = 255.0 if preprocess == "uint8" else 1.0
        self.register_buffer("offset", torch.tensor([m * scale for m in normalization.mean]).view(1, -1, 1, 1))
        self.register_buffer("divisor", torch.tensor([s * scale for s in normalization.std]).view(1, -1, 1, 1))
        # The host gives RGB; a BGR convention's channels are reversed in the graph (a Gather in ONNX).
        self.register_buffer("channel_order", torch.tensor([2, 1, 0]))
        self.reverse_channels = normalization.bgr
        self.preprocess = preprocess is not None
        self.argmax = argmax
        self.cast_half = half

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.preprocess:
            if self.reverse_channels:
                x = torch.index_select(x, 1, self.channel_order)
            x = (x.float() - self.offset) / self.divisor
            if self.cast_half:
                x = x.half()
        logits = self.generator(x)
        if self.argmax:
            return logits.argmax(dim=1)
        return logits


def size_divisor(generator: nn.Module) -> int:
    """Height and width must be multiples of this (segadv/models/base.py ``input_divisor``: a ViT's
    patch, smp's encoder stride, 1 for DeepLab-v2)."""
    return unwrap(generator).input_divisor()


def input_kind(preprocess: Optional[str]) -> str:
    return "normalized" if preprocess is None else preprocess


def input_dtype(preprocess: Optional[str], half: bool) -> str:
    if preprocess == "uint8":
        return "uint8"
    if preprocess == "unit":
        return "float32"
    return "float16" if half else "float32"


def output_name(argmax: bool) -> str:
    return "labels" if argmax else "logits"


def export_metadata(
    *,
    model_format: str,
    model_file: str,
    loaded: Any,  # segadv.checkpoint.inference.LoadedGenerator
    classes: Sequence[str],
    palette: Sequence[Sequence[int]],
    preprocess: Optional[str],
    argmax: bool,
    half: bool,
    dynamic: bool,
    input_size: Sequence[int],
    divisor: int,
    extra: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """Everything an inference host needs besides the model file (the sidecar's content)."""
    cfg = loaded.cfg
    gen = cfg.model.generator
    norm = cfg.data.input_normalization
    h, w = input_size
    meta: dict[str, Any] = {
        "format": FORMAT,
        # A BGR model is version 2: an older segadv, which would feed it RGB, refuses it.
        "format_version": FORMAT_VERSION if norm.bgr else FORMAT_VERSION_RGB,
        "segadv_version": __version__,
        "model_format": model_format,
        "model_file": model_file,
        "source": loaded.source_info(),
        "generator": gen.summary(),
        "num_classes": cfg.data.num_classes,
        "classes": list(classes),
        "palette": [[int(c) for c in colour] for colour in palette],
        "normalization": {
            "name": norm.name,
            "channels": norm.channels,  # the order mean, std and a normalized input are in
            "mean": list(norm.mean),
            "std": list(norm.std),
            "pixel_scale": 255.0,
            "formula": norm.formula,
            "in_graph": preprocess is not None,
        },
        "input": {
            "name": INPUT_NAME,
            "layout": "NCHW",
            "channels": norm.channels if preprocess is None else "RGB",
            "kind": input_kind(preprocess),
            "dtype": input_dtype(preprocess, half),
            "dynamic_axes": ["batch", "height", "width"] if dynamic else [],
            "example_shape": [1, 3, int(h), int(w)],
            "size_divisor": int(divisor),
        },
        "output": {
            "name": output_name(argmax),
            "kind": "class_ids" if argmax else "logits",
            "layout": "NHW" if argmax else "NCHW",
            "dtype": "int64" if argmax else ("float16" if half else "float32"),
        },
        "precision": "float16" if half else "float32",
    }
    if extra:
        meta.update(extra)
    return meta
