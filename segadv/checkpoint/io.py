"""Reading and writing checkpoint files: safe (``weights_only``), CPU-mapped, atomic."""

from __future__ import annotations

import io
import logging
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from segadv.errors import UserError
from segadv.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)


def save_checkpoint(state: dict[str, Any], *paths: Path) -> None:
    """Serialise once, then write each path atomically (temp file, fsync, os.replace)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    for path in paths:
        atomic_write_bytes(path, data)


def read_checkpoint(path: str | Path, *, trusted: bool = False) -> dict[str, Any]:
    """Load a checkpoint onto the CPU: tensors never land on the device they were saved from.

    Only plain data is unpickled (``weights_only=True``) unless the caller says the file is
    trusted, which runs whatever code the file holds.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"checkpoint {path} is a directory, not a file (an smp save_pretrained directory is "
                        "read by segadv-eval, segadv-export, segadv-predict and segadv-ckpt convert)")
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    if not _looks_like_torch_file(path):
        raise UserError(f"checkpoint {path} is truncated or corrupt: not a PyTorch file")
    try:
        # map_location="cpu": a file saved on cuda:0 must not touch cuda:0 here (seed 004).
        obj = torch.load(path, map_location="cpu", weights_only=not trusted)
    except pickle.UnpicklingError as err:
        raise UserError(
            f"checkpoint {path} was refused: it needs arbitrary pickled code to load, not only "
            f"weights ({_unsupported_global(err)}). segadv loads with weights_only=True; pass "
            "--trust-checkpoint only for a file from a source you trust."
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        raise UserError(f"checkpoint {path} is truncated or corrupt: {type(err).__name__}: {err}") from None
    if not isinstance(obj, dict):
        raise UserError(f"checkpoint {path} holds a {type(obj).__name__}, not a dict of tensors")
    return obj


def _read_safetensors(path: Path) -> dict[str, Any]:
    """safetensors files hold tensors only, so they are safe by construction."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise UserError(f"checkpoint {path} is truncated or corrupt: {err}") from None


def _looks_like_torch_file(path: Path) -> bool:
    """torch.save writes a zip archive; files from torch < 1.6 start with a pickle opcode."""
    if zipfile.is_zipfile(path):
        return True
    with open(path, "rb") as fh:
        return fh.read(1) == b"\x80"


def _unsupported_global(err: pickle.UnpicklingError) -> str:
    for line in str(err).splitlines():
        if "Unsupported global" in line or "Unsupported operand" in line:
            return line.strip().removeprefix("WeightsUnpickler error: ")
    return str(err).strip().splitlines()[0] if str(err).strip() else "unpickling failed"
