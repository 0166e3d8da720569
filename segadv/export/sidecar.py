"""The JSON sidecar written next to an exported model, and reading it back.

Torch-free on purpose: ``segadv-predict --model file.onnx`` reads it without importing torch.

The sidecar is ``<export>.json`` (``model.onnx`` -> ``model.onnx.json``). The same metadata, less
the verification results, is also embedded in the export itself (ONNX ``metadata_props`` key
``segadv``; torch.export and TorchScript extra file ``segadv.json``), so a model file that travels
alone still carries its classes, palette and normalisation; segadv-predict reads the embedded copy
first, since it cannot go stale. The sidecar adds the verification numbers and the export's own
sha256.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from segadv.errors import UserError
from segadv.fsutil import atomic_write_text

FORMAT = "segadv-export"
FORMAT_VERSION = 2  # 2: normalization.channels (a BGR model's input); an RGB model is still written as 1
FORMAT_VERSION_RGB = 1
SIDECAR_SUFFIX = ".json"
EMBED_KEY = "segadv"  # ONNX metadata_props key
EMBED_FILE = "segadv.json"  # torch.export / TorchScript extra file

# What the model's input holds, and how a host prepares an RGB uint8 image for it.
INPUT_KINDS = {
    "normalized": "float, (pixel / 255 - mean) / std on normalization.channels, done by the caller",
    "uint8": "uint8 pixels 0..255, normalised inside the graph",
    "unit": "float pixels 0..1, normalised inside the graph",
}


def sidecar_path(model_path: str | Path) -> Path:
    model_path = Path(model_path)
    return model_path.with_name(model_path.name + SIDECAR_SUFFIX)


def to_json(meta: Mapping[str, Any]) -> str:
    return json.dumps(meta, indent=2, sort_keys=False) + "\n"


def write_sidecar(model_path: str | Path, meta: Mapping[str, Any]) -> Path:
    path = sidecar_path(model_path)
    atomic_write_text(path, to_json(meta))
    return path


def parse_metadata(text: str, where: str) -> dict[str, Any]:
    """Validate the parts of the metadata that inference relies on."""
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{where}: not segadv export metadata (no \"format\": \"{FORMAT}\")")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise UserError(
            f"{where}: metadata format version {meta['format_version']} is newer than this segadv "
            f"understands ({FORMAT_VERSION}); upgrade segadv"
        )
    missing = [k for k in ("classes", "palette", "normalization", "input", "output") if k not in meta]
    if missing:
        raise UserError(f"{where}: metadata lacks {', '.join(missing)}")
    kind = meta["input"].get("kind")
    if kind not in INPUT_KINDS:
        raise UserError(f"{where}: unknown input kind {kind!r} (known: {', '.join(INPUT_KINDS)})")
    if meta["output"].get("kind") not in ("logits", "class_ids"):
        raise UserError(f"{where}: unknown output kind {meta['output'].get('kind')!r}")
    return meta


def read_sidecar(model_path: str | Path) -> dict[str, Any] | None:
    """The sidecar next to ``model_path``, or None when there is none."""
    path = sidecar_path(model_path)
    if not path.is_file():
        return None
    return parse_metadata(path.read_text(encoding="utf-8"), str(path))


def prepare_input(pixels: "np.ndarray", kind: str, dtype: str, mean, std, channels: str = "RGB") -> "np.ndarray":
    """uint8 RGB images ``N x 3 x H x W`` in the form a model with this input ``kind`` takes;
    ``channels``: the order a normalized input is in (the sidecar's ``normalization.channels``;
    absent from a version 1 sidecar: RGB)."""
    import numpy as np

    if kind == "uint8":
        return np.ascontiguousarray(pixels, dtype=np.uint8)
    unit = pixels.astype(np.float32) / np.float32(255.0)
    if kind == "unit":
        return unit.astype(dtype, copy=False)
    if channels == "BGR":
        unit = unit[:, ::-1]
    m = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return ((unit - m) / s).astype(dtype, copy=False)
