"""segadv-data check's scan: every image and every labeled mask of a data section read in full
(the checks training applies), counted per split, with a class pixel histogram, the problems
found and the warnings about what reads without error but may not be what was meant."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Collection, Iterable, Optional, Sequence

import numpy as np

from segadv.config.schema import DataConfig
from segadv.data.files import (Problem, Sample, SampleError, absent_classes_note, display, image_note, read_image,
                               shown_id)
from segadv.data.splits import split_labeled

# The readers that import torch (datasets, listings) are imported where the check runs:
# segadv-data's --help answers without them.


@dataclass
class SplitReport:
    name: str
    labeled: int = 0
    unlabeled: Optional[int] = None  # None: not applicable (val)
    hist: np.ndarray = field(default_factory=lambda: np.zeros(256, dtype=np.int64))
    heights: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    masks: int = 0  # masks read
    binary_255: int = 0  # masks holding only 0 and 255 (with two classes: likely binary masks saved as 0/255)
    no_labels: list[str] = field(default_factory=list)  # ids of the masks whose every pixel is ignored
    image_notes: dict[str, int] = field(default_factory=dict)  # what reading did to pixels -> images

    def add_image(self, shape: tuple[int, ...]) -> None:
        self.heights.append(int(shape[0]))
        self.widths.append(int(shape[1]))


@dataclass
class Report:
    title: str
    names: list[str]
    ignore_index: int
    splits: list[SplitReport]
    notes: list[str] = field(default_factory=list)  # dataset-wide warnings (train and val sharing images)

    @property
    def problems(self) -> list[Problem]:
        return [p for s in self.splits for p in s.problems]

    def warnings(self) -> list[str]:
        """What reads without error but may not be what was meant, per split."""
        found = list(self.notes)
        for s in self.splits:
            found.extend(mask_warnings(s.name, self.names, self.ignore_index, s.hist, s.masks, s.binary_255,
                                       s.no_labels))
            for note, count in sorted(s.image_notes.items()):
                found.append(f"{s.name}: {count} image{'s are' if count > 1 else ' is'} {note}")
        return found


# ---------------------------------------------------------------------------- one mask, a split's masks
# What segadv-data check says of the masks it reads, and segadv-train's start of the labeled
# training masks (segadv/data/mask_survey.py): the same tests, the same words.

NO_LABELS_SHOWN = 5  # the masks with no labelled pixel a warning or an error names


def present_values(mask: np.ndarray) -> list[int]:
    """The train ids a (H,W) uint8 mask holds, ascending."""
    return np.flatnonzero(np.bincount(mask.ravel(), minlength=256)).tolist()


def holds_no_label(values: Collection[int], ignore_index: int) -> bool:
    """Whether a mask holding ``values`` has no labelled pixel: every pixel ignored, nothing to learn or score."""
    return all(v == ignore_index for v in values)


def is_binary_255(values: Collection[int]) -> bool:
    """Whether a mask holding ``values`` holds only 0 and 255 (a binary mask saved with 255 for the object?)."""
    return set(values) == {0, 255}


def mask_warnings(split: str, names: Sequence[str], ignore_index: int, present: np.ndarray, masks: int,
                  binary_255: int, no_labels: Sequence[str]) -> list[str]:
    """What a split's ``masks`` masks show that is likely not what was meant: ``present`` (256,)
    counts (pixels or masks) of each train id over them, ``binary_255`` of them holding only 0 and
    255, ``no_labels`` the ids of those with no labelled pixel."""
    found = []
    absent = [i for i in range(len(names)) if present[i] == 0]
    # With no class-1 pixel at all, the absent-class note below gives the same hint.
    if binary_255 and len(names) == 2 and ignore_index == 255 and 1 not in absent:
        found.append(f"{split}: {binary_255} mask{'s hold' if binary_255 > 1 else ' holds'} only 0 and "
                     "255 with 2 classes: 255 is data.ignore_index, so every object pixel is ignored "
                     "(binary masks saved as 0/255? save objects as 1)")
    if no_labels:
        shown = ", ".join(shown_id(i) for i in no_labels[:NO_LABELS_SHOWN])
        more = f" and {len(no_labels) - NO_LABELS_SHOWN} more" if len(no_labels) > NO_LABELS_SHOWN else ""
        effect = ("they teach G nothing (a batch of only such crops is counted in train/empty/<loss>)"
                  if split == "train" else "they add nothing to the scores")
        hold = "holds" if len(no_labels) == 1 else "hold"
        found.append(f"{split}: {len(no_labels)} of {masks} masks {hold} no labelled pixel (every pixel is "
                     f"data.ignore_index {ignore_index}): {shown}{more}; {effect}")
    if present.sum() > 0 and absent:
        # the 0/255 hint only where a mask holds 255: val masks all 0 are another story
        found.append(absent_classes_note(names, absent, ignore_index, split, holds_255=bool(present[255])))
    return found


def _scan(samples: list[Sample], split: str, labeled: bool, spec, report: SplitReport, workers: int) -> None:
    from segadv.data.dataset import load_pair

    def one(sample: Sample):
        try:
            note = image_note(sample.image)
            if labeled:
                image, mask = load_pair(sample, spec)
                return image.shape, np.bincount(mask.ravel(), minlength=256), note, None
            return read_image(sample.image).shape, None, note, None
        except SampleError as err:
            files = sample.files() if labeled else (str(sample.image),)
            return None, None, None, Problem(split, sample.id, files, str(err))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for sample, (shape, hist, note, problem) in zip(samples, pool.map(one, samples)):
            if problem is not None:
                report.problems.append(problem)
                continue
            report.add_image(shape)
            if note is not None:
                report.image_notes[note] = report.image_notes.get(note, 0) + 1
            if hist is not None:
                report.hist += hist
                report.masks += 1
                values = np.flatnonzero(hist).tolist()
                report.binary_255 += is_binary_255(values)
                if holds_no_label(values, spec.ignore_index):
                    report.no_labels.append(sample.id)


def check_files(cfg: DataConfig, workers: int) -> Report:
    """Every file of a checked section (``check_config``), each split listed once: train, val and,
    where ``data.test`` names one, the test split (sharing an image with train: as val)."""
    from segadv.data.config_checks import class_names
    from segadv.data.listing import empty_split_message, list_eval_split, list_source, shared_images

    found = list_source(cfg)
    test = list_eval_split(cfg, "test") if cfg.test is not None else None
    train = SplitReport("train", labeled=len(found.labeled), unlabeled=len(found.unlabeled))
    scored = [(SplitReport("val", labeled=len(found.val.samples)), found.val)]
    if test is not None:
        scored.append((SplitReport("test", labeled=len(test.samples), problems=list(test.problems)), test))
    for p in found.problems:
        (scored[0][0] if p.split == "val" else train).problems.append(p)
    _scan(found.labeled, "train", True, found.spec, train, workers)
    _scan(found.unlabeled, "unlabeled", False, found.spec, train, workers)
    for report, listing in scored:
        _scan(listing.samples, report.name, True, found.spec, report, workers)
    for report, listing, labeled in ((train, found.train, found.labeled),
                                     *((report, listing, listing.samples) for report, listing in scored)):
        if not labeled:
            report.problems.append(Problem(report.name, "", (), empty_split_message(report.name, listing.source, 0)))
    notes = [found.shared] if found.shared else []
    if test is not None and (shared := shared_images(cfg.kind, found.train, test)):
        notes.append(shared)
    title = f"{cfg.kind} at {display(found.root)}"
    return Report(title, class_names(cfg), cfg.ignore_index, [train, *(report for report, _ in scored)], notes)


def check_synthetic(cfg: DataConfig) -> Report:
    from segadv.data.config_checks import class_names
    from segadv.data.synthetic import SyntheticShapes

    syn = cfg.synthetic
    train_ds = SyntheticShapes("train", syn.train_size, syn.image_size, cfg.num_classes, syn.seed)
    scored = [("val", SyntheticShapes("val", syn.val_size, syn.image_size, cfg.num_classes, syn.seed))]
    if cfg.test is not None:  # generated as the split data.test names
        scored.append(("test", SyntheticShapes(cfg.test, syn.test_size, syn.image_size, cfg.num_classes, syn.seed)))
    labeled, unlabeled, problems, _ = split_labeled([str(i) for i in range(len(train_ds))], cfg, None)
    train = SplitReport("train", labeled=len(labeled), unlabeled=len(unlabeled), problems=problems)
    reports = [(SplitReport(name, labeled=len(ds)), ds, range(len(ds))) for name, ds in scored]
    for report, ds, indices in ((train, train_ds, labeled), *reports):
        for i in indices:
            image, mask = ds.raw(i)
            report.add_image(image.shape)
            report.hist += np.bincount(mask.ravel(), minlength=256)
    for _ in unlabeled:  # generated images are all image_size square; no need to draw them
        train.add_image((syn.image_size, syn.image_size))
    title = f"synthetic shapes ({syn.image_size}px, seed {syn.seed})"
    return Report(title, class_names(cfg), cfg.ignore_index, [train, *(report for report, _, _ in reports)])


def _range(values: list[int]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}..{hi}"


def format_report(report: Report) -> Iterable[str]:
    n = len(report.names)
    yield f"dataset: {report.title}; {n} classes, ignore index {report.ignore_index}"
    yield ""
    yield f"{'split':<8}{'labeled':>10}{'unlabeled':>11}{'problems':>10}"
    for s in report.splits:
        unl = "-" if s.unlabeled is None else str(s.unlabeled)
        yield f"{s.name:<8}{s.labeled:>10}{unl:>11}{len(s.problems):>10}"
    yield ""
    yield "image sizes (read in full):"
    for s in report.splits:
        count = len(s.widths)
        yield (f"  {s.name:<6} {count} image{'' if count == 1 else 's'}, width {_range(s.widths)}, "
               f"height {_range(s.heights)}")
    yield ""
    yield "class pixels (labeled samples):"
    header = f"  {'id':>4}  {'class':<16}" + "".join(f"{s.name:>22}" for s in report.splits)
    yield header
    totals = [max(int(s.hist.sum()), 1) for s in report.splits]
    num_classes = len(report.names)
    rows = [(i, report.names[i]) for i in range(num_classes)]
    ignore = report.ignore_index
    if 0 <= ignore < 256:
        rows.append((ignore, "(ignore)"))
    for class_id, name in rows:
        cells = "".join(
            f"{int(s.hist[class_id]):>14} {100.0 * s.hist[class_id] / t:6.2f}%"
            for s, t in zip(report.splits, totals)
        )
        yield f"  {class_id:>4}  {name:<16}{cells}"
    yield ""
    warnings = report.warnings()
    if warnings:
        yield f"warnings ({len(warnings)}):"
        yield from (f"  {w}" for w in warnings)
        yield ""
    problems = report.problems
    if not problems:
        yield "problems: none"
        return
    yield f"problems ({len(problems)}):"
    for p in problems:
        yield f"  {p.split}: {p.message}"


def check_data(cfg: DataConfig, workers: int) -> Report:
    """The full check of a data section: its config and both pipelines first (a UserError naming
    the key), then every file (``workers`` reader threads) or the generated samples."""
    from segadv.data.augment import build_transform
    from segadv.data.config_checks import check_config

    check_config(cfg)
    build_transform(cfg.train_transforms, cfg.input_normalization, "data.train_transforms", ignore_index=cfg.ignore_index)
    build_transform(cfg.val_transforms, cfg.input_normalization, "data.val_transforms", ignore_index=cfg.ignore_index)
    return check_synthetic(cfg) if cfg.kind == "synthetic" else check_files(cfg, workers)
