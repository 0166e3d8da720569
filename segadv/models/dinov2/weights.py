"""DINOv2 encoder weights from a local file, in timm's layout or the official one.

Layouts: timm's (``vit_*_patch14[_reg4]_dinov2``: ``cls_token``, ``reg_token``, ``pos_embed``,
``patch_embed.proj``, ``blocks.N.{norm1,attn,ls1,norm2,mlp,ls2}``, ``norm``) and the official
(facebookresearch/dinov2's hub files, ``dinov2_vits14_pretrain.pth`` and the ``_reg4`` ones, which
UniMatch V2 loads): the same block names plus ``mask_token`` (used only by DINOv2's masked
pretraining) and ``register_tokens``, with a position for the class token in ``pos_embed`` even
with registers. timm's own ``checkpoint_filter_fn`` maps the official layout onto timm's (the
class token's position folded into the class token for the register models, whose timm
position embedding covers the patches alone) and resamples a position embedding trained at
another grid to the model's. Everything else loads as it is, strictly (segadv/models/vit/weights.py
reads the file, checks its tensors and their fit, and loads them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from timm.models.vision_transformer import checkpoint_filter_fn
from torch import nn

from segadv.errors import UserError
from segadv.models.vit.weights import EncoderWeights, check_fits, first_line, flat_tensors, load_into_encoder, mismatch

OFFICIAL_ONLY_KEYS = ("mask_token", "register_tokens")
REGISTER_KEYS = ("register_tokens", "reg_token")


def layout_of(flat: Mapping[str, torch.Tensor]) -> str:
    return "official" if any(key in flat for key in OFFICIAL_ONLY_KEYS) else "timm"


def encoder_state_dict(obj: Mapping[str, Any], encoder: nn.Module, name: str = "encoder weights"
                       ) -> tuple[dict[str, torch.Tensor], EncoderWeights]:
    """``obj``'s tensors as ``encoder``'s state dict (timm's keys), checked against it: every key
    present, none extra, every shape the model's. A UserError naming the first that does not fit,
    and how many others do not."""
    flat = flat_tensors(obj, name)
    layout = layout_of(flat)
    expected = encoder.state_dict()
    patch = flat.get("patch_embed.proj.weight")
    if patch is not None and patch.shape[-2:] != expected["patch_embed.proj.weight"].shape[-2:]:
        # timm would resample the patch kernel (FlexiViT's trick), which is another model: refused.
        raise UserError(mismatch(name, "patch_embed.proj.weight", "has shape", patch.shape,
                                 expected["patch_embed.proj.weight"].shape, 0))
    file_registers = next((k for k in REGISTER_KEYS if k in flat), None)
    if (file_registers is not None) != ("reg_token" in expected):
        # Told before timm's mapping, which would fail on the position embedding's token count.
        if file_registers is not None:
            raise UserError(f"{name}: key {file_registers!r} is in the file but not in the encoder "
                            "(weights of a DINOv2 with registers, for an encoder without: use a _reg4_ encoder)")
        raise UserError(f"{name}: key 'reg_token' is missing from the file (weights of a DINOv2 without registers, "
                        "for a _reg4_ encoder)")
    pos = flat.get("pos_embed")
    try:
        state = checkpoint_filter_fn(dict(flat), encoder)
    except (RuntimeError, ValueError, AssertionError, IndexError) as err:
        raise UserError(f"{name}: cannot map the {layout} layout onto {type(encoder).__name__}: "
                        f"{first_line(err)}") from None
    # The official register models keep a class-token position that timm's layout folds away.
    tokens = None if pos is None or pos.dim() != 3 else pos.shape[1] - ("register_tokens" in flat)
    resampled = tokens is not None and tokens != expected["pos_embed"].shape[1]
    check_fits(state, expected, name)
    return state, EncoderWeights(layout, len(flat), resampled)


def load_encoder_weights(model: nn.Module, source: str | Path | Mapping[str, Any],
                         name: str | None = None) -> EncoderWeights:
    """Load DINOv2 weights (a file, or a mapping already read) into ``model.encoder`` strictly
    (``model`` a :class:`~segadv.models.dinov2.dpt.DinoV2DPT`, bare). ``name`` labels a mapping in
    messages (the config key and file it came from)."""
    return load_into_encoder(model, source, encoder_state_dict, name)
