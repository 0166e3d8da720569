"""Listing a file dataset and the cheap header scan of its files, before any file is decoded.

``collect`` lists both splits and splits train into labeled / unlabeled; ``scan_headers`` opens
every file's header (exists, readable, image and mask sizes agree). Problems found either way
follow ``data.on_error``: ``raise_problems`` names them all in one error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

from segadv.config.schema import DataConfig
from segadv.data.config_checks import check_config, data_root
from segadv.data.files import LabelSpec, Listing, Problem, Sample, SampleError, check_sizes, probe_image, probe_mask, shown_id
from segadv.data.layouts import DISJOINT_SPLITS, LABEL_SPECS, LISTERS
from segadv.data.skips import SKIPPED_FILE, SkipRecorder
from segadv.data.splits import split_labeled
from segadv.errors import UserError

__all__ = ["Collected", "checked_split", "collect", "empty_split_message", "raise_problems", "scan_headers"]

_MAX_SHOWN = 10


@dataclass
class Collected:
    """A file dataset as listed and split, before any file is opened."""

    kind: str
    root: Path
    spec: LabelSpec
    train: Listing
    val: Listing
    labeled: list[Sample]
    unlabeled: list[Sample]
    problems: list[Problem]  # from listing (list files naming missing ids, duplicate ids)
    split_record: dict
    shared: Optional[str] = None  # train and val share image files: the warning (a folder layout)


def collect(cfg: DataConfig) -> Collected:
    """List both splits of a file dataset and split train into labeled / unlabeled."""
    check_config(cfg)
    root = data_root(cfg)
    spec = LABEL_SPECS[cfg.kind](cfg)
    train = LISTERS[cfg.kind](cfg, root, "train")
    val = LISTERS[cfg.kind](cfg, root, "val")
    shared = shared_images(cfg.kind, train, val)
    labeled_idx, unlabeled_idx, split_problems, record = split_labeled(
        [s.id for s in train.samples], cfg, root
    )
    return Collected(
        cfg.kind, root, spec, train, val,
        labeled=[train.samples[i] for i in labeled_idx],
        unlabeled=[train.samples[i] for i in unlabeled_idx],
        problems=[*train.problems, *split_problems, *val.problems],
        split_record=record,
        shared=shared,
    )


def shared_images(kind: str, train: Listing, val: Listing) -> Optional[str]:
    """Image files listed in both splits (val images trained on): a UserError for the layouts
    whose splits are meant to be disjoint (``DISJOINT_SPLITS``), else the warning to show."""
    val_files = {os.path.realpath(s.image): s.id for s in val.samples}
    shared = [s.id for s in train.samples if os.path.realpath(s.image) in val_files]
    if not shared:
        return None
    shown = ", ".join(shown_id(i) for i in shared[:3]) + (", ..." if len(shared) > 3 else "")
    message = (f"the train split ({train.source}) and the val split ({val.source}) share {len(shared)} "
               f"image{'s' if len(shared) > 1 else ''} ({shown}): val would score images the run trains on")
    if kind in DISJOINT_SPLITS:
        raise UserError(f"data: {message}; take them out of one split")
    return message


def scan_headers(
    samples: Sequence[Sample], split: str, with_masks: bool
) -> tuple[list[Sample], list[Problem]]:
    """Open every file's header (no decoding): missing or unreadable files, colour masks and
    image / mask size mismatches. Returns ``(good samples, problems)``."""
    good, problems = [], []
    for sample in samples:
        try:
            size = probe_image(sample.image)
            if with_masks:
                check_sizes(size, probe_mask(sample.mask), sample)
        except SampleError as err:
            files = sample.files() if with_masks else (str(sample.image),)
            problems.append(Problem(split, sample.id, files, str(err)))
        else:
            good.append(sample)
    return good, problems


def raise_problems(problems: Sequence[Problem]) -> None:
    """One UserError naming every problem (the first few, with a count of the rest)."""
    hint = "data.on_error=skip drops bad samples; `segadv-data check` lists every problem"
    if len(problems) == 1:
        p = problems[0]
        raise UserError(f"{p.message} ({p.split} split; {hint})")
    lines = [f"  {p.split}: {p.message}" for p in problems[:_MAX_SHOWN]]
    if len(problems) > _MAX_SHOWN:
        lines.append(f"  ... and {len(problems) - _MAX_SHOWN} more")
    raise UserError(f"{len(problems)} bad samples ({hint}):\n" + "\n".join(lines))


def empty_split_message(split: str, listing_source: str, dropped: int) -> str:
    if dropped:
        return (f"the {split} split has no usable samples: all {dropped} were dropped as bad "
                f"(data.on_error=skip; see {SKIPPED_FILE} in the run dir)")
    return f"the {split} split is empty: no samples in {listing_source}"


def checked_split(
    cfg: DataConfig, split: str, with_masks: bool, skipped: Optional[SkipRecorder] = None,
    split_name: Optional[str] = None,
) -> list[Sample]:
    """One split of a file dataset, listed and header-checked on its own (the other split is not
    opened); bad samples follow ``data.on_error`` and are recorded in ``skipped`` (or only
    logged). ``split_name``: what the problems call the split (default ``split``)."""
    listing = LISTERS[cfg.kind](cfg, data_root(cfg), split)
    samples, bad = scan_headers(listing.samples, split, with_masks=with_masks)
    problems = [*listing.problems, *bad]
    if split_name is not None:
        problems = [replace(p, split=split_name) for p in problems]
    if problems and cfg.on_error == "raise":
        raise_problems(problems)
    (skipped if skipped is not None else SkipRecorder()).add(problems)
    if not samples:
        raise UserError(f"data: {empty_split_message(split_name or split, listing.source, len(bad))}")
    return samples
