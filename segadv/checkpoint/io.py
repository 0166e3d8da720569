"""Reading and writing checkpoint files: safe (``weights_only``), CPU-mapped, atomic, sealed with
their sha256 and verified on every read (segadv/checkpoint/integrity.py)."""

from __future__ import annotations

import io
import logging
import pickle
import re
import struct
import sys
import traceback
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from segadv.checkpoint.integrity import (
    EXPORTED_PROGRAM, PICKLE, SAFETENSORS, TORCHSCRIPT, UNKNOWN, CorruptCheckpoint, Integrity, seal_torch_zip, sniff,
    unknown_format, verify,
)
from segadv.errors import UserError
from segadv.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)


def checkpoint_bytes(state: dict[str, Any]) -> bytes:
    """``torch.save``'s bytes of ``state``, sealed with their sha256."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return seal_torch_zip(buffer)


def save_checkpoint(state: dict[str, Any], *paths: Path) -> None:
    """Serialise (and seal) once, then write each path atomically (temp file, fsync, os.replace)."""
    data = checkpoint_bytes(state)
    for path in paths:
        atomic_write_bytes(path, data)


def read_checkpoint(path: str | Path, *, trusted: bool = False) -> dict[str, Any]:
    """Load a checkpoint onto the CPU: tensors never land on the device they were saved from.

    The file is verified first (its sealed sha256, else a zip archive's CRC-32s). Only plain data
    is unpickled (``weights_only=True``) unless the caller says the file is trusted, which runs
    whatever code the file holds.
    """
    return read_verified(path, trusted=trusted)[0]


def read_verified(path: str | Path, *, trusted: bool = False) -> tuple[dict[str, Any], Integrity]:
    """:func:`read_checkpoint`, and what its integrity check found."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"checkpoint {path} is a directory, not a file (an smp save_pretrained directory is "
                        "read by segadv-eval, segadv-export, segadv-predict and segadv-ckpt convert)")
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    try:
        kind = sniff(path)
        integrity = verify(path, kind)
    except OSError as err:
        raise UserError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    if kind == UNKNOWN:
        raise unknown_format(path)
    if kind == TORCHSCRIPT:
        raise UserError(
            f"checkpoint {path} is a TorchScript module (torch.jit.save, e.g. segadv-export --format torchscript), "
            f"not a checkpoint: segadv-predict --model {path} runs it; here the weights file or training "
            "checkpoint it was made from is needed"
        )
    if kind == EXPORTED_PROGRAM:
        raise UserError(
            f"checkpoint {path} is a torch.export program (torch.export.save, e.g. segadv-export --format exported), "
            f"not a checkpoint: segadv-predict --model {path} runs it; here the weights file or training "
            "checkpoint it was made from is needed"
        )
    if kind == SAFETENSORS:
        if path.suffix != ".safetensors":
            log.info("%s holds safetensors (read as such, whatever its suffix)", path)
        return _read_safetensors(path), integrity
    return _torch_load(path, trusted, legacy=kind == PICKLE), integrity


def _torch_load(path: Path, trusted: bool, legacy: bool) -> dict[str, Any]:
    try:
        # torch warns about what it finds in the stream (e.g. "Detected pickle protocol 245" for
        # random bytes after a 0x80) with a source line of its own; held until the file has read,
        # so a corrupt file gets one error line and a good one the warning as a log line.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # map_location="cpu": a file saved on cuda:0 must not touch cuda:0 here (it may be absent,
            # or another process's); every reader places the weights on its own devices afterwards.
            obj = torch.load(path, map_location="cpu", weights_only=not trusted)
    except pickle.UnpicklingError as err:
        raise _unpickling_error(path, err, legacy) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        raise CorruptCheckpoint(f"checkpoint {path} is truncated or corrupt: {_first_line(err)}") from None
    except (IndexError, KeyError, TypeError, AttributeError, struct.error, RecursionError, MemoryError) as err:
        # Garbage fed to the unpickler's opcodes (a pop from an empty stack, a memo key never
        # set, a huge length, a callable given the wrong arguments): torch.load passes these
        # through as they are. A TypeError or AttributeError raised outside the unpickling (a
        # torch whose load() takes other arguments or lacks an attribute) says nothing about the
        # file: it propagates as the bug it is.
        if isinstance(err, (TypeError, AttributeError)) and not raised_unpickling(err):
            raise
        what = "not a readable pickle stream" if legacy else "its pickle data does not read"
        raise CorruptCheckpoint(f"checkpoint {path} is corrupt: {what} ({_first_line(err)})") from None
    for warning in caught:
        log.warning("%s: %s", path, warning.message)
    if isinstance(obj, torch.nn.Module):  # a pickled model (trusted): its weights are what is wanted
        log.info("%s holds a pickled %s: using its state_dict()", path, type(obj).__name__)
        return obj.state_dict()
    if not isinstance(obj, dict):
        raise UserError(f"checkpoint {path} holds a {type(obj).__name__}, not a dict of tensors")
    return obj


# The lines of torch.serialization and pickle that run a file's pickle stream: an error raised
# below one of them (or in torch's weights-only unpickler) was raised by the stream's bytes.
_UNPICKLING_CALL = re.compile(r"\b(?:unpickler|pickle_module|_unpickler|Unpickler\(.*\))\.load\(")
_UNPICKLER_FILES = ("_weights_only_unpickler.py", "pickle.py")


def raised_unpickling(err: BaseException) -> bool:
    """Whether ``err`` was raised while the file's pickle stream was read (by the unpickler, or a
    callable the stream names), rather than by torch's API around it."""
    for frame in traceback.extract_tb(err.__traceback__):
        if Path(frame.filename).name in _UNPICKLER_FILES or _UNPICKLING_CALL.search(frame.line or ""):
            return True
    return False


# What torch's weights-only unpickler says when a stream needs code it will not run, across torch
# 2.4 .. 2.14 (each its own wording; every one an UnpicklingError), with the name of what it needs:
# a global it does not allow, or a module it blocks ("Unsupported global: GLOBAL x.Y was not an
# allowed global", "Trying to load unsupported GLOBAL posix.system whose module posix is blocked",
# older "Unsupported class x.Y"); an object of a class it will not build or create ("Can only build
# Tensor, ... but got <class 'x.Y'>", "Can only create new object for nn.Parameter ... but got
# <class 'x.Y'>"); a function it will not call ("Trying to call reduce for unrecognized function
# <built-in function system>"); tensors of a subsystem not imported ("``torch.distributed.tensor``
# must be imported to load DTensors").
_NEEDS_CODE = (
    (re.compile(r"\bGLOBAL ([\w.<>]+)"), "Unsupported global: GLOBAL {}"),
    (re.compile(r"Unsupported class ([\w.<>]+)"), "Unsupported global: GLOBAL {}"),
    (re.compile(r"(?:Can only build|Can only create new object)\b.*?but got <class '([\w.<>]+)'>"),
     "an object of class {}"),
    (re.compile(r"reduce for unrecognized function (.+?)(?: which belongs to|\.?\s*$)", re.MULTILINE),
     "a call of {}"),
    (re.compile(r"``([\w.]+)``(?: and ``[\w.]+``)? must be imported"), "tensors of {}"),
)


def needed_code(message: str) -> tuple[str, str] | None:
    """``(name, what)``: the class, function or module a weights-only refusal names
    (:data:`_NEEDS_CODE`) and how to say it, or None when the message is none of those (the
    stream itself is damaged)."""
    for pattern, what in _NEEDS_CODE:
        match = pattern.search(message)
        if match is not None:
            name = match.group(1).strip().removeprefix("builtins.")  # torch 2.5 says builtins.print, 2.14 print
            return name, what.format(name)
    return None


def _unpickling_error(path: Path, err: pickle.UnpicklingError, legacy: bool) -> UserError:
    """Untrusted code (a global the safe unpickler refuses), a pickled model, or a damaged file."""
    needed = needed_code(str(err))
    if needed is None:  # not code it refuses: the pickle stream itself is broken
        what = "not a readable pickle stream" if legacy else "its pickle data does not read"
        return CorruptCheckpoint(f"checkpoint {path} is corrupt: {what} ({_weights_unpickler_error(err)})")
    name, needs = needed
    module = _loaded_class(name)
    if module is not None and issubclass(module, torch.nn.Module):
        return UserError(
            f"checkpoint {path} holds a pickled {module.__name__} model object (torch.save(model)), not weights: "
            "save model.state_dict() where it was made; or, only for a file from a source you trust, pass "
            "--trust-checkpoint, which runs the code it holds and uses the model's state_dict()"
        )
    return UserError(
        f"checkpoint {path} was refused: it needs arbitrary pickled code to load, not only "
        f"weights ({needs}). segadv loads with weights_only=True; pass "
        "--trust-checkpoint only for a file from a source you trust."
    )


def _loaded_class(name: str) -> type | None:
    """The class ``module.Class`` names, if its module is imported already (nothing is imported
    on a file's say-so)."""
    module_name, _, attr = name.rpartition(".")
    value = getattr(sys.modules.get(module_name), attr, None)
    return value if isinstance(value, type) else None


def _weights_unpickler_error(err: pickle.UnpicklingError) -> str:
    """The unpickler's own words from torch's message, without its advice and documentation link
    (which name weights_only, a setting the user of a damaged file has no reason to touch)."""
    own = re.search(r"WeightsUnpickler error: *([^\n]+)", str(err))
    if own is not None:
        return own.group(1).strip()
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("Unsupported operand", "Unsupported")):
            return line
    return lines[-1] if lines else "unpickling failed"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def _read_safetensors(path: Path) -> dict[str, Any]:
    """safetensors files hold tensors only, so they are safe by construction."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise CorruptCheckpoint(f"checkpoint {path} is truncated or corrupt: {err}") from None
