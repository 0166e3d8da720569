"""What a ViT arch's encoder table and its blocks obey, whatever the family: the sizes a DPT head
is put on, the timm names an arch builds, the four blocks the head reads, the patch rule on the
input, and the tokens the head takes from a block's output. An arch's ``encoder.py`` holds its own
table (:class:`EncoderTable`) and builds its timm encoder."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from segadv.errors import UserError


@dataclass(frozen=True)
class ViTSize:
    """One encoder size as a DPT head is put on it: its depth, the four blocks the head reads, and
    the head's widths (``features``: the fusion width; ``out_channels``: the four projections)."""

    depth: int
    layers: tuple[int, int, int, int]
    features: int
    out_channels: tuple[int, int, int, int]


def quarter_layers(depth: int) -> tuple[int, ...]:
    """The last block of each quarter of a ``depth``-block encoder, ``ceil((i + 1) * depth / 4) - 1``:
    always ending at the last block; a shallow encoder repeats blocks."""
    return tuple(math.ceil((i + 1) * depth / 4) - 1 for i in range(4))


@dataclass(frozen=True)
class EncoderTable:
    """The timm encoders an arch builds: each name (without a pretrained tag such as ``.lvd142m``)
    and its size; ``family`` names them in messages (``DINOv2``)."""

    family: str
    sizes: Mapping[str, ViTSize]

    def size(self, name: str) -> ViTSize:
        """The size of the timm encoder ``name``; a UserError naming the valid ones otherwise."""
        base = name.split(".", 1)[0]
        if base not in self.sizes:
            raise UserError(f"encoder {name!r} is not a {self.family} encoder segadv builds; "
                            f"valid: {sorted(self.sizes)}")
        return self.sizes[base]

    def default_layers(self, name: str, depth: int) -> tuple[int, ...]:
        """The four blocks the head reads: the size's own at its full depth, else the last block of
        each quarter (:func:`quarter_layers`)."""
        size = self.size(name)
        return size.layers if depth == size.depth else quarter_layers(depth)

    def timm_kwargs(self, name: str, depth: int | None, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
        """The arguments of timm's ``create_model`` for ``name`` beyond the family's own: ``depth``
        (the first blocks only) and ``overrides`` (``embed_dim``, ``num_heads``: tiny test models,
        which no published weights fit). ``name`` is checked first."""
        self.size(name)
        kwargs: dict[str, Any] = dict(overrides or {})
        if depth is not None:
            if depth < 1:
                raise UserError(f"encoder depth {depth}: a {self.family} encoder needs at least one block")
            kwargs["depth"] = depth
        return kwargs


def check_layers(layers: Sequence[int], depth: int) -> tuple[int, ...]:
    """``layers`` as the head reads them: four block indices in ``[0, depth)``, the last the
    encoder's last (blocks after it would never run: parameters outside the loss, which DDP
    (find_unused_parameters=False) and weight decay should not see)."""
    layers = tuple(int(i) for i in layers)
    if len(layers) != 4:
        raise UserError(f"intermediate layers {list(layers)}: the DPT head reads exactly 4 blocks")
    bad = [i for i in layers if not 0 <= i < depth]
    if bad:
        raise UserError(f"intermediate layer {bad[0]} is not a block of this {depth}-block encoder "
                        f"(valid: 0..{depth - 1})")
    if max(layers) != depth - 1:
        raise UserError(f"intermediate layers {list(layers)} end before the encoder's last block ({depth - 1}): "
                        f"read block {depth - 1} last, or set the depth to {max(layers) + 1}")
    return layers


def check_input_size(height: int, width: int, what: str, patch: int) -> None:
    """A UserError unless both sides are multiples of the patch: the patch embedding would drop
    the remainder silently, and the logits would not cover the image."""
    if height % patch or width % patch:
        fix = "x".join(str(round(n / patch) * patch or patch) for n in (height, width))
        raise UserError(f"{what}: {height}x{width} is not a multiple of the ViT patch ({patch}) on both sides "
                        f"(the nearest is {fix})")


def patch_tokens(vit: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """A block's output as the head reads it, as UniMatch V2's ``get_intermediate_layers`` (norm=True)
    and timm's ``forward_intermediates(norm=True)`` give it: the encoder's final norm applied, then
    the class and register tokens dropped (the head uses the patch tokens alone)."""
    return vit.norm(tokens)[:, vit.num_prefix_tokens:]
