"""Listing a data section and the cheap header scan of its files, before any file is decoded.

Listing looks at directory entries and list files only (``layouts.py``'s listers): each split of
a section is listed once, by the catalog (``catalog.py``), and the listing is handed on to the
scan. ``scan_headers`` opens every file's header (exists, readable, image and mask sizes agree).
Problems found either way follow ``data.on_error``: ``raise_problems`` names them all in one
error. The listers expect a section that passed ``config_checks.check_config``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

from segadv.config.schema import DataConfig
from segadv.data.config_checks import data_root
from segadv.data.files import LabelSpec, Listing, Problem, Sample, SampleError, check_sizes, probe_image, probe_mask, shown_id
from segadv.data.layouts import DISJOINT_SPLITS, LABEL_SPECS, LISTERS
from segadv.data.skips import SKIPPED_FILE
from segadv.data.splits import split_labeled
from segadv.errors import UserError

__all__ = ["Listed", "empty_split_message", "list_eval_split", "list_source", "list_target", "raise_problems",
           "scan_headers"]

_MAX_SHOWN = 10


@dataclass(frozen=True)
class Listed:
    """One data section as listed, before any file is opened: each split's samples and the
    training split cut into labeled and unlabeled (indices into its samples). A synthetic
    section is generated, not listed: ``root``, ``spec``, ``train`` and ``val`` are None and
    the cut indexes its ``data.synthetic.train_size`` samples."""

    cfg: DataConfig
    root: Optional[Path]
    spec: Optional[LabelSpec]
    train: Optional[Listing]
    val: Optional[Listing]
    labeled_idx: list[int]
    unlabeled_idx: list[int]
    problems: list[Problem] = field(default_factory=list)  # listing and the cut's (list files naming missing ids)
    split_record: dict = field(default_factory=dict)  # what RUN/data_split.json says of the cut
    shared: Optional[str] = None  # train and val share image files: the warning (a folder layout)

    @property
    def labeled(self) -> list[Sample]:
        return [self.train.samples[i] for i in self.labeled_idx]

    @property
    def unlabeled(self) -> list[Sample]:
        return [self.train.samples[i] for i in self.unlabeled_idx]


def _list(cfg: DataConfig, root: Path, split: str, name: str) -> Listing:
    """One split, its problems called ``name``'s."""
    listing = LISTERS[cfg.kind](cfg, root, split)
    if name != split:
        listing = replace(listing, split=name, problems=[replace(p, split=name) for p in listing.problems])
    return listing


def list_source(cfg: DataConfig) -> Listed:
    """The training data (``data``): both splits, train cut into labeled / unlabeled."""
    if cfg.kind == "synthetic":
        ids = [str(i) for i in range(cfg.synthetic.train_size)]
        labeled, unlabeled, problems, record = split_labeled(ids, cfg, None)
        return Listed(cfg, None, None, None, None, labeled, unlabeled, problems, {"kind": "synthetic", **record})
    root = data_root(cfg)
    train, val = _list(cfg, root, "train", "train"), _list(cfg, root, "val", "val")
    shared = shared_images(cfg.kind, train, val)
    labeled, unlabeled, split_problems, record = split_labeled([s.id for s in train.samples], cfg, root)
    return Listed(cfg, root, LABEL_SPECS[cfg.kind](cfg), train, val, labeled, unlabeled,
                  [*train.problems, *split_problems, *val.problems], {"kind": cfg.kind, "root": str(root), **record},
                  shared)


def list_target(cfg: DataConfig) -> Listed:
    """Domain adaptation's target (``target_data``): its train split as ``target``, every sample
    unlabeled (its mask is never read and may be absent), and its val split as ``target_val``.
    An error says it is the target's."""
    try:
        if cfg.kind == "synthetic":
            return Listed(cfg, None, None, None, None, [], list(range(cfg.synthetic.train_size)))
        root = data_root(cfg)
        train, val = _list(cfg, root, "train", "target"), _list(cfg, root, "val", "target_val")
    except UserError as err:
        raise UserError(f"target_data: {err}") from None
    return Listed(cfg, root, LABEL_SPECS[cfg.kind](cfg), train, val, [], list(range(len(train.samples))),
                  [*train.problems, *val.problems])


def list_eval_split(cfg: DataConfig, split: str = "val") -> Listing:
    """The split an evaluation scores, alone: ``val``, or ``test`` (``data.test``'s). The train
    split is not listed, except where a layout's splits are meant to be disjoint
    (``DISJOINT_SPLITS``): there a test split sharing an image with it is refused, as training
    refuses a val split that does (training never lists the test split)."""
    root = data_root(cfg)
    listing = _list(cfg, root, split, split)
    if split == "test" and cfg.kind in DISJOINT_SPLITS:
        shared_images(cfg.kind, _list(cfg, root, "train", "train"), listing)
    return listing


def shared_images(kind: str, train: Listing, scored: Listing) -> Optional[str]:
    """Image files listed in the train split and a scored one (val or test: its images trained
    on): a UserError for the layouts whose splits are meant to be disjoint (``DISJOINT_SPLITS``),
    else the warning to show."""
    scored_files = {os.path.realpath(s.image): s.id for s in scored.samples}
    shared = [s.id for s in train.samples if os.path.realpath(s.image) in scored_files]
    if not shared:
        return None
    shown = ", ".join(shown_id(i) for i in shared[:3]) + (", ..." if len(shared) > 3 else "")
    message = (f"the train split ({train.source}) and the {scored.split} split ({scored.source}) share {len(shared)} "
               f"image{'s' if len(shared) > 1 else ''} ({shown}): {scored.split} would score images the run trains on")
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
