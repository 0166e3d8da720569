"""DINOv2 encoders from timm, built without weights, and what the DPT head needs to know of them.

The encoder is timm's ``VisionTransformer`` itself (no wrapper), so its state dict is timm's
DINOv2 layout and a timm weight file loads into it as it is (weights.py). It is built with
``dynamic_img_size=True``: the position embedding stays at the grid it was built for
(``img_size``, 518 px = 37 x 37 patches, the pretrained grid) and is resampled to each input's
grid in the forward, so any multiple of the patch runs.
"""

from __future__ import annotations

from typing import Any, Mapping

import timm
import torch
import torch.nn.functional as F
from timm.layers import Attention
from torch import nn

from segadv.errors import UserError
from segadv.models.vit.encoder import EncoderTable, ViTSize

PATCH = 14
PRETRAINED_IMG_SIZE = 518  # the grid DINOv2's weights were trained at (37 x 37 patches)
ATTENTION_KERNELS = ("fused", "math")


# UniMatch V2's DPT head on each size (model/semseg/dpt.py and the ``model_configs`` of unimatch_v2.py)
SIZES = {
    "small": ViTSize(12, (2, 5, 8, 11), 64, (48, 96, 192, 384)),
    "base": ViTSize(12, (2, 5, 8, 11), 128, (96, 192, 384, 768)),
    "large": ViTSize(24, (4, 11, 17, 23), 256, (256, 512, 1024, 1024)),
    # timm's giant: width 1536, a SwiGLU MLP (fc1 packs Meta's w12, fc2 is its w3)
    "giant": ViTSize(40, (9, 19, 29, 39), 384, (1536, 1536, 1536, 1536)),
}

# The timm names segadv builds (with or without a pretrained tag such as ``.lvd142m``).
ENCODERS = EncoderTable("DINOv2", {f"vit_{size}_patch14{reg}_dinov2": SIZES[size]
                                   for size in SIZES for reg in ("", "_reg4")})
encoder_size = ENCODERS.size
# UniMatch V2's at the full depth; [2, 5, 8, 11] at depth 12 for any size, as the quarter rule gives
default_layers = ENCODERS.default_layers


def create_encoder(name: str, *, img_size: int = PRETRAINED_IMG_SIZE, depth: int | None = None,
                   drop_path_rate: float = 0.0, in_channels: int = 3,
                   overrides: Mapping[str, Any] | None = None) -> nn.Module:
    """timm's DINOv2 ``name`` with random weights (nothing is downloaded), no classifier head, any
    input size that is a multiple of the patch. ``depth`` keeps the first blocks only (a smaller
    model for tests or a CPU); ``overrides`` are further ``VisionTransformer`` arguments
    (``embed_dim``, ``num_heads``) for tiny test models, whose weights no DINOv2 file fits."""
    kwargs = ENCODERS.timm_kwargs(name, depth, overrides)
    if img_size % PATCH:
        raise UserError(f"encoder img_size {img_size} is not a multiple of the patch ({PATCH})")
    return timm.create_model(name.split(".", 1)[0], pretrained=False, num_classes=0, img_size=img_size,
                             dynamic_img_size=True, drop_path_rate=drop_path_rate, in_chans=in_channels, **kwargs)


def set_attention(module: nn.Module, kernel: str) -> int:
    """Every timm attention in ``module`` computed with ``kernel``: ``fused``
    (``F.scaled_dot_product_attention``, flash / memory-efficient where the device has them) or
    ``math`` (softmax(QK^T / sqrt(d)) V written out, which keeps the attention matrix for the
    backward: more memory, and what some exporters and older devices need). Returns how many."""
    if kernel not in ATTENTION_KERNELS:
        raise UserError(f"attention kernel {kernel!r}; valid: {list(ATTENTION_KERNELS)}")
    count = 0
    for m in module.modules():
        if isinstance(m, Attention):
            m.fused_attn = kernel == "fused"  # timm reads it per forward
            count += 1
    return count


def position_embedding(vit: nn.Module, grid: tuple[int, int]) -> torch.Tensor:
    """The encoder's position embedding at ``grid`` (rows, columns of patches), resampled as the
    official DINOv2 code (and so UniMatch V2) does: bicubic, no antialiasing, scale factors of
    (grid + 0.1) / built grid (its ``interpolate_offset``). timm's own resampling antialiases,
    which differs from the reference on a smaller grid and has no ONNX export."""
    pos = vit.pos_embed
    built = tuple(vit.patch_embed.grid_size)
    # Python numbers: a trace (ONNX export) sees the grid of its example input as constants.
    grid = (int(grid[0]), int(grid[1]))
    if tuple(grid) == built:
        return pos
    prefix = 0 if vit.no_embed_class else vit.num_prefix_tokens
    patches = pos[:, prefix:].reshape(1, built[0], built[1], -1).permute(0, 3, 1, 2)
    # The 0.1 keeps floor(built * scale) at the grid despite rounding (facebookresearch/dino#8).
    scale = ((grid[0] + 0.1) / built[0], (grid[1] + 0.1) / built[1])
    patches = F.interpolate(patches.float(), scale_factor=scale, mode="bicubic", align_corners=False,
                            antialias=False).to(pos.dtype)
    patches = patches.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)
    return torch.cat([pos[:, :prefix], patches], dim=1)


def embed(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The tokens the first block reads: patch embedding, class and register tokens, position
    embedding at ``x``'s grid (timm's ``_pos_embed`` order: with ``no_embed_class``, the register
    models, the class and register tokens take no position)."""
    x = vit.patch_embed(x)  # (B, rows, columns, C): dynamic_img_size keeps the grid
    batch, rows, columns, channels = x.shape
    pos = position_embedding(vit, (rows, columns))
    x = x.reshape(batch, rows * columns, channels)
    prefix = [t.expand(batch, -1, -1) for t in (vit.cls_token, vit.reg_token) if t is not None]
    if vit.no_embed_class:
        x = torch.cat(prefix + [x + pos], dim=1)
    else:
        x = torch.cat(prefix + [x], dim=1) + pos
    x = vit.pos_drop(x)
    x = vit.patch_drop(x)
    return vit.norm_pre(x)
