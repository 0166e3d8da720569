"""Reading an image file the one way every command does (train, eval, check, predict).

- **Orientation**: the EXIF orientation tag is applied, so pixels are used as an image viewer (and
  a labelling tool) shows them: a phone photo stored sideways with ``Orientation: 6`` is read
  upright, and the size a header scan reports is that upright size. The tag is taken from what the
  file's header holds (JPEG, TIFF, WebP, a PNG ``eXIf`` chunk before the pixel data), so the
  cheap header scan and the full read always agree. Masks follow the same rule.
- **Bit depth**: 16-bit grayscale (``I;16``) is scaled to 8 bits (value / 257, rounded) rather
  than clipped to white; 32-bit integer or float pixels (``I``, ``F``), whose range cannot be
  known, are refused with a message.
- **Size**: an image over Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``,
  about 179 Mpx at twice the limit) is an unreadable image like any other, named with its path.

Torch-free on purpose: ``segadv-predict --model file.onnx`` reads images without importing torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image, UnidentifiedImageError
from PIL.PngImagePlugin import PngImageFile

__all__ = [
    "ImageProblem",
    "decode",
    "deep_mode",
    "open_image",
    "orientation",
    "read_rgb",
    "to_rgb",
    "upright",
    "upright_size",
]

EXIF_ORIENTATION = 0x0112
# EXIF orientation -> what makes an H x W (x C) pixel array upright (as ImageOps.exif_transpose).
_UPRIGHT = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].swapaxes(0, 1),
    8: lambda a: np.rot90(a, 1),
}
_SIDEWAYS = (5, 6, 7, 8)
# Modes with more than 8 bits a channel, read scaled to 8 bits (``segadv-data check`` notes them).
_DEEP = "16-bit grayscale"
_RANGELESS_MODES = {"I": "32-bit integer", "F": "32-bit float"}


class ImageProblem(Exception):
    """Why an image file cannot be used (the message does not name the file: callers do).
    ``missing``: the file (or the target of its symlink) does not exist."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def open_image(path: Path) -> Image.Image:
    """``Image.open`` (header only), every failure an :class:`ImageProblem`."""
    try:
        return Image.open(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise ImageProblem(f"broken symlink to {os.readlink(path)}, which does not exist", missing=True) from None
        raise ImageProblem("does not exist", missing=True) from None
    except UnidentifiedImageError:
        raise ImageProblem("not an image file PIL can identify") from None
    except Image.DecompressionBombError as err:
        raise ImageProblem(
            f"{err} (Pillow's guard, PIL.Image.MAX_IMAGE_PIXELS): split it into tiles or downscale it"
        ) from None
    except (OSError, ValueError, SyntaxError) as err:
        raise ImageProblem(err.strerror if isinstance(err, OSError) and err.strerror else str(err)) from None


def orientation(img: Image.Image) -> int:
    """The EXIF orientation (1..8, 1 = upright) the file's header holds, without decoding pixels."""
    if isinstance(img, PngImageFile) and "exif" not in img.info:
        return 1  # Pillow would decode the whole PNG to look for a trailing eXIf chunk
    try:
        value = img.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - a malformed EXIF block: the pixels are still readable
        return 1
    return value if isinstance(value, int) and value in _UPRIGHT else 1


def upright_size(img: Image.Image) -> tuple[int, int]:
    """``(height, width)`` of the image as it is read: after its EXIF orientation."""
    if orientation(img) in _SIDEWAYS:
        return img.width, img.height
    return img.height, img.width


def decode(img: Image.Image) -> None:
    """Decode the pixel data; truncated or corrupt data is an :class:`ImageProblem`."""
    try:
        img.load()
    except (OSError, ValueError, SyntaxError, EOFError) as err:
        raise ImageProblem(str(err) or type(err).__name__) from None


def upright(pixels: np.ndarray, turn: int) -> np.ndarray:
    """An H x W (x C) array turned upright for EXIF orientation ``turn`` (contiguous)."""
    step = _UPRIGHT.get(turn)
    return pixels if step is None else np.ascontiguousarray(step(pixels))


def deep_mode(img: Image.Image) -> Optional[str]:
    """What the image's pixels are when they have more than 8 bits a channel that segadv scales
    to 8 (16-bit grayscale; a PNG's 32-bit ``I`` mode, which older Pillows give 16-bit PNGs)."""
    if img.mode.startswith("I;16") or (img.mode == "I" and img.format == "PNG"):
        return f"{_DEEP} (mode {img.mode}), read scaled to 8 bits (value / 257)"
    return None


def to_rgb(img: Image.Image) -> np.ndarray:
    """HxWx3 uint8 RGB of a decoded image: 16-bit grayscale scaled to 8 bits, 32-bit pixels of
    unknown range refused."""
    if deep_mode(img) is not None:
        gray = np.rint(np.asarray(img, dtype=np.float32) / 257.0).clip(0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if img.mode in _RANGELESS_MODES:
        raise ImageProblem(
            f"{_RANGELESS_MODES[img.mode]} pixels (mode {img.mode}) have no known range: save it as 8-bit "
            "RGB or grayscale, or 16-bit grayscale"
        )
    return np.array(img if img.mode == "RGB" else img.convert("RGB"))


def read_rgb(path: Path) -> np.ndarray:
    """HxWx3 uint8 RGB, upright; an :class:`ImageProblem` if the file is unusable."""
    with open_image(path) as img:
        turn = orientation(img)
        decode(img)
        return upright(to_rgb(img), turn)
