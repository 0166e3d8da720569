"""DINOv2 encoder weights from a local file, in timm's layout or the official one.

Layouts: timm's (``vit_*_patch14[_reg4]_dinov2``: ``cls_token``, ``reg_token``, ``pos_embed``,
``patch_embed.proj``, ``blocks.N.{norm1,attn,ls1,norm2,mlp,ls2}``, ``norm``) and the official
(facebookresearch/dinov2's hub files, ``dinov2_vits14_pretrain.pth`` and the ``_reg4`` ones, which
UniMatch V2 loads): the same block names plus ``mask_token`` (used only by DINOv2's masked
pretraining) and ``register_tokens``, with a position for the class token in ``pos_embed`` even
with registers. timm's own ``checkpoint_filter_fn`` maps the official layout onto timm's (the
class token's position folded into the class token for the register models, whose timm
position embedding covers the patches alone) and resamples a position embedding trained at
another grid to the model's. Everything else loads as it is, strictly.

Reading the file: ``torch.load(weights_only=True)`` (a pickle that needs code to load is
refused) or safetensors. A caller that has read the file itself (segadv/checkpoint, with its
integrity checks) passes the mapping.
"""

from __future__ import annotations

import logging
import pickle
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from timm.models.vision_transformer import checkpoint_filter_fn
from torch import nn

from segadv.errors import UserError

log = logging.getLogger(__name__)

CONTAINER_KEYS = ("model", "state_dict")
OFFICIAL_ONLY_KEYS = ("mask_token", "register_tokens")
REGISTER_KEYS = ("register_tokens", "reg_token")
UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


@dataclass(frozen=True)
class EncoderWeights:
    """What :func:`load_encoder_weights` loaded: the file's layout, its tensor count, and whether
    the position embedding was resampled to the model's grid."""

    layout: str  # "timm" or "official"
    tensors: int
    resampled_pos_embed: bool


def read_weights(path: str | Path) -> dict[str, Any]:
    """The mapping stored in ``path`` (torch's format read with ``weights_only=True``, or
    safetensors by its suffix); a UserError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"encoder weights {path}: no such file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            obj: Any = load_file(str(path), device="cpu")
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        refused = UNSUPPORTED_GLOBAL.search(str(err))
        if refused is not None:
            raise UserError(f"encoder weights {path}: holds objects that need code to load ({refused.group(1)}), "
                            "and segadv loads tensors only (weights_only=True)") from None
        raise UserError(f"encoder weights {path}: not a readable weight file (its pickle data does not read)") from None
    except (RuntimeError, OSError, EOFError, ValueError, IndexError, KeyError, struct.error) as err:
        # Not a torch or safetensors file, or a truncated one (the unpickler's own errors on garbage).
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise UserError(f"encoder weights {path}: not a readable weight file ({type(err).__name__}: {first})") from None
    if not isinstance(obj, Mapping):
        raise UserError(f"encoder weights {path}: holds a {type(obj).__name__}, not a mapping of tensors")
    return dict(obj)


def flat_tensors(obj: Mapping[str, Any], name: str) -> dict[str, torch.Tensor]:
    """The state dict in ``obj`` (itself, or under ``model`` / ``state_dict``), every value a
    finite floating-point tensor; a UserError naming the first that is not."""
    for key in CONTAINER_KEYS:
        if isinstance(obj.get(key), Mapping):
            obj = obj[key]
    flat = dict(obj)
    for key, value in flat.items():
        if not isinstance(value, torch.Tensor):
            raise UserError(f"{name}: {key!r} is a {type(value).__name__}, not a tensor")
        if not value.is_floating_point():
            raise UserError(f"{name}: tensor {key!r} is {value.dtype}, not floating point")
        if not bool(torch.isfinite(value).all()):
            raise UserError(f"{name}: tensor {key!r} holds non-finite values (nan or inf)")
    return flat


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
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{name}: cannot map the {layout} layout onto {type(encoder).__name__}: {first}") from None
    # The official register models keep a class-token position that timm's layout folds away.
    tokens = None if pos is None or pos.dim() != 3 else pos.shape[1] - ("register_tokens" in flat)
    resampled = tokens is not None and tokens != expected["pos_embed"].shape[1]
    check_fits(state, expected, name)
    return state, EncoderWeights(layout, len(flat), resampled)


def check_fits(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], name: str) -> None:
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shaped = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    others = len(missing) + len(unexpected) + len(shaped) - 1
    if missing:
        raise UserError(mismatch(name, missing[0], "is missing from the file", None, None, others))
    if unexpected:
        raise UserError(mismatch(name, unexpected[0], "is in the file but not in the encoder", None, None, others))
    if shaped:
        key = shaped[0]
        raise UserError(mismatch(name, key, "has shape", state[key].shape, expected[key].shape, others))


def mismatch(name: str, key: str, what: str, got: Any, want: Any, others: int) -> str:
    shapes = f" {list(got)} where the encoder has {list(want)}" if got is not None else ""
    tail = (f" (and {others} other key{'s that do' if others != 1 else ' that does'} not fit)" if others else "")
    return f"{name}: key {key!r} {what}{shapes}{tail}"


def load_encoder_weights(model: nn.Module, source: str | Path | Mapping[str, Any],
                         name: str | None = None) -> EncoderWeights:
    """Load DINOv2 weights (a file, or a mapping already read) into ``model.encoder`` strictly
    (``model`` a :class:`~segadv.models.dinov2.dpt.DinoV2DPT`, bare). ``name`` labels a mapping in
    messages (the config key and file it came from)."""
    if isinstance(source, (str, Path)):
        name = name or f"encoder weights {source}"
        obj = read_weights(source)
    else:
        name = name or "encoder weights"
        obj = dict(source)
    encoder = model.encoder
    state, report = encoder_state_dict(obj, encoder, name)
    encoder.load_state_dict(state, strict=True)
    log.info("%s: %d tensors loaded (%s layout%s)", name, report.tensors, report.layout,
             ", position embedding resampled to the model's grid" if report.resampled_pos_embed else "")
    return report
