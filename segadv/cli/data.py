"""segadv-data check: scan the configured dataset and report what is wrong before training.
segadv-data show: a picture of augmented training samples with their masks.

    segadv-data check [--config FILE] [--workers N] [key=value ...]
    segadv-data show --output FILE.png [--num N] [--config FILE] [key=value ...]

Reads every image and every labeled mask in full (the same checks training applies: missing or
unreadable files, image / mask size mismatches, mask values that are not class ids or the ignore
value, list files naming missing ids, empty splits) and prints counts per split, the image size
range, the class pixel histogram and every problem found. Exit 0 when clean, 2 when not (or on a
config error). Masks of the unlabeled pool are not read, as in training.

Warnings (exit 0) say what reads without error but may not be what was meant: a class with no
pixel in a split, masks holding only 0 and 255 with two classes (binary masks saved as 0/255:
every object pixel is ignore), images whose pixels are scaled on reading (16-bit grayscale).

``show`` draws the first N labeled training samples through the real training pipeline (the
datasets training builds, data.train_transforms applied, seeded by train.seed), un-normalised for
display, each beside itself with its mask overlaid (mmsegmentation's browse_dataset.py).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np

from segadv.cli.args import HelpFormatter, add_config_arguments, count, docs_epilog, parse_args, path_argument
from segadv.config import load_config
from segadv.config.schema import DataConfig
from segadv.data.files import Problem, Sample, SampleError, absent_classes_note, display, image_note, read_image
from segadv.data.splits import split_labeled
from segadv.errors import UserError, cli_entry

# The readers that import torch (datasets, listings, transforms) are imported where the check
# runs: --help answers without them.

log = logging.getLogger("segadv.cli.data")


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


MAX_WORKERS = 256  # reader threads: far more than any disk serves in parallel


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="segadv-data", formatter_class=HelpFormatter, description="Dataset tools.",
                                     epilog=docs_epilog("datasets.md"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="check, show (COMMAND --help: its options)")
    check = sub.add_parser(
        "check", formatter_class=HelpFormatter,
        help="scan the configured dataset and report every problem (exit 0 clean, 2 not)",
        description="Scan the configured dataset: counts per split, image sizes, class pixel "
                    "histogram and every problem found. Exit 0 when clean, 2 when not.",
        epilog=docs_epilog("datasets.md"),
    )
    add_config_arguments(check, "default: default")
    check.add_argument("--workers", type=count(1, MAX_WORKERS), default=min(4, os.cpu_count() or 1),
                       help="reader threads, 1 or more (default: %(default)s)")
    check.add_argument("overrides", nargs="*", metavar="key=value",
                       help="dotted config overrides, e.g. data.root=/data/VOC2012 "
                            "(the keys: segadv-train --help-config)")
    show = sub.add_parser(
        "show", formatter_class=HelpFormatter,
        help="a picture of augmented training samples with their masks overlaid, as the loader delivers them",
        description="Write a PNG of the first N labeled training samples after data.train_transforms, each "
                    "beside itself with its mask's class colours overlaid (ignored pixels white).",
        epilog=docs_epilog("datasets.md"),
    )
    show.add_argument("--output", type=path_argument, required=True, metavar="FILE.png", help="the picture to write")
    show.add_argument("--num", type=count(1, MAX_SHOWN), default=8, help="samples, 1 or more (default: %(default)s)")
    add_config_arguments(show, "default: default")
    show.add_argument("overrides", nargs="*", metavar="key=value",
                      help="dotted config overrides (the keys: segadv-train --help-config)")
    return parser


MAX_SHOWN = 64  # samples in one picture: more does not fit a screen


def show_samples(args: argparse.Namespace) -> int:
    """segadv-data show: the first ``args.num`` labeled training samples as training's datasets
    deliver them, drawn with the training panels' helpers (segadv/monitor/images.py)."""
    from pathlib import Path

    from PIL import Image

    from segadv.data.augment import seed_transform
    from segadv.data.bundle import build_data
    from segadv.data.config_checks import class_names
    from segadv.data.palette import palette
    from segadv.fsutil import atomic_write_bytes, check_parent, make_dir, output_file, refuse_overwriting
    from segadv.monitor.images import samples_panel

    output = Path(args.output)
    if output.suffix.lower() != ".png":
        raise UserError(f"--output {output}: the picture is a PNG; name a .png file")
    if output.is_dir():
        raise UserError(f"--output {output} is a folder; name a .png file")
    output = output_file(output, "--output")  # before the data is read; a link: the file it leads to
    cfg = load_config(args.config, args.overrides)
    inputs = [("--config", args.config)] if args.config else []
    refuse_overwriting([("--output", output)], inputs)
    train = build_data(cfg.data).train
    samples = getattr(train, "samples", ())
    refuse_overwriting([("--output", output)], [(what, path) for s in samples
                                                for what, path in (("an image", s.image), ("a mask", s.mask))
                                                if path is not None])
    check_parent(output)
    # Seeded as training seeds it, so the same command draws the same picture.
    seed_transform(getattr(train, "transform", None), cfg.train.seed)
    picked = [train[i] for i in range(min(args.num, len(train)))]
    picked = [item for item in picked if item is not None]
    if not picked:
        raise UserError("no labeled training sample loaded: segadv-data check lists the problems")
    images, masks = zip(*picked)
    panel = samples_panel(images, masks, palette(cfg.data.num_classes), cfg.data.input_normalization,
                          class_names(cfg.data))
    buffer = io.BytesIO()
    Image.fromarray(panel.permute(1, 2, 0).numpy()).save(buffer, format="PNG")
    make_dir(output.parent)
    atomic_write_bytes(output, buffer.getvalue())
    print(f"wrote      {output}: {len(picked)} augmented training sample(s), {panel.shape[2]}x{panel.shape[1]} px")
    return 0


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    from segadv.data.augment import build_transform
    from segadv.data.config_checks import check_config
    from segadv.training.process import setup_logging

    setup_logging(logging.WARNING)
    if args.command == "show":
        return show_samples(args)
    cfg = load_config(args.config, args.overrides).data
    check_config(cfg)
    build_transform(cfg.train_transforms, cfg.input_normalization, "data.train_transforms", ignore_index=cfg.ignore_index)
    build_transform(cfg.val_transforms, cfg.input_normalization, "data.val_transforms", ignore_index=cfg.ignore_index)
    report = check_synthetic(cfg) if cfg.kind == "synthetic" else check_files(cfg, args.workers)
    for line in format_report(report):
        print(line)
    sys.stdout.flush()
    if report.problems:
        raise UserError(f"{len(report.problems)} problems found in the dataset (listed above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
