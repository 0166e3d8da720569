"""Tiny datasets on disk in the real layouts, for the data tests (no download possible).

VOC masks are palette PNGs (mode P: pixel values are palette indices = class ids), SBD's
SegmentationClassAug masks single-channel PNGs; Cityscapes masks are ``*_gtFine_labelIds.png``
(mode L) next to the colour / instance files the loader must ignore; GTA5 labels are palette
PNGs whose indices are Cityscapes labelIds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

import numpy as np
from PIL import Image

from segadv.data.palette import palette

H, W = 24, 32  # not square, so a transposed read would show
PALETTE = palette(256).ravel().tolist()  # the VOC colour map


def image_for(k: int, h: int = H, w: int = W) -> np.ndarray:
    rng = np.random.default_rng(k)
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def save_image(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def save_mask(path: Path, mask: np.ndarray, mode: str = "L") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(np.ascontiguousarray(mask, dtype=np.uint8))  # mode L
    if mode == "P":  # same bytes, read as palette indices
        img = Image.frombytes("P", img.size, img.tobytes())
        img.putpalette(PALETTE)
    img.save(path)
    return path


def write_list(path: Path, lines: Iterable[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def stripes(values: list[int], h: int = H, w: int = W) -> np.ndarray:
    """A mask of vertical stripes, one per value, left to right."""
    cols = np.array_split(np.arange(w), len(values))
    mask = np.zeros((h, w), dtype=np.uint8)
    for value, c in zip(values, cols):
        mask[:, c] = value
    return mask


def voc_mask(k: int) -> np.ndarray:
    """Class 1 + k % 20 on the left, background on the right, a 255 boundary between."""
    return stripes([1 + k % 20, 255, 0, 0])


def make_voc(root: Path, train: list[str], val: list[str], aug: Optional[list[str]] = None) -> dict[str, np.ndarray]:
    """VOC2012 under ``root``; returns the mask of every id."""
    masks = {}
    for k, sample_id in enumerate(dict.fromkeys([*train, *val, *(aug or [])])):
        Image.fromarray(image_for(k)).save(_mk(root / "JPEGImages" / f"{sample_id}.jpg"), quality=95)
        masks[sample_id] = voc_mask(k)
        if sample_id in train or sample_id in val:
            save_mask(root / "SegmentationClass" / f"{sample_id}.png", masks[sample_id], "P")
        if aug is not None:
            save_mask(root / "SegmentationClassAug" / f"{sample_id}.png", masks[sample_id], "L")
    sets = root / "ImageSets" / "Segmentation"
    write_list(sets / "train.txt", train)
    write_list(sets / "val.txt", val)
    if aug is not None:  # the DeepLab release's two-column form
        write_list(sets / "train_aug.txt", [f"/JPEGImages/{i}.jpg /SegmentationClassAug/{i}.png" for i in aug])
    return masks


# Every Cityscapes labelId 0..33, as stripes.
CS_IDS = list(range(34))


def make_cityscapes(root: Path, split: str, cities: dict[str, int], h: int = H, w: int = 68) -> list[str]:
    ids = []
    for city, n in cities.items():
        for k in range(n):
            sample_id = f"{city}_{k:06d}_000019"
            ids.append(sample_id)
            save_image(root / "leftImg8bit" / split / city / f"{sample_id}_leftImg8bit.png", image_for(k, h, w))
            gt = root / "gtFine" / split / city
            save_mask(gt / f"{sample_id}_gtFine_labelIds.png", stripes(CS_IDS, h, w))
            # Files that sit next to the labelIds in the real release and must not be read.
            save_image(gt / f"{sample_id}_gtFine_color.png", image_for(99, h, w))
            save_mask(gt / f"{sample_id}_gtFine_instanceIds.png", np.full((h, w), 26, np.uint8))
            (gt / f"{sample_id}_gtFine_polygons.json").write_text("{}")
    return sorted(ids)


def make_gta5(root: Path, n: int, h: int = H, w: int = 68) -> list[str]:
    ids = [f"{k:05d}" for k in range(1, n + 1)]
    for k, sample_id in enumerate(ids):
        save_image(root / "images" / f"{sample_id}.png", image_for(k, h, w))
        save_mask(root / "labels" / f"{sample_id}.png", stripes(CS_IDS, h, w), "P")
    return ids


def make_folder(root: Path, n_train: int = 6, n_val: int = 3, num_classes: int = 3,
                h: int = H, w: int = W, n_test: int = 0) -> dict[str, list[str]]:
    """root/{train,val}/{images,masks} (and test/ with ``n_test``); masks hold class ids
    0..num_classes-1 and 255."""
    ids: dict[str, list[str]] = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        ids[split] = []
        first = 100 if split == "test" else 0  # test images and masks of their own (train's and val's share)
        for k in range(first, first + n):
            sample_id = f"{split}_{k - first:03d}"
            ids[split].append(sample_id)
            save_image(root / split / "images" / f"{sample_id}.png", image_for(k, h, w))
            values = [k % num_classes, (k + 1) % num_classes, 255, 0]
            save_mask(root / split / "masks" / f"{sample_id}.png", stripes(values, h, w))
    return ids


def _mk(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def declared_size_png(path: Path, width: int, height: int) -> Path:
    """A PNG of a few dozen bytes whose header declares ``width`` x ``height`` RGB pixels (as a
    huge aerial tile's does): enough for Pillow to size it, never decoded."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b""))
                     + chunk(b"IEND", b""))
    return path


def save_rotated(path: Path, upright: np.ndarray, orientation: int = 6) -> Path:
    """``upright`` stored as a phone does: the pixels turned (here for EXIF orientation 6, 90
    degrees counterclockwise) plus the tag that tells a viewer to turn them back."""
    assert orientation == 6
    exif = Image.Exif()
    exif[0x0112] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(np.rot90(upright, 1))).save(path, exif=exif.tobytes())
    return path
