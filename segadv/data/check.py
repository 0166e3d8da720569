"""segadv-data check's scan: every image and every labeled mask of a data section read in full
(the checks training applies), counted per split, with a class pixel histogram, the problems
found and the warnings about what reads without error but may not be what was meant."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np

from segadv.config.schema import DataConfig
from segadv.data.files import Problem, Sample, SampleError, absent_classes_note, display, image_note, read_image
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
    binary_255: int = 0  # masks holding only 0 and 255 (with two classes: likely binary masks saved as 0/255)
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
            absent = [i for i in range(len(self.names)) if s.hist[i] == 0]
            # With no class-1 pixel at all, the absent-class note below gives the same hint.
            if s.binary_255 and len(self.names) == 2 and self.ignore_index == 255 and 1 not in absent:
                found.append(f"{s.name}: {s.binary_255} mask{'s hold' if s.binary_255 > 1 else ' holds'} only 0 and "
                             "255 with 2 classes: 255 is data.ignore_index, so every object pixel is ignored "
                             "(binary masks saved as 0/255? save objects as 1)")
            if s.hist.sum() > 0 and absent:
                # the 0/255 hint only where a mask holds 255: val masks all 0 are another story
                found.append(absent_classes_note(self.names, absent, self.ignore_index, s.name,
                                                 holds_255=bool(s.hist[255])))
            for note, count in sorted(s.image_notes.items()):
                found.append(f"{s.name}: {count} image{'s are' if count > 1 else ' is'} {note}")
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
        for shape, hist, note, problem in pool.map(one, samples):
            if problem is not None:
                report.problems.append(problem)
                continue
            report.add_image(shape)
            if note is not None:
                report.image_notes[note] = report.image_notes.get(note, 0) + 1
            if hist is not None:
                report.hist += hist
                if set(np.flatnonzero(hist).tolist()) == {0, 255}:
                    report.binary_255 += 1


def check_files(cfg: DataConfig, workers: int) -> Report:
    """Every file of a checked section (``check_config``), each split listed once."""
    from segadv.data.config_checks import class_names
    from segadv.data.listing import empty_split_message, list_source

    found = list_source(cfg)
    train = SplitReport("train", labeled=len(found.labeled), unlabeled=len(found.unlabeled))
    val = SplitReport("val", labeled=len(found.val.samples))
    for p in found.problems:
        (val if p.split == "val" else train).problems.append(p)
    _scan(found.labeled, "train", True, found.spec, train, workers)
    _scan(found.unlabeled, "unlabeled", False, found.spec, train, workers)
    _scan(found.val.samples, "val", True, found.spec, val, workers)
    for report, listing, labeled in ((train, found.train, found.labeled), (val, found.val, found.val.samples)):
        if not labeled:
            report.problems.append(Problem(report.name, "", (), empty_split_message(report.name, listing.source, 0)))
    title = f"{cfg.kind} at {display(found.root)}"
    return Report(title, class_names(cfg), cfg.ignore_index, [train, val], [found.shared] if found.shared else [])


def check_synthetic(cfg: DataConfig) -> Report:
    from segadv.data.config_checks import class_names
    from segadv.data.synthetic import SyntheticShapes

    syn = cfg.synthetic
    train_ds = SyntheticShapes("train", syn.train_size, syn.image_size, cfg.num_classes, syn.seed)
    val_ds = SyntheticShapes("val", syn.val_size, syn.image_size, cfg.num_classes, syn.seed)
    labeled, unlabeled, problems, _ = split_labeled([str(i) for i in range(len(train_ds))], cfg, None)
    train = SplitReport("train", labeled=len(labeled), unlabeled=len(unlabeled), problems=problems)
    val = SplitReport("val", labeled=len(val_ds))
    for report, ds, indices in ((train, train_ds, labeled), (val, val_ds, range(len(val_ds)))):
        for i in indices:
            image, mask = ds.raw(i)
            report.add_image(image.shape)
            report.hist += np.bincount(mask.ravel(), minlength=256)
    for _ in unlabeled:  # generated images are all image_size square; no need to draw them
        train.add_image((syn.image_size, syn.image_size))
    title = f"synthetic shapes ({syn.image_size}px, seed {syn.seed})"
    return Report(title, class_names(cfg), cfg.ignore_index, [train, val])


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
