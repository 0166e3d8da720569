"""Dataset kinds on disk: where each kind keeps its images, masks and splits, and its classes.

Each kind provides ``label_spec(cfg)`` (its classes and how its mask files encode them) and
``list_split(cfg, root, split)`` (the samples of ``train``, ``val`` or ``test``, the split
``data.test`` names, as a :class:`Listing`).
Listing only looks at directory entries and list files; reading the files is left to the
dataset (and to the header scan of ``listing.py``). The layouts are documented in
docs/datasets.md.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np

from segadv.config.schema import DataConfig, FolderSplitConfig
from segadv.data.files import LabelSpec, Listing, Problem, Sample, display, read_id_list, shown_id
from segadv.errors import UserError
from segadv.fsutil import list_dir

# --------------------------------------------------------------------------------------- helpers


def resolve(root: Path, path: str) -> Path:
    """A path from the data section: relative ones are taken from ``data.root``."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else root / p


def _broken_link(split: str, path: Path) -> Problem:
    """An image entry that is a symlink to nothing: a problem, never silently left out."""
    return Problem(split, path.stem, (str(path),),
                   f"{display(path)}: image file is a broken symlink to {os.readlink(path)}, which does not exist")


def _files_by_stem(directory: Path, suffixes: set[str], key: str) -> tuple[dict[str, Path], dict[str, Path]]:
    """The files of ``directory`` with one of ``suffixes`` (any case: ``.PNG`` too) by stem, and
    the entries with such a name that are broken symlinks, by stem."""
    found: dict[str, Path] = {}
    broken: dict[str, Path] = {}
    for path in list_dir(directory, key):
        if path.suffix.lower() not in suffixes:
            continue
        if path.is_file():
            found.setdefault(path.stem, path)
        elif path.is_symlink():
            broken.setdefault(path.stem, path)
    return found, {i: p for i, p in broken.items() if i not in found}


def require_dir(path: Path, key: str, hint: str = "") -> None:
    """``path`` is a directory, or a UserError naming ``key`` says why not (missing, a file, or a
    folder above it that cannot be searched: not "does not exist" for a folder that may)."""
    try:
        if stat.S_ISDIR(path.stat().st_mode):
            return
        what = "is not a directory"
    except FileNotFoundError:
        what = "does not exist"
    except OSError as err:
        what = f"cannot be reached: {err.strerror or err}"
    raise UserError(f"{key}: {display(path)} {what}{hint}")


def _from_list(
    split: str, ids: Iterable[str], list_path: Path, image_of: Callable[[str], Optional[Path]],
    mask_of: Callable[[str, Path], Path], where: str,
) -> Listing:
    """Samples for the ids of a list file; an id without an image is a problem naming the list."""
    samples, problems = [], []
    for sample_id in ids:
        image = image_of(sample_id)
        if image is None or not image.is_file():
            expected = display(image) if image is not None else f"an image {shown_id(sample_id + '.*')} in {where}"
            broken = f" (a broken symlink to {os.readlink(image)})" if image is not None and image.is_symlink() else ""
            problems.append(Problem(
                split, sample_id, (str(list_path),),
                f"{display(list_path)} names id {shown_id(sample_id)}, but {expected} does not exist{broken}",
            ))
            continue
        samples.append(Sample(sample_id, image, mask_of(sample_id, image)))
    return Listing(split, samples, display(list_path), problems)


# --------------------------------------------------------------------------------------- VOC

VOC_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair",
    "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
    "train", "tvmonitor",
)
VOC_BOUNDARY = 255  # object outlines and difficult regions in the VOC masks


def voc_label_spec(cfg: DataConfig) -> LabelSpec:
    lut = None
    if cfg.ignore_index != VOC_BOUNDARY:
        lut = np.arange(256, dtype=np.uint8)
        lut[VOC_BOUNDARY] = cfg.ignore_index
    return LabelSpec(
        VOC_CLASSES, cfg.ignore_index, valid_below=len(VOC_CLASSES), raw_ignore=VOC_BOUNDARY,
        lut=lut, describe=f"VOC class ids 0..{len(VOC_CLASSES) - 1} or {VOC_BOUNDARY} (ignore)",
    )


def voc_root(root: Path) -> Path:
    """``data.root`` may be VOC2012 itself or a directory holding VOC2012 / VOCdevkit/VOC2012."""
    for candidate in (root, root / "VOC2012", root / "VOCdevkit" / "VOC2012"):
        if (candidate / "JPEGImages").is_dir():
            return candidate
    raise UserError(
        f"data.root: {display(root)} is not a VOC2012 directory (no JPEGImages/ in it, in "
        "VOC2012/ or in VOCdevkit/VOC2012/)"
    )


def voc_list_split(cfg: DataConfig, root: Path, split: str) -> Listing:
    root = voc_root(root)
    voc = cfg.voc
    if split == "train":
        name = voc.train_split or ("train_aug" if voc.augmented else "train")
        mask_dir = "SegmentationClassAug" if voc.augmented else "SegmentationClass"
        key = "data.voc.train_split" + (" (data.voc.augmented: SBD train_aug)" if voc.augmented else "")
    elif split == "val":
        name, mask_dir, key = voc.val_split, "SegmentationClass", "data.voc.val_split"
    else:
        name, mask_dir, key = cfg.test, "SegmentationClass", "data.test"
    list_path = root / "ImageSets" / "Segmentation" / f"{name}.txt"
    ids = read_id_list(list_path, key)
    return _from_list(
        split, ids, list_path,
        image_of=lambda i: root / "JPEGImages" / f"{i}.jpg",
        mask_of=lambda i, _: root / mask_dir / f"{i}.png",
        where="JPEGImages",
    )


# --------------------------------------------------------------------------------------- Cityscapes

# cityscapesScripts helpers/labels.py: (name, labelId, trainId); trainId 255 = not evaluated.
CITYSCAPES_LABELS = (
    ("unlabeled", 0, 255), ("ego vehicle", 1, 255), ("rectification border", 2, 255),
    ("out of roi", 3, 255), ("static", 4, 255), ("dynamic", 5, 255), ("ground", 6, 255),
    ("road", 7, 0), ("sidewalk", 8, 1), ("parking", 9, 255), ("rail track", 10, 255),
    ("building", 11, 2), ("wall", 12, 3), ("fence", 13, 4), ("guard rail", 14, 255),
    ("bridge", 15, 255), ("tunnel", 16, 255), ("pole", 17, 5), ("polegroup", 18, 255),
    ("traffic light", 19, 6), ("traffic sign", 20, 7), ("vegetation", 21, 8), ("terrain", 22, 9),
    ("sky", 23, 10), ("person", 24, 11), ("rider", 25, 12), ("car", 26, 13), ("truck", 27, 14),
    ("bus", 28, 15), ("caravan", 29, 255), ("trailer", 30, 255), ("train", 31, 16),
    ("motorcycle", 32, 17), ("bicycle", 33, 18),
    # ("license plate", -1, -1) never appears in a labelIds image.
)
CITYSCAPES_CLASSES = tuple(
    name.replace(" ", "_")
    for name, _, train_id in sorted(CITYSCAPES_LABELS, key=lambda t: t[2])
    if train_id != 255
)
_CITYSCAPES_MAX_ID = max(label_id for _, label_id, _ in CITYSCAPES_LABELS)


def cityscapes_lut(ignore_index: int) -> np.ndarray:
    """labelId -> trainId for all 256 byte values; everything but the 19 classes -> ignore."""
    lut = np.full(256, ignore_index, dtype=np.uint8)
    for _, label_id, train_id in CITYSCAPES_LABELS:
        if train_id != 255:
            lut[label_id] = train_id
    return lut


def cityscapes_label_spec(cfg: DataConfig) -> LabelSpec:
    # labelIds images only hold the official ids 0..33; anything else means the wrong files
    # (trainIds, instanceIds or colour masks) and is reported rather than silently ignored.
    return LabelSpec(
        CITYSCAPES_CLASSES, cfg.ignore_index, valid_below=_CITYSCAPES_MAX_ID + 1, raw_ignore=None,
        lut=cityscapes_lut(cfg.ignore_index),
        describe=f"Cityscapes labelIds 0..{_CITYSCAPES_MAX_ID} (expected *_gtFine_labelIds.png)",
    )


def gta5_label_spec(cfg: DataConfig) -> LabelSpec:
    # GTA5 labels use the Cityscapes labelIds; as in the usual GTA5 -> Cityscapes code, any value
    # outside the 19 mapped ids is ignored rather than an error.
    return LabelSpec(
        CITYSCAPES_CLASSES, cfg.ignore_index, valid_below=256, raw_ignore=None,
        lut=cityscapes_lut(cfg.ignore_index), describe="Cityscapes labelIds",
    )


_CS_IMAGE_SUFFIX = "_leftImg8bit.png"
_CS_MASK_SUFFIX = "_gtFine_labelIds.png"


def cityscapes_list_split(cfg: DataConfig, root: Path, split: str) -> Listing:
    if split == "test":
        name, key = cfg.test, "data.test"
    else:
        name, key = getattr(cfg.cityscapes, f"{split}_split"), f"data.cityscapes.{split}_split"
    require_dir(root / "leftImg8bit", "data.root", " (expected leftImg8bit/ and gtFine/ in it)")
    image_dir = root / "leftImg8bit" / name
    require_dir(image_dir, key)
    samples = []
    # Listed level by level (not globbed, which passes over a city folder it cannot read).
    cities = [city for city in list_dir(image_dir, key) if city.is_dir()]
    images = [p for city in cities for p in list_dir(city, key) if p.name.endswith(_CS_IMAGE_SUFFIX)]
    for image in sorted(images):
        sample_id = image.name[: -len(_CS_IMAGE_SUFFIX)]  # city_sequence_frame
        mask = root / "gtFine" / name / image.parent.name / f"{sample_id}{_CS_MASK_SUFFIX}"
        samples.append(Sample(sample_id, image, mask))
    return Listing(split, samples, f"{display(image_dir)}/*/*{_CS_IMAGE_SUFFIX}")


def gta5_list_split(cfg: DataConfig, root: Path, split: str) -> Listing:
    gta = cfg.gta5
    image_dir, label_dir = root / "images", root / "labels"
    require_dir(image_dir, "data.root", " (expected images/ and labels/ in it)")
    by_id, broken = _files_by_stem(image_dir, {".png"}, "data.root")
    labels = _files_by_stem(label_dir, {".png"}, "data.root")[0] if label_dir.is_dir() else {}
    mask_of = lambda i, _: labels.get(i, label_dir / f"{i}.png")  # noqa: E731 - .png or .PNG
    list_path, key = (cfg.test, "data.test") if split == "test" else (getattr(gta, f"{split}_list"),
                                                                       f"data.gta5.{split}_list")
    if list_path is not None:
        path = resolve(root, list_path)
        ids = read_id_list(path, key)
        image_of = lambda i: by_id.get(i) or broken.get(i, image_dir / f"{i}.png")  # noqa: E731
        return _from_list(split, ids, path, image_of, mask_of, "images")
    ids = sorted(by_id)
    held_out = ids[gta.val_every - 1 :: gta.val_every]
    if split == "val":
        chosen = held_out
        source = f"every {gta.val_every}th image of {display(image_dir)} (data.gta5.val_every)"
    else:
        val_ids = set(held_out)
        if gta.val_list is not None:
            val_ids = set(read_id_list(resolve(root, gta.val_list), "data.gta5.val_list"))
        chosen = [i for i in ids if i not in val_ids]
        source = f"{display(image_dir)} less the val images"
    # Broken image symlinks belong to no split by their place in the listing: train reports them.
    problems = [_broken_link(split, p) for p in broken.values()] if split == "train" else []
    return Listing(split, [Sample(i, by_id[i], mask_of(i, None)) for i in chosen], source, problems)


# --------------------------------------------------------------------------------------- folder


def folder_class_names(cfg: DataConfig) -> tuple[str, ...]:
    names = cfg.folder.class_names
    return tuple(names) if names is not None else tuple(f"class_{i}" for i in range(cfg.num_classes))


def folder_label_spec(cfg: DataConfig) -> LabelSpec:
    return LabelSpec(
        folder_class_names(cfg), cfg.ignore_index, valid_below=cfg.num_classes,
        raw_ignore=cfg.ignore_index, lut=None,
        describe=f"class ids 0..{cfg.num_classes - 1} or {cfg.ignore_index} (data.ignore_index)",
    )


def folder_split(cfg: DataConfig, split: str) -> tuple[FolderSplitConfig, str]:
    """A split's files and the key that names them: ``data.folder.<split>``, the test split's
    default (no ``data.folder.test``) ``<data.test>/images`` and ``<data.test>/masks``, named by
    ``data.test``."""
    if split != "test":
        return getattr(cfg.folder, split), f"data.folder.{split}"
    if cfg.folder.test is not None:
        return cfg.folder.test, "data.folder.test"
    return FolderSplitConfig(images=f"{cfg.test}/images", masks=f"{cfg.test}/masks"), "data.test"


def folder_list_split(cfg: DataConfig, root: Path, split: str) -> Listing:
    folder = cfg.folder
    split_cfg, key = folder_split(cfg, split)
    image_dir = resolve(root, split_cfg.images)
    mask_dir = resolve(root, split_cfg.masks)
    images_key = key if key == "data.test" else f"{key}.images"
    require_dir(image_dir, images_key)
    suffixes = {s.lower() if s.startswith(".") else f".{s.lower()}" for s in folder.image_suffixes}
    by_id: dict[str, list[Path]] = {}
    broken: dict[str, Path] = {}  # symlinks to nothing: problems, never silently left out
    for path in list_dir(image_dir, images_key):
        if path.suffix.lower() not in suffixes:
            continue
        if path.is_file():
            by_id.setdefault(path.stem, []).append(path)
        elif path.is_symlink():
            broken.setdefault(path.stem, path)
    mask_of = lambda i, _: mask_dir / f"{i}{folder.mask_suffix}"  # noqa: E731
    problems = [
        Problem(split, i, tuple(str(p) for p in paths),
                f"{len(paths)} images share the id {shown_id(i)}: {', '.join(display(p) for p in paths)}")
        for i, paths in by_id.items() if len(paths) > 1
    ]
    unique = {i: paths[0] for i, paths in by_id.items() if len(paths) == 1}
    if split_cfg.list_file is not None:
        list_path = resolve(root, split_cfg.list_file)
        ids = read_id_list(list_path, f"{key}.list_file")
        listing = _from_list(split, [i for i in ids if i not in by_id or i in unique], list_path,
                             lambda i: unique.get(i) or broken.get(i), mask_of, display(image_dir))
        listing.problems[:0] = [p for p in problems if p.id in ids]
        return listing
    problems += [_broken_link(split, path) for i, path in broken.items() if i not in by_id]
    samples = [Sample(i, path, mask_of(i, path)) for i, path in unique.items()]
    source = f"{display(image_dir)} ({', '.join(sorted(suffixes))})"
    return Listing(split, samples, source, problems)


# --------------------------------------------------------------------------------------- registry

LABEL_SPECS: dict[str, Callable[[DataConfig], LabelSpec]] = {
    "voc": voc_label_spec,
    "cityscapes": cityscapes_label_spec,
    "gta5": gta5_label_spec,
    "folder": folder_label_spec,
}
LISTERS: dict[str, Callable[[DataConfig, Path, str], Listing]] = {
    "voc": voc_list_split,
    "cityscapes": cityscapes_list_split,
    "gta5": gta5_list_split,
    "folder": folder_list_split,
}
# Classes fixed by the dataset: data.num_classes must match.
FIXED_CLASSES: dict[str, tuple[str, ...]] = {
    "voc": VOC_CLASSES,
    "cityscapes": CITYSCAPES_CLASSES,
    "gta5": CITYSCAPES_CLASSES,
}
# Layouts whose train and val splits are meant to be disjoint: a shared image is an error. GTA5 has
# no official split, so its lists (or the held-out val_every images) are the run's own split. VOC's
# and Cityscapes' named splits may overlap on purpose (trainval for a test-server submission), and
# a folder layout is the user's own choice (an overfitting check): a warning.
DISJOINT_SPLITS = frozenset({"gta5"})
