"""DINOv3 encoder weights from a local file, in timm's layout or Meta's, loaded strictly.

Layouts: timm's (``vit_*_patch16_dinov3[_qkvb]``: ``cls_token``, ``reg_token``,
``patch_embed.proj``, ``blocks.N.{norm1,attn,gamma_1,norm2,mlp,gamma_2}``, ``norm``) and Meta's
(facebookresearch/dinov3's ``dinov3_vit*16_pretrain_*.pth``): ``storage_tokens`` for the
registers, ``ls1`` / ``ls2`` for the layer scales, a fused ``attn.qkv.bias`` with its
``bias_mask``, the SwiGLU's ``w1`` / ``w2`` / ``w3``, and tensors only pretraining uses
(``mask_token``, ``rope_embed.periods``, 7B's ``local_cls_norm``). timm's own
``checkpoint_filter_fn`` (timm/models/eva.py) maps Meta's layout onto timm's; the result is then
checked key by key against the encoder and loaded strictly (segadv/models/vit/weights.py).

One thing is decided here, not by timm: Meta's files hold a query / key / value bias. The
``_qkvb`` encoders take its query and value parts (the key's is fixed at 0); an encoder without
biases takes a file whose biases are all zero (the distilled models'), and refuses one with any
non-zero bias rather than dropping it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from timm.models.eva import checkpoint_filter_fn
from torch import nn

from segadv.errors import UserError
from segadv.models.vit.weights import EncoderWeights, check_fits, first_line, flat_tensors, load_into_encoder, unwrap

META_ONLY_SUFFIXES = (".bias_mask", ".periods", "mask_token")  # pretraining's, or recomputed buffers
META_ONLY_PREFIXES = ("local_cls_norm.",)  # 7B's pretraining on local crops


def encoder_state_dict(obj: Mapping[str, Any], encoder: nn.Module, name: str = "encoder weights"
                       ) -> tuple[dict[str, torch.Tensor], EncoderWeights]:
    """``obj``'s tensors as ``encoder``'s state dict (timm's keys), checked against it: every key
    present, none extra, every shape the model's; a UserError naming the first that does not fit."""
    raw = unwrap(obj)
    meta = "storage_tokens" in raw
    if meta:
        raw = {k: v for k, v in raw.items()
               if not k.endswith(META_ONLY_SUFFIXES) and not k.startswith(META_ONLY_PREFIXES)}
    flat = flat_tensors(raw, name)
    expected = encoder.state_dict()
    if meta:
        flat = drop_zero_qkv_bias(flat, expected, name)
        try:
            state = checkpoint_filter_fn(dict(flat), encoder)
        except (RuntimeError, ValueError, AssertionError, IndexError, KeyError) as err:
            raise UserError(f"{name}: cannot map Meta's layout onto {type(encoder).__name__}: "
                            f"{first_line(err)}") from None
    else:
        state = flat
    check_fits(state, expected, name)
    return state, EncoderWeights("meta" if meta else "timm", len(flat), False)


def drop_zero_qkv_bias(flat: dict[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
                       name: str) -> dict[str, torch.Tensor]:
    """Meta's fused ``attn.qkv.bias`` for an encoder without biases: dropped where all zero (timm's
    filter would drop it whatever it holds), a UserError naming the first non-zero one."""
    if any(k.endswith("attn.q_bias") for k in expected):
        return flat  # a _qkvb encoder: timm's filter splits it
    biases = [k for k in flat if k.endswith("attn.qkv.bias")]
    nonzero = next((k for k in biases if bool(flat[k].any())), None)
    if nonzero is not None:
        raise UserError(f"{name}: key {nonzero!r} holds non-zero attention biases, which this encoder has no place "
                        "for: use the encoder's _qkvb variant (model.generator.encoder)")
    return {k: v for k, v in flat.items() if k not in biases}


def load_encoder_weights(model: nn.Module, source: str | Path | Mapping[str, Any],
                         name: str | None = None) -> EncoderWeights:
    """Load DINOv3 weights (a file, or a mapping already read) into ``model.encoder`` strictly
    (``model`` a :class:`~segadv.models.dinov3.model.DinoV3DPT`, bare)."""
    return load_into_encoder(model, source, encoder_state_dict, name)
