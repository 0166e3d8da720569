"""segadv-predict's inputs: the images an ``--input`` names (a file, a folder, a glob), their
headers checked before any model loads, their pixels read as training reads them
(segadv/data/images.py). numpy and Pillow only: the ONNX path reads with it."""

from __future__ import annotations

import fnmatch
import functools
import glob
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from segadv.data.images import ImageProblem, open_image, read_rgb
from segadv.errors import UserError
from segadv.fsutil import list_dir

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
SHOWN = 10  # problems shown in one message


def find_images(spec: str) -> list[Path]:
    """The input images; broken symlinks are kept (and reported as unreadable), never left out."""
    path = Path(spec).expanduser()
    if path.is_file() or _broken_link(path):
        return [path]
    if path.is_dir():
        found = [p for p in list_dir(path, f"--input {spec}")
                 if (p.is_file() or _broken_link(p)) and p.suffix.lower() in IMAGE_SUFFIXES]
        if not found:
            raise UserError(f"--input {spec}: no image files in that folder ({', '.join(sorted(IMAGE_SUFFIXES))})")
        return found
    if glob.has_magic(spec):
        found = sorted(p for p in _glob(str(path)) if p.is_file() or _broken_link(p))
        if not found:
            _list_pattern_root(spec)  # a folder the pattern starts in that cannot be listed is named
            raise UserError(f"--input {spec}: no files match the pattern")
        return found
    raise UserError(f"--input {spec}: no such file or folder")


def _glob(pattern: str) -> list[Path]:
    """The paths ``pattern`` matches. ``**`` (any number of folders) is walked with each real
    folder entered once, so links to ``.`` or ``..`` are followed once instead of forever (Python's
    glob follows them again at every level); without ``**`` this is :func:`glob.glob`."""
    parts = Path(pattern).parts
    if "**" not in parts:
        return [Path(p) for p in glob.glob(pattern)]
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    wanted = parts[fixed:]
    found, seen = [], set()
    try:
        seen.add((root.stat().st_dev, root.stat().st_ino))
    except OSError:
        return []
    for folder, subfolders, files in os.walk(root, followlinks=True):
        entered = []
        for name in subfolders:
            try:
                info = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                entered.append(name)
        subfolders[:] = entered
        relative = Path(folder).relative_to(root).parts
        found += [Path(folder, name) for name in files if _matches(wanted, (*relative, name))]
    return found


def _matches(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Whether path ``parts`` match glob ``pattern`` parts, ``**`` standing for any number of
    parts; a wildcard never matches a hidden name (as glob)."""

    @functools.lru_cache(maxsize=None)
    def match(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(parts)
        if pattern[i] == "**":
            return match(i + 1, j) or (j < len(parts) and not parts[j].startswith(".") and match(i, j + 1))
        if j == len(parts) or (parts[j].startswith(".") and not pattern[i].startswith(".")):
            return False
        return fnmatch.fnmatchcase(parts[j], pattern[i]) and match(i + 1, j + 1)

    return match(0, 0)


def _list_pattern_root(spec: str) -> None:
    """List the folder a glob pattern starts in (its leading parts without wildcards): glob
    passes over folders it cannot read, so an empty match may hide one."""
    parts = Path(spec).expanduser().parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    if root.is_dir():
        list_dir(root, f"--input {spec}")


def _broken_link(path: Path) -> bool:
    return path.is_symlink() and not path.exists()


def read_image(path: Path) -> np.ndarray:
    """HxWx3 uint8 RGB as training reads it (segadv/data/images.py); UserError naming ``path``."""
    try:
        return read_rgb(path)
    except ImageProblem as err:
        raise UserError(f"cannot read image {path}: {err}") from None


def scan_inputs(images: Sequence[Path]) -> tuple[list[Path], list[str]]:
    """Open every input's header (no decoding): ``(readable, one message per unreadable one)``."""
    good, problems = [], []
    for path in images:
        try:
            with open_image(path):
                good.append(path)
        except ImageProblem as err:
            problems.append(f"cannot read image {path}: {err}")
    return good, problems


def unreadable_error(problems: Sequence[str], written: int = 0) -> UserError:
    lines = [f"  {p}" for p in problems[:SHOWN]] + ([f"  ... and {len(problems) - SHOWN} more"]
                                                    if len(problems) > SHOWN else [])
    done = f"; {written} mask(s) written before it" if written else ""
    head = problems[0] if len(problems) == 1 else f"{len(problems)} unreadable inputs:\n" + "\n".join(lines)
    return UserError(f"{head}{done} (--on-error skip segments the rest and lists them)")


def chunks(items: Sequence[Path], size: int) -> Iterator[Sequence[Path]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
