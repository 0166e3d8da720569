"""A ViT encoder's weights from a local file, whatever the family: the file read, its state dict
found and checked tensor by tensor, checked key by key against the encoder, and loaded strictly.
An arch's ``weights.py`` maps its family's published layout onto timm's keys between the two
(``to_state``: DINOv2's official layout, Meta's DINOv3 one).

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
from typing import Any, Callable, Mapping

import torch
from torch import nn

from segadv.errors import UserError

log = logging.getLogger(__name__)

CONTAINER_KEYS = ("model", "state_dict")
UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


@dataclass(frozen=True)
class EncoderWeights:
    """What a load read: the file's layout (``timm``, or the family's: ``official``, ``meta``), its
    tensor count, and whether the position embedding was resampled to the model's grid."""

    layout: str
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


def unwrap(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The state dict in ``obj``: itself, or under ``model`` / ``state_dict``."""
    for key in CONTAINER_KEYS:
        if isinstance(obj.get(key), Mapping):
            obj = obj[key]
    return dict(obj)


def flat_tensors(obj: Mapping[str, Any], name: str) -> dict[str, torch.Tensor]:
    """The state dict in ``obj`` (:func:`unwrap`), every value a finite floating-point tensor; a
    UserError naming the first that is not."""
    flat = unwrap(obj)
    for key, value in flat.items():
        if not isinstance(value, torch.Tensor):
            raise UserError(f"{name}: {key!r} is a {type(value).__name__}, not a tensor")
        if not value.is_floating_point():
            raise UserError(f"{name}: tensor {key!r} is {value.dtype}, not floating point")
        if not bool(torch.isfinite(value).all()):
            raise UserError(f"{name}: tensor {key!r} holds non-finite values (nan or inf)")
    return flat


def first_line(err: BaseException) -> str:
    """An exception's first line, or its type's name: what a mapping's failure says in one line."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


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


# (the file's mapping, the encoder, a name for messages) -> its state dict in timm's keys, checked
# against the encoder (check_fits), and what was read
ToState = Callable[[Mapping[str, Any], nn.Module, str], "tuple[dict[str, torch.Tensor], EncoderWeights]"]


def load_into_encoder(model: nn.Module, source: str | Path | Mapping[str, Any], to_state: ToState,
                      name: str | None = None) -> EncoderWeights:
    """Load weights (a file, or a mapping already read) into ``model.encoder`` strictly, mapped
    by ``to_state``. ``name`` labels a mapping in messages (the config key and file it came from)."""
    if isinstance(source, (str, Path)):
        name = name or f"encoder weights {source}"
        obj = read_weights(source)
    else:
        name = name or "encoder weights"
        obj = dict(source)
    encoder = model.encoder
    state, report = to_state(obj, encoder, name)
    encoder.load_state_dict(state, strict=True)
    log.info("%s: %d tensors loaded (%s layout%s)", name, report.tensors, report.layout,
             ", position embedding resampled to the model's grid" if report.resampled_pos_embed else "")
    return report
