"""Predicted masks as files: palette PNGs (pixel values are class ids, the palette the class
colours), overlays of a mask on its image, and the PNG text chunk that marks a file as written by a
segadv command (so a later run may replace it and nothing else). numpy and Pillow only:
segadv-predict's torch-free ONNX path writes with it, segadv-eval --show-dir too."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable

import numpy as np
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from segadv.data.images import ImageProblem, open_image
from segadv.fsutil import list_dir

MARK_KEY = "Software"  # the PNG text chunk's key; its value names the command that wrote the file
PREDICT = "segadv-predict"


def png_bytes(img: Image.Image, software: str = PREDICT) -> bytes:
    """PNG bytes carrying ``software``'s mark (so a later run of it may replace the file)."""
    info = PngInfo()
    info.add_text(MARK_KEY, software)
    buffer = io.BytesIO()
    img.save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()


def palette_png(labels: np.ndarray, palette: np.ndarray, software: str = PREDICT) -> bytes:
    img = Image.fromarray(labels.astype(np.uint8), mode="P")
    flat = np.zeros((256, 3), dtype=np.uint8)
    flat[: len(palette)] = palette
    img.putpalette(flat.reshape(-1).tolist())
    return png_bytes(img, software)


def overlay_png(image: np.ndarray, labels: np.ndarray, palette: np.ndarray, alpha: float,
                software: str = PREDICT) -> bytes:
    """The image with each pixel's class colour blended in at ``alpha``, except where that colour
    is black (the palette's class 0, background in VOC and the synthetic data): blending with
    black only darkens, so there the image keeps its own brightness."""
    colours = palette[labels]
    weight = np.where(colours.any(axis=-1, keepdims=True), np.float32(alpha), np.float32(0.0))
    blended = image.astype(np.float32) * (1.0 - weight) + colours.astype(np.float32) * weight
    return png_bytes(Image.fromarray(np.clip(blended + 0.5, 0, 255).astype(np.uint8)), software)


def written_by(path: Path, software: str) -> bool:
    """Whether ``path`` is a PNG carrying ``software``'s text chunk (read from its header)."""
    if path.suffix.lower() != ".png":
        return False
    try:
        with open_image(path) as img:
            return img.info.get(MARK_KEY) == software
    except ImageProblem:
        return False


def foreign_files(folders: Iterable[Path], software: str, what: str) -> list[Path]:
    """Files in ``folders`` that ``software`` did not write. Hidden files and subfolders are not
    looked at: nothing is ever written there. ``what``: the option naming the folder, for errors."""
    foreign = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in list_dir(folder, what):
            if not path.name.startswith(".") and not path.is_dir() and not written_by(path, software):
                foreign.append(path)
    return foreign
