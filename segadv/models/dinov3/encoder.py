"""DINOv3 encoders from timm, built without weights, and what the DPT head needs to know of them.

The encoder is timm's ``Eva`` itself (no wrapper), so its state dict is timm's DINOv3 layout and a
timm weight file loads into it as it is (weights.py). DINOv3 has no position embedding to resample:
its rotary embedding (RoPE) normalises each input's patch coordinates to [-1, 1], so any grid runs
(timm's ``dynamic_img_size``) and the weights fit every input size that is a multiple of the patch.
"""

from __future__ import annotations

from typing import Any, Mapping

import timm
import torch
from torch import nn

from segadv.models.dinov3.config import DINOV3_ENCODERS, PATCH
from segadv.models.vit.encoder import EncoderTable, ViTSize


def meta_layers(depth: int) -> tuple[int, int, int, int]:
    """Meta's FOUR_EVEN_INTERVALS (facebookresearch/dinov3, dinov3/eval/segmentation/models:
    ``_get_backbone_out_indices``): [4, 11, 17, 23] at 24 blocks (the paper's), else the last block
    of each quarter, ``i * (depth // 4) - 1``."""
    if depth == 24:
        return (4, 11, 17, 23)
    return tuple(i * (depth // 4) - 1 for i in range(1, 5))  # type: ignore[return-value]


# The head's widths: UniMatch V2's for S, B and L (by the encoder's width, as for DINOv2); no
# reference puts a DPT head on H+ or 7B: L's proportions at H+'s width 1280, DINOv2-g's head for 7B
# (a 4096-wide projection per branch would be a head of a billion parameters).
SIZES = {
    "small": ViTSize(12, meta_layers(12), 64, (48, 96, 192, 384)),
    "small_plus": ViTSize(12, meta_layers(12), 64, (48, 96, 192, 384)),
    "base": ViTSize(12, meta_layers(12), 128, (96, 192, 384, 768)),
    "large": ViTSize(24, meta_layers(24), 256, (256, 512, 1024, 1024)),
    "huge_plus": ViTSize(32, meta_layers(32), 320, (320, 640, 1280, 1280)),
    "7b": ViTSize(40, meta_layers(40), 384, (1536, 1536, 1536, 1536)),
}


ENCODERS = EncoderTable("DINOv3", {name: SIZES[name.removeprefix("vit_").split("_patch16")[0]]
                                   for name in DINOV3_ENCODERS})
encoder_size = ENCODERS.size
# Meta's at the full depth; the last block of each quarter at a reduced one (Meta's where the depth
# is a multiple of 4)
default_layers = ENCODERS.default_layers


def create_encoder(name: str, *, depth: int | None = None, drop_path_rate: float = 0.0, in_channels: int = 3,
                   overrides: Mapping[str, Any] | None = None) -> nn.Module:
    """timm's DINOv3 ``name`` with random weights (nothing is downloaded), no classifier head, any
    input size that is a multiple of the patch. ``depth`` keeps the first blocks only;
    ``overrides`` are further ``Eva`` arguments (``embed_dim``, ``num_heads``) for tiny test models."""
    kwargs = ENCODERS.timm_kwargs(name, depth, overrides)
    vit = timm.create_model(name.split(".", 1)[0], pretrained=False, num_classes=0, dynamic_img_size=True,
                            drop_path_rate=drop_path_rate, in_chans=in_channels, **kwargs)
    rope = vit.rope
    if (rope.normalize_coords, rope.grid_indexing, rope.grid_offset, rope.aug_active) != ("separate", "ij", 0.0, False):
        # rope_embed computes DINOv3's own grid; another one (or train-time coordinate augmentations)
        # would need timm's host-side construction
        raise ValueError(f"{name}: a rotary embedding on another grid than DINOv3's (normalize_coords "
                         f"{rope.normalize_coords}, indexing {rope.grid_indexing}, offset {rope.grid_offset}, "
                         f"augmentations {rope.aug_active})")
    return vit


def embed(vit: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """The tokens the first block reads (class and register tokens, then the patches: no position
    embedding), the rotary embedding at ``x``'s grid, and the grid (rows, columns of patches)."""
    x = vit.patch_embed(x)  # (B, rows, columns, C): dynamic_img_size keeps the grid
    batch, rows, columns, channels = x.shape
    x = x.reshape(batch, rows * columns, channels)
    prefix = [t.expand(batch, -1, -1) for t in (vit.cls_token, vit.reg_token) if t is not None]
    x = vit.norm_pre(vit.pos_drop(torch.cat(prefix + [x], dim=1)))
    # Python ints: a trace (ONNX export) sees the grid of its example input as constants.
    return x, rope_embed(vit.rope, int(rows), int(columns)), (rows, columns)


def rope_embed(rope: nn.Module, rows: int, columns: int) -> torch.Tensor:
    """The rotary embedding at a grid of ``rows`` x ``columns`` patches, (rows * columns, 2 * dim):
    timm's ``get_embed``, with the grid made on the device of the embedding's periods. timm makes it
    on the host and copies it over at every forward: a tensor on a device the map does not name, and
    a host-to-device copy per step. The grid is DINOv3's (0.5-centred, each axis over its own size,
    mapped to [-1, 1], rows first), the one ``create_encoder`` admits; equal to timm's bitwise
    (tests/models/test_dinov3.py)."""
    device = rope.periods.device
    axes = [torch.arange(0.5, n, device=device, dtype=torch.float32) / float(n) for n in (rows, columns)]
    coords = 2.0 * torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).flatten(0, 1) - 1.0
    sin, cos = rope._get_pos_embed_from_coords(coords)
    return torch.cat([sin, cos], dim=-1)


__all__ = ["PATCH", "SIZES", "create_encoder", "default_layers", "embed", "encoder_size", "meta_layers", "rope_embed"]
