"""What a checkpoint file is, and whether it is the file that was written.

**Sealing.** Every checkpoint segadv writes carries the sha256 of its own content inside it, so
the record travels with the file (copied, renamed, archived) and is written in the same atomic
rename as the file (no window where file and record disagree):

- torch.save's zip archive: the zip comment (the end-of-central-directory record's free-text
  field, which torch and ``zipfile`` read past) holds ``segadv-sha256:<hex>``, the sha256 of
  every byte before that record (the tensors, the pickle and the zip directory);
- safetensors: ``__metadata__["segadv_sha256"]``, the sha256 of the data section after the header.

**Verifying** (every load, :func:`verify`): a sealed file whose bytes do not hash to its record is
corrupt (exit 2 naming it). A file without a record (a user's own ``.pth``) still loads; a zip
archive's CRC-32s are checked then (torch's reader skips them), so damaged tensors are found anyway.

**Sniffing** (:func:`sniff`): the format is told from the bytes, not the suffix, so a TorchScript
module, a torch.export program, a safetensors file under another suffix or an ONNX model get their
own message, and random bytes are called corrupt, never "pickled code".
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from segadv.errors import UserError

SEAL = b"segadv-sha256:"
SAFETENSORS_KEY = "segadv_sha256"
_EOCD = b"PK\x05\x06"  # zip end-of-central-directory record: 22 bytes + the comment
_EOCD_SIZE = 22
_SEALED_TAIL = _EOCD_SIZE + len(SEAL) + 64
_CHUNK = 1 << 20

# What sniff() tells apart.
TORCH_ZIP, TORCHSCRIPT, SAFETENSORS, PICKLE, UNKNOWN = "torch zip", "TorchScript", "safetensors", "pickle", "unknown"
EXPORTED_PROGRAM = "torch.export program"  # torch.export.save's archive (.pt2)

# ONNX's ModelProto (onnx.proto): its top-level field numbers and their protobuf wire types
# (0 varint, 2 length-delimited). torch.onnx and onnx.save write ir_version (field 1) first.
_ONNX_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2}


class CorruptCheckpoint(UserError):
    """The file is damaged: its bytes are not the ones written. Never a matter of trust."""


@dataclass(frozen=True)
class Integrity:
    """What was checked: ``recorded`` the sha256 sealed in the file (None: none), ``checked`` in words."""

    recorded: Optional[str]
    checked: str


# ------------------------------------------------------------------------------ sealing


def seal_torch_zip(buffer: io.BytesIO) -> bytes:
    """torch.save's archive in ``buffer`` with its sha256 as the zip comment (see the module doc)."""
    view = buffer.getbuffer()
    if len(view) < _EOCD_SIZE or bytes(view[-_EOCD_SIZE:-_EOCD_SIZE + 4]) != _EOCD or bytes(view[-2:]) != b"\0\0":
        del view
        return buffer.getvalue()  # not the plain archive torch writes: left as it is
    digest = hashlib.sha256(view[:-_EOCD_SIZE]).hexdigest()
    del view  # a BytesIO with a live view cannot be written to
    comment = SEAL + digest.encode("ascii")
    buffer.seek(-2, io.SEEK_END)
    buffer.write(len(comment).to_bytes(2, "little") + comment)
    return buffer.getvalue()


def seal_safetensors(data: bytes) -> bytes:
    """safetensors bytes with the sha256 of their data section in ``__metadata__`` (the tensors'
    offsets are relative to the data section, so only the header changes)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    body = memoryview(data)[8 + size:]
    header.setdefault("__metadata__", {})[SAFETENSORS_KEY] = hashlib.sha256(body).hexdigest()
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # safetensors aligns the data section to 8 bytes
    return len(text).to_bytes(8, "little") + text + bytes(body)


# ------------------------------------------------------------------------------ sniffing


def sniff(path: Path) -> str:
    """The file's format from its bytes: TORCH_ZIP, TORCHSCRIPT, EXPORTED_PROGRAM, SAFETENSORS, PICKLE or
    UNKNOWN."""
    with open(path, "rb") as fh:
        head = fh.read(16)
    if _is_safetensors(path, head):
        return SAFETENSORS
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, ValueError):
            return TORCH_ZIP  # found to be damaged by verify()
        if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
            return TORCHSCRIPT
        # torch.export.save's archive: an archive_format entry since torch 2.6, the serialized
        # program's JSON at the top level before (torch 2.5)
        if any(n == "archive_format" or n.endswith("/archive_format") for n in names) or \
                "serialized_exported_program.json" in names:
            return EXPORTED_PROGRAM
        return TORCH_ZIP
    if head[:1] == b"\x80":
        return PICKLE  # torch < 1.6 files are a pickle stream (random bytes may start so too)
    return UNKNOWN


def _is_safetensors(path: Path, head: bytes) -> bool:
    if len(head) < 9 or head[8:9] != b"{":
        return False
    size = int.from_bytes(head[:8], "little")
    return 2 <= size <= path.stat().st_size - 8


def is_onnx(path: Path) -> bool:
    """Whether ``path`` reads as an ONNX ModelProto: ir_version first, then only ModelProto's own
    fields with their wire types, up to the end of the file (random bytes fail within a few bytes;
    a length-delimited field such as the graph is skipped by a seek)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        first = True
        while fh.tell() < size:
            tag = _varint(fh)
            if tag is None:
                return False
            field, wire = tag >> 3, tag & 7
            if _ONNX_FIELDS.get(field) != wire or (first and field != 1):
                return False
            value = _varint(fh)
            if value is None:
                return False
            if wire == 2:
                if fh.tell() + value > size:
                    return False
                fh.seek(value, io.SEEK_CUR)
            first = False
    return not first


def _varint(fh) -> Optional[int]:
    """A protobuf varint at ``fh``'s position, or None at the end of the file or past 10 bytes."""
    value = 0
    for shift in range(0, 70, 7):
        byte = fh.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
    return None


def unknown_format(path: Path) -> UserError:
    """Why ``path`` (of no format :func:`sniff` knows) is no checkpoint: what it starts with, and
    what it may be."""
    if path.stat().st_size == 0:
        return CorruptCheckpoint(f"checkpoint {path} is empty (0 bytes): a write that never finished, or the wrong file")
    if is_onnx(path):
        return UserError(f"checkpoint {path} is an ONNX model (segadv-export's output), not a checkpoint: "
                         f"segadv-predict --model {path} runs it")
    with open(path, "rb") as fh:
        head = fh.read(8)
    return CorruptCheckpoint(f"checkpoint {path} is truncated or corrupt, or of another format: it is neither "
                             f"torch.save's zip archive, a legacy torch pickle nor safetensors (it starts with {head!r})")


# ------------------------------------------------------------------------------ verifying


def verify(path: Path, kind: str) -> Integrity:
    """Check ``path`` (of format ``kind``) against the sha256 sealed in it, or, without one, a zip
    archive's CRC-32s. :class:`CorruptCheckpoint` naming the file when they do not match."""
    if kind in (TORCH_ZIP, TORCHSCRIPT, EXPORTED_PROGRAM):
        recorded = _zip_seal(path)
        if recorded is not None:
            size = path.stat().st_size
            _expect(path, recorded, _sha256(path, 0, size - _SEALED_TAIL), "the archive")
            return Integrity(recorded, "sha256 sealed in the file: matches")
        _check_crcs(path)
        return Integrity(None, "no sha256 sealed in the file (not written by segadv); zip CRC-32s: match")
    if kind == SAFETENSORS:
        size, meta = _safetensors_header(path)
        recorded = meta.get(SAFETENSORS_KEY) if isinstance(meta, dict) else None
        if isinstance(recorded, str):
            _expect(path, recorded, _sha256(path, 8 + size, path.stat().st_size), "its tensor data")
            return Integrity(recorded, "sha256 sealed in the file: matches")
        return Integrity(None, "no sha256 sealed in the file (not written by segadv)")
    return Integrity(None, "no sha256 sealed in the file (not written by segadv)")


def _expect(path: Path, recorded: str, actual: str, what: str) -> None:
    if actual != recorded:
        raise CorruptCheckpoint(
            f"checkpoint {path} is corrupt: the sha256 of {what} is {actual[:16]}..., not the {recorded[:16]}... "
            "recorded in the file when segadv wrote it (damaged on disk or in transfer): use another copy "
            "or an earlier checkpoint"
        )


def _zip_seal(path: Path) -> Optional[str]:
    size = path.stat().st_size
    if size < _SEALED_TAIL:
        return None
    with open(path, "rb") as fh:
        fh.seek(size - _SEALED_TAIL)
        tail = fh.read()
    comment_size = int.from_bytes(tail[_EOCD_SIZE - 2:_EOCD_SIZE], "little")
    if tail[:4] != _EOCD or comment_size != len(SEAL) + 64 or not tail[_EOCD_SIZE:].startswith(SEAL):
        return None
    return tail[_EOCD_SIZE + len(SEAL):].decode("ascii", "replace")


def _sha256(path: Path, start: int, end: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0 and (block := fh.read(min(_CHUNK, left))):
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def _check_crcs(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as err:
        raise CorruptCheckpoint(f"checkpoint {path} is corrupt: its zip archive does not read ({err})") from None
    if bad is not None:
        raise CorruptCheckpoint(f"checkpoint {path} is corrupt: {bad} in its zip archive fails its CRC-32 check "
                                "(damaged on disk or in transfer)")


def _safetensors_header(path: Path) -> tuple[int, object]:
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        text = fh.read(size)
    try:
        return size, json.loads(text).get("__metadata__")
    except (ValueError, AttributeError) as err:
        raise CorruptCheckpoint(f"checkpoint {path} is corrupt: its safetensors header does not read ({err})") from None
