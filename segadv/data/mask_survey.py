"""The labeled training masks as a start of segadv-train sees them, before the run dir is made:
which hold no labelled pixel (every pixel ``data.ignore_index``), which hold only 0 and 255, and
which classes none holds. None labelled at all is a UserError naming them (there is nothing to
train G's segmentation loss on); some, a warning in the training log, with segadv-data check's
other mask warnings (``check.mask_warnings``: the same tests, the same words).

Masks are read as segadv-data check and training read them (``files.read_mask``, the kind's
``LabelSpec``), the mask alone, never its image. Decoding every mask at every start would cost
what segadv-data check costs (about 16 ms for a 2048x1024 Cityscapes mask, 1 ms for a VOC one,
on one core: 2975 Cityscapes masks 48 s, GTA5's 24,966 about 6.5 minutes), so the train ids each
mask holds are cached by the file's path, size and change times, one file per data root and
label mapping under ``$SEGADV_CACHE_DIR`` (default ``$XDG_CACHE_HOME/segadv``, else
``~/.cache/segadv``), ``masks/``: a later start decodes only the masks that changed. A cache that
cannot be read is rebuilt; one that cannot be written is gone without (the survey is then read in
full each start). A mask that cannot be read is left to ``data.on_error`` where training reads it.
Synthetic data is generated with every pixel a class: nothing to survey.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from segadv.data.check import NO_LABELS_SHOWN, holds_no_label, is_binary_255, mask_warnings, present_values
from segadv.data.files import LabelSpec, Sample, SampleError, display, read_mask
from segadv.data.listing import Listed
from segadv.errors import UserError
from segadv.fsutil import atomic_write_text

__all__ = ["CACHE_VARIABLE", "MaskSurvey", "cache_path", "survey_masks"]

log = logging.getLogger(__name__)

CACHE_VARIABLE = "SEGADV_CACHE_DIR"
CACHE_FORMAT = 1
READERS = min(8, os.cpu_count() or 1)  # decoding PNGs releases the GIL: threads read in parallel


@dataclass(frozen=True)
class MaskSurvey:
    """What the labeled training masks hold, each read (or taken from the cache) once."""

    names: tuple[str, ...]  # the class names
    ignore_index: int
    masks: int  # masks surveyed (those that could be read)
    present: np.ndarray  # (256,) masks holding each train id
    binary_255: int  # masks holding only 0 and 255
    no_labels: list[str] = field(default_factory=list)  # the ids of those with no labelled pixel
    decoded: int = 0  # masks decoded by this start (the others from the cache)
    seconds: float = 0.0

    def warnings(self) -> list[str]:
        """segadv-data check's warnings about the train split's masks, for the training log."""
        return mask_warnings("train", self.names, self.ignore_index, self.present, self.masks, self.binary_255,
                             self.no_labels)


def survey_masks(listed: Listed, readers: int = READERS) -> Optional[MaskSurvey]:
    """The labeled training masks of ``listed`` (None for synthetic data); a UserError naming them
    when none holds a labelled pixel."""
    if listed.cfg.kind == "synthetic" or not listed.labeled_idx:
        return None
    t0 = time.perf_counter()
    samples = listed.labeled
    path = cache_path(listed.root, listed.spec)
    cached = _load(path)
    stats = [_stat(sample.mask) for sample in samples]
    entries: dict[str, list] = {}
    values: list[Optional[list[int]]] = [None] * len(samples)
    todo = []
    for i, (sample, stat) in enumerate(zip(samples, stats)):
        if stat is None:
            continue  # missing: the start's header scan names it
        key = os.fspath(sample.mask)
        entry = cached.get(key)
        if entry is not None and entry[:-1] == list(stat):
            values[i], entries[key] = entry[-1], entry
        else:
            todo.append(i)
    with ThreadPoolExecutor(max_workers=max(1, readers)) as pool:
        for i, found in zip(todo, pool.map(lambda i: _read(samples[i], listed.spec), todo)):
            if found is not None:
                values[i] = found
                entries[os.fspath(samples[i].mask)] = [*stats[i], found]
    if todo and path is not None:
        _save(path, {**cached, **entries})
    survey = _summary(listed, samples, values, decoded=len(todo), seconds=time.perf_counter() - t0)
    log.info("data: surveyed %d labeled training masks in %.1f s: %d decoded, %d from the cache (%s)", survey.masks,
             survey.seconds, survey.decoded, len(samples) - len(todo), display(path) if path is not None else "none")
    if survey.masks and len(survey.no_labels) == survey.masks:
        raise UserError(_nothing_labelled(listed, samples, values))
    return survey


def _summary(listed: Listed, samples: Sequence[Sample], values: Sequence[Optional[list[int]]], *, decoded: int,
             seconds: float) -> MaskSurvey:
    spec = listed.spec
    present = np.zeros(256, dtype=np.int64)
    no_labels, binary, masks = [], 0, 0
    for sample, held in zip(samples, values):
        if held is None:
            continue
        masks += 1
        present[held] += 1
        binary += is_binary_255(held)
        if holds_no_label(held, spec.ignore_index):
            no_labels.append(sample.id)
    return MaskSurvey(spec.class_names, spec.ignore_index, masks, present, binary, no_labels, decoded, seconds)


def _nothing_labelled(listed: Listed, samples: Sequence[Sample], values: Sequence[Optional[list[int]]]) -> str:
    spec = listed.spec
    files = [display(s.mask) for s, held in zip(samples, values) if held is not None]
    shown = ", ".join(files[:NO_LABELS_SHOWN]) + (f" and {len(files) - NO_LABELS_SHOWN} more"
                                                   if len(files) > NO_LABELS_SHOWN else "")
    mapped = "" if spec.lut is None else f" after the {listed.cfg.kind} label mapping"
    which = ("the one labeled training mask holds no" if len(files) == 1
             else f"none of the {len(files)} labeled training masks holds a")
    return (f"data: {which} labelled pixel: every pixel is data.ignore_index ({spec.ignore_index}){mapped} in "
            f"{shown}, so G's segmentation loss has nothing to learn from. Masks hold {spec.describe}: check "
            "that these are the masks meant and data.ignore_index the value they leave unlabelled "
            "(`segadv-data check` counts each class's pixels)")


def _read(sample: Sample, spec: LabelSpec) -> Optional[list[int]]:
    """The train ids ``sample``'s mask holds; None where it cannot be read (training reports it)."""
    try:
        return present_values(spec.to_train_ids(read_mask(sample.mask), sample.mask))
    except SampleError:
        return None


def _stat(path: Path) -> Optional[tuple[int, int, int]]:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns  # ctime: a rewrite keeping mtime still shows


# ---------------------------------------------------------------------------- the cache


def cache_path(root: Path, spec: LabelSpec) -> Optional[Path]:
    """The cache file of the masks under ``root`` read through ``spec`` (None: no cache folder is known)."""
    base = os.environ.get(CACHE_VARIABLE)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        try:
            base = os.path.join(xdg, "segadv") if xdg else os.path.join(Path.home(), ".cache", "segadv")
        except RuntimeError:  # no home directory to be found
            return None
    lut = b"" if spec.lut is None else spec.lut.tobytes()
    key = hashlib.sha256(repr((CACHE_FORMAT, os.path.realpath(root), spec.ignore_index, spec.valid_below,
                               spec.raw_ignore)).encode() + lut).hexdigest()[:24]
    return Path(base) / "masks" / f"{key}.json"


def _load(path: Optional[Path]) -> dict[str, list]:
    """The cache's entries, ``{mask path: [size, mtime_ns, ctime_ns, [train ids]]}``; none where it
    is absent, unreadable or of another format."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or not isinstance(data.get("masks"), dict):
        return {}
    return {key: entry for key, entry in data["masks"].items() if _valid_entry(entry)}


def _valid_entry(entry: object) -> bool:
    return (isinstance(entry, list) and len(entry) == 4 and all(isinstance(v, int) for v in entry[:3])
            and isinstance(entry[3], list) and all(isinstance(v, int) and 0 <= v < 256 for v in entry[3]))


def _save(path: Path, entries: dict[str, list]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"format": CACHE_FORMAT, "masks": entries}, separators=(",", ":")))
    except (OSError, UserError) as err:  # the cache is a convenience: the start goes on without it
        log.debug("data: the mask survey's cache %s was not written: %s", path, err)
