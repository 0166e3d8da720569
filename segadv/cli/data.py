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

from segadv.cli.args import (ArgumentParser, HelpFormatter, add_config_arguments, count, docs_epilog, parse_args,
                             path_argument)
from segadv.config import load_config
from segadv.data.check import check_data, format_report
from segadv.errors import UserError, cli_entry

# The readers that import torch (datasets, listings, transforms) are imported where the check
# runs: --help answers without them.


MAX_WORKERS = 256  # reader threads: far more than any disk serves in parallel


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="segadv-data", formatter_class=HelpFormatter, description="Dataset tools.",
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

    from segadv.data.bundle import build_data
    from segadv.data.config_checks import class_names
    from segadv.data.palette import palette
    from segadv.data.show import first_samples, sample_files
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
    refuse_overwriting([("--output", output)], sample_files(train))
    check_parent(output)
    picked = first_samples(train, args.num, cfg.train.seed)
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
    from segadv.training.process import setup_logging

    setup_logging(logging.WARNING)
    if args.command == "show":
        return show_samples(args)
    report = check_data(load_config(args.config, args.overrides).data, args.workers)
    for line in format_report(report):
        print(line)
    sys.stdout.flush()
    if report.problems:
        raise UserError(f"{len(report.problems)} problems found in the dataset (listed above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
