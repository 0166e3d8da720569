"""G on a ViT encoder (timm's, its keys timm's layout under ``encoder.``) with UniMatch V2's DPT
head (segadv/models/vit/head.py, its keys the reference's under ``head.``): what every ViT arch's
network is and offers. The head reads four blocks' patch tokens (:func:`patch_tokens`); its logits,
at 8x the patch grid, are upsampled to the input (bilinear, ``align_corners=True``, as the
reference does). An arch's subclass builds its encoder and says how the input becomes the first
block's tokens (:meth:`ViTDPT.embed`: a position embedding, or a rotary embedding each block takes).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from segadv.errors import UserError
from segadv.models.base import Generator
from segadv.models.features import scale_features
from segadv.models.vit.encoder import ViTSize, check_input_size, check_layers, patch_tokens
from segadv.models.vit.head import DPTHead
from segadv.models.vit.split import Placement, split_blocks


def to_stage(device: torch.device, tokens: torch.Tensor, block_inputs: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The tokens and what the blocks take besides onto a stage's ``device``: each block reads
    every tensor it is given on its own device (a stage handed the first stage's rotary embedding
    would mix devices)."""
    return tokens.to(device), {key: value.to(device) for key, value in block_inputs.items()}


class ViTDPT(Generator):
    """G: ``encoder`` (timm's ViT, built by the subclass) and ``head`` (the DPT head). ``forward(x)``
    returns the logits (B, classes, H, W) at ``x``'s size; H and W must be multiples of the patch,
    a UserError naming ``input_name`` otherwise. ``layers``: the four blocks the head reads (None:
    ``default_layers``); ``features`` and ``out_channels``: the head's widths (None: ``size``'s).

    A subclass sets ``patch`` and ``embedding_modules`` (the encoder's submodules that run before
    its first block, placed with the embedding stage) and implements :meth:`embed`."""

    # The embedding is computed from Python numbers of the input's grid (a position embedding's
    # resampling factors, a rotary embedding's coordinates), constants in an ONNX trace: the
    # exported graph takes the traced size only (segadv-export says so).
    onnx_dynamic_shapes = False
    patch = 0
    embedding_modules = ()  # type: tuple[str, ...]

    def __init__(self, encoder: nn.Module, size: ViTSize, num_classes: int, *, layers: Sequence[int] | None,
                 default_layers: Sequence[int], features: int | None, out_channels: Sequence[int] | None,
                 input_name: str) -> None:
        super().__init__()
        self.input_name = input_name
        self.encoder = encoder
        self.layers = check_layers(default_layers if layers is None else layers, len(encoder.blocks))
        out_channels = tuple(size.out_channels if out_channels is None else out_channels)
        if len(out_channels) != 4:
            raise UserError(f"DPT head out_channels {list(out_channels)}: the head has exactly 4 branches")
        self.head = DPTHead(num_classes, encoder.embed_dim, size.features if features is None else features,
                            out_channels)
        self.placement: Placement | None = None  # one device unless split_blocks sets it
        self._stage_devices: tuple[torch.device, ...] = ()

    def input_divisor(self) -> int:
        """The encoder cuts the input into patches: both sides must be multiples of the patch."""
        return self.patch

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[int, int]]:
        """The tokens the first block reads, what every block takes besides them (keyword
        arguments, on the embedding's device), and the grid (rows, columns of patches)."""
        raise NotImplementedError

    def split(self, stage_devices: Sequence[torch.device], boundaries: Sequence[int] | None = None) -> None:
        """Pipeline stages (segadv/parallel/pipeline.py's protocol): the embedding on the first
        device, the blocks in even runs (or from ``boundaries``), the final norm and the head on the
        last (:func:`~segadv.models.vit.split.split_blocks`)."""
        split_blocks(self, stage_devices, boundaries)
        self._stage_devices = tuple(torch.device(d) for d in stage_devices)

    @property
    def pipeline_devices(self) -> tuple[torch.device, ...]:
        """Each stage's device in order after :meth:`split` (a device may repeat); () before."""
        return self._stage_devices

    def stages(self) -> list[tuple[str, list[nn.Module]]]:
        """The model in pipeline order, as (name, modules): ``embed`` (the embedding's modules; the
        encoder's own token parameters live on the encoder itself), ``blocks.0`` ... ``blocks.N-1``,
        ``head`` (the final norm and the DPT head)."""
        vit = self.encoder
        embedding = [getattr(vit, name) for name in self.embedding_modules]
        return ([("embed", embedding)] + [(f"blocks.{i}", [b]) for i, b in enumerate(vit.blocks)]
                + [("head", [vit.norm, self.head])])

    def checkpoint_units(self) -> list[str]:
        """The submodule names to run under activation checkpointing: each ViT block (most of the
        activation memory: the attention and the 4x-wide MLP) and the head."""
        return [f"encoder.blocks.{i}" for i in range(len(self.encoder.blocks))] + ["head"]

    def feature_channels(self) -> tuple[int, ...]:
        """The channels of the token maps the head reads, in the order ``feature_scales`` takes them
        (segadv/models/features.py)."""
        return (int(self.encoder.embed_dim),) * len(self.layers)

    def forward(self, x: torch.Tensor, feature_scales: Sequence[torch.Tensor] | None = None,
                with_unperturbed: bool = False) -> Any:
        """The logits at ``x``'s size; with ``feature_scales``, the head reads each token map
        times its (B, C) scale (UniMatch V2's complementary dropout, on the normed patch tokens as
        its DPT), with ``with_unperturbed`` beside the unscaled maps in one batch, returning
        ``(clean, perturbed)`` (segadv/models/features.py)."""
        height, width = x.shape[-2:]
        if not torch.jit.is_tracing():
            check_input_size(int(height), int(width), self.input_name, self.patch)
        vit, placement = self.encoder, self.placement
        tokens, block_inputs, grid = self.embed(x if placement is None else x.to(placement.embed))
        wanted = set(self.layers)
        taken: dict[int, torch.Tensor] = {}
        for i, block in enumerate(vit.blocks):
            if placement is not None:
                tokens, block_inputs = to_stage(placement.blocks[i], tokens, block_inputs)
            tokens = block(tokens, **block_inputs)
            if i in wanted:
                taken[i] = tokens if placement is None else tokens.to(placement.head)
        features = [patch_tokens(vit, taken[i]) for i in self.layers]
        if feature_scales is not None:
            features = scale_features(features, feature_scales, with_unperturbed=with_unperturbed)
        logits = self.head(features, grid)
        logits = F.interpolate(logits, size=(height, width), mode="bilinear", align_corners=True)
        return logits.chunk(2) if feature_scales is not None and with_unperturbed else logits
