"""Reading datasets from disk: samples, list files, images, masks, and what can go wrong with them.

Every problem with one sample (a missing or unreadable file, a mask whose size differs from its
image, mask values that are not class ids) is a :class:`SampleError` whose message names the
file(s) and the problem. ``data.on_error`` decides what happens to it (``bundle.py``).

Masks are read as 8-bit class ids: palette (mode ``P``) PNGs give their palette *indices* (the
class ids, as in PASCAL VOC and GTA5), single-channel PNGs their values. A colour (RGB) mask is an
error: its colours are not class ids.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from PIL import Image

from segadv.errors import UserError
from segadv.data.images import ImageProblem, decode, deep_mode, open_image, orientation, to_rgb, upright, upright_size

__all__ = [
    "LabelSpec",
    "absent_classes_note",
    "Listing",
    "Problem",
    "Sample",
    "SampleError",
    "check_sizes",
    "display",
    "image_note",
    "probe_image",
    "probe_mask",
    "read_id_list",
    "shown_id",
    "read_image",
    "read_mask",
]

# Mask modes whose pixel values are class ids (``P``: palette indices).
_ID_MODES = {"P", "L", "1", "I", "I;16", "I;16L", "I;16B", "I;16N"}
_MAX_LISTED_VALUES = 8


class SampleError(UserError):
    """One sample cannot be used; the message names the file(s) and the problem."""


@dataclass(frozen=True)
class Sample:
    """One image and, for labeled samples, its mask."""

    id: str
    image: Path
    mask: Optional[Path]

    def files(self) -> tuple[str, ...]:
        return tuple(str(p) for p in (self.image, self.mask) if p is not None)


@dataclass(frozen=True)
class Problem:
    """A sample (or list entry) that cannot be used, and why."""

    split: str
    id: str
    files: tuple[str, ...]
    message: str

    def as_dict(self) -> dict:
        return {"split": self.split, "id": self.id, "files": list(self.files), "problem": self.message}


@dataclass
class Listing:
    """The samples of one split as found on disk, and the problems found while listing them.

    ``source`` says where the split came from ("ImageSets/Segmentation/val.txt") for messages.
    """

    split: str
    samples: list[Sample]
    source: str
    problems: list[Problem] = field(default_factory=list)

    @functools.cached_property
    def image_sizes(self) -> dict[tuple[int, int], list[str]]:
        """Each upright ``(height, width)`` among the samples' images, from their headers (nothing
        decoded), -> the ids of its samples in listing order; read once. An image that cannot be
        read is left out: the header scan names it."""
        sizes: dict[tuple[int, int], list[str]] = {}
        for sample in self.samples:
            try:
                size = probe_image(sample.image)
            except SampleError:
                continue
            sizes.setdefault(tuple(size), []).append(sample.id)
        return sizes


def display(path: os.PathLike | str) -> str:
    """A path as the user most likely knows it: relative to the cwd when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # different drive on Windows
        return str(path)
    return str(path) if rel.startswith("..") else rel


# --------------------------------------------------------------------------------------- labels


@dataclass(frozen=True)
class LabelSpec:
    """How a kind's mask files encode classes.

    A raw mask value ``v`` is valid when ``v < valid_below`` or ``v == raw_ignore``; ``lut`` (256
    entries, uint8) then maps raw values to train ids, ``ignore_index`` marking ignored pixels.
    ``lut`` None means raw values are train ids already.
    """

    class_names: tuple[str, ...]
    ignore_index: int
    valid_below: int
    raw_ignore: Optional[int]
    lut: Optional[np.ndarray]
    describe: str  # what valid raw values are, for messages: "class ids 0..20 or 255 (ignore)"

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def to_train_ids(self, raw: np.ndarray, path: Path) -> np.ndarray:
        """Check raw mask values and map them to train ids; SampleError naming ``path`` if bad."""
        if self.valid_below < 256 and int(raw.max()) >= self.valid_below:
            bad = raw >= self.valid_below
            if self.raw_ignore is not None:
                bad &= raw != self.raw_ignore
            count = int(np.count_nonzero(bad))
            if count:
                values = np.unique(raw[bad]).tolist()
                shown = ", ".join(str(v) for v in values[:_MAX_LISTED_VALUES])
                more = f", ... ({len(values)} distinct)" if len(values) > _MAX_LISTED_VALUES else ""
                raise SampleError(
                    f"{display(path)}: mask values [{shown}{more}] in {count} pixels are not "
                    f"{self.describe}"
                )
        return raw if self.lut is None else self.lut[raw]


def absent_classes_note(names: Sequence[str], absent: Sequence[int], ignore_index: int, split: str,
                        holds_255: bool = True) -> Optional[str]:
    """What it means that classes ``absent`` have no mask pixel in ``split`` (None if none is
    absent): G never learns them (train), mIoU cannot measure them (val). With two classes and 255
    ignored, masks saved as 0/255 are the likely cause: every object pixel is then ignore; said
    only where a mask holds 255 (``holds_255``: False where the caller counted none)."""
    if not absent:
        return None
    it = "it" if len(absent) == 1 else "them"
    effect = f"training never shows {it} to G" if split == "train" else \
        f"mIoU cannot measure {it} (IoU 0 where predicted, left out where not)"
    note = f"no {split} mask pixels of {', '.join(names[i] for i in absent)}: {effect}"
    if len(names) == 2 and ignore_index == 255 and 1 in absent and holds_255:
        note += ("; binary masks saved as 0/255? 255 is data.ignore_index, so every object pixel is ignored: "
                 "save objects as 1")
    return note


# --------------------------------------------------------------------------------------- list files


_IMAGE_PATH = re.compile(r"([/\\]|\.(jpe?g|png|bmp|tiff?|webp)$)", re.I)


def read_id_list(path: Path, what: str) -> list[str]:
    """Ids from a list file: one per line, the whole line (an id may hold spaces or ``#``); blank
    lines and lines starting with ``#`` are skipped, a UTF-8 byte-order mark is dropped.

    A line may also be a path or a pair of paths (``/JPEGImages/x.jpg /SegmentationClassAug/x.png``,
    as in some ``train_aug.txt`` releases): the id is the (first) path's file stem. Duplicates are
    dropped, first occurrence kept. ``what`` names the config key for messages.
    """
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"{what}: list file {display(path)} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{what}: cannot read list file {display(path)}: {err}") from None
    ids: dict[str, None] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if _IMAGE_PATH.search(line):
            first = line.split()[0]
            path_text = first if _IMAGE_PATH.search(first) else line  # two paths, or one holding spaces
            line = Path(path_text.replace("\\", "/")).stem
        ids.setdefault(line, None)
    return list(ids)


def shown_id(sample_id: str) -> str:
    """An id quoted for messages; invisible or control characters spelt out (``'\\ufeffx'``)."""
    return f"'{sample_id}'" if sample_id.isprintable() else ascii(sample_id)


# --------------------------------------------------------------------------------------- images


def _problem(path: Path, what: str, err: ImageProblem) -> SampleError:
    if err.missing:
        detail = "" if str(err) == "does not exist" else f" ({err})"
        return SampleError(f"{display(path)}: {what} file is missing{detail}")
    return SampleError(f"{display(path)}: cannot read {what}: {err}")


def _open(path: Path, what: str) -> Image.Image:
    """The file's header, every failure a SampleError naming ``path``."""
    try:
        return open_image(path)
    except ImageProblem as err:
        raise _problem(path, what, err) from None


def _decoded(img: Image.Image, path: Path, what: str) -> np.ndarray:
    """The pixel array of ``img`` (decoded now), upright (its EXIF orientation applied)."""
    try:
        turn = orientation(img)
        decode(img)
        pixels = to_rgb(img) if what == "image" else np.array(img)
    except ImageProblem as err:
        raise _problem(path, what, err) from None
    return upright(pixels, turn)


def _check_mask_mode(img: Image.Image, path: Path) -> None:
    if img.mode not in _ID_MODES:
        bands = len(img.getbands())
        raise SampleError(
            f"{display(path)}: mask is a {img.mode} image ({bands} channels); expected a "
            "single-channel or palette PNG of class ids"
        )


def probe_image(path: Path) -> tuple[int, int]:
    """Upright ``(height, width)`` from the file header, without decoding; SampleError if unreadable."""
    with _open(path, "image") as img:
        return upright_size(img)


def probe_mask(path: Path) -> tuple[int, int]:
    """Upright ``(height, width)`` of a mask from its header; SampleError if unreadable or a colour mask."""
    with _open(path, "mask") as img:
        _check_mask_mode(img, path)
        return upright_size(img)


def image_note(path: Path) -> Optional[str]:
    """What reading the image does to its pixels beyond an 8-bit read (16-bit scaled), from its header."""
    with _open(path, "image") as img:
        return deep_mode(img)


def read_image(path: Path) -> np.ndarray:
    """HxWx3 uint8 RGB, upright (segadv/data/images.py); SampleError naming ``path`` if missing,
    unreadable or corrupt."""
    with _open(path, "image") as img:
        return _decoded(img, path, "image")


def read_mask(path: Path) -> np.ndarray:
    """HxW uint8 raw mask values (palette indices for mode P), upright; SampleError if unusable."""
    with _open(path, "mask") as img:
        _check_mask_mode(img, path)
        arr = _decoded(img, path, "mask")
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == bool:
        return arr.astype(np.uint8)
    hi = int(arr.max()) if arr.size else 0
    if hi > 255 or int(arr.min()) < 0:
        values = np.unique(arr[(arr > 255) | (arr < 0)]).tolist()[:_MAX_LISTED_VALUES]
        raise SampleError(f"{display(path)}: mask values {values} do not fit 8-bit class ids")
    return arr.astype(np.uint8)


def check_sizes(image_hw: Sequence[int], mask_hw: Sequence[int], sample: Sample) -> None:
    if tuple(image_hw) != tuple(mask_hw):
        raise SampleError(
            f"{display(sample.image)} is {image_hw[1]}x{image_hw[0]} (WxH) but its mask "
            f"{display(sample.mask)} is {mask_hw[1]}x{mask_hw[0]}"
        )
