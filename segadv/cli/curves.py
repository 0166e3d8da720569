"""segadv-curves: accuracy against training time of one or more runs, as text and as a PNG.

Reads each run dir's ``metrics.jsonl``: ``val/mIoU`` and ``perf/train_seconds`` (the training
loop's wall time when that evaluation began) at every evaluation.

    segadv-curves RUN_DIR [RUN_DIR ...] [--threshold 0.80] [--png FILE] [--title TEXT]

Prints per run the first evaluation at or above the threshold (seconds, step) and the final one,
then the median and worst time to the threshold. A run whose ``metrics.jsonl`` cannot be read (not
UTF-8 text, not a regular file) is set aside with a warning naming it; records whose step, time or
score is out of range are skipped (segadv/experiment/runs.py). ``--png`` needs matplotlib, the ``plot`` extra
(``pip install "segadv[plot]"``); without it the command exits 2 before reading anything.
"""

from __future__ import annotations

import argparse
import io
import logging
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Optional

from segadv.cli.args import HelpFormatter, docs_epilog
from segadv.errors import UserError, cli_entry
from segadv.experiment.runs import METRICS_FILE, metrics_records, score_value
from segadv.fsutil import atomic_write_bytes, make_dir
from segadv.readback import Unreadable, real_number

log = logging.getLogger(__name__)


@dataclass
class Curve:
    run: str
    points: list[tuple[float, int, float]]  # (train seconds, step, val mIoU)

    def first_at(self, threshold: float) -> Optional[tuple[float, int, float]]:
        return next((p for p in self.points if p[2] >= threshold), None)


def read_curve(run_dir: Path) -> Optional[Curve]:
    """The run's curve; None when its metrics file cannot be read (set aside, with a warning)."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        raise UserError(f"{path}: no such file (is {run_dir} a run dir?)")
    try:
        records = list(metrics_records(path, set_aside=False))
    except Unreadable as err:
        log.warning("%s: set aside", err)
        return None
    points = []
    for record in records:
        seconds, miou = real_number(record.get("perf/train_seconds")), score_value(record.get("val/mIoU"))
        if seconds is not None and seconds >= 0 and miou is not None and miou == miou:  # NaN: no point
            points.append((seconds, record["step"], miou))
    if not points:
        raise UserError(f"{path}: no evaluation with perf/train_seconds (a run from before it was logged?)")
    return Curve(str(run_dir), sorted(points))


def report(curves: list[Curve], threshold: float) -> str:
    lines = []
    reached = []
    for curve in curves:
        first, (t_end, step_end, miou_end) = curve.first_at(threshold), curve.points[-1]
        passed = f"{first[0]:.0f} s (step {first[1]}, mIoU {first[2]:.3f})" if first else "never"
        lines.append(f"{curve.run}: mIoU >= {threshold:.2f} at {passed}; final {miou_end:.3f} at "
                     f"{t_end:.0f} s (step {step_end})")
        reached.append(first[0] if first else float("inf"))
    lines.append(f"time to mIoU >= {threshold:.2f}: median {statistics.median(reached):.0f} s, "
                 f"worst {max(reached):.0f} s over {len(curves)} run(s)")
    return "\n".join(lines)


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the file-only Agg backend, or a UserError naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError('--png needs matplotlib, the plot extra: pip install "segadv[plot]"') from None
    return plt


def plot(plt: ModuleType, curves: list[Curve], threshold: float, png: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for curve in curves:
        seconds, _, miou = zip(*curve.points)
        ax.plot(seconds, miou, marker="o", markersize=3, label=Path(curve.run).name)
    ax.axhline(threshold, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("val mIoU")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png")
    make_dir(png.parent)
    atomic_write_bytes(png, image.getvalue())


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="segadv-curves", description=__doc__.splitlines()[0].partition(": ")[2],
                                     formatter_class=HelpFormatter, epilog=docs_epilog("experiments.md"))
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories")
    parser.add_argument("--threshold", type=float, default=0.80, help="the val mIoU to time (default 0.80)")
    parser.add_argument("--png", type=Path, help="write the curves here (needs the plot extra: matplotlib)")
    parser.add_argument("--title", default="val mIoU against training time", help="the PNG's title")
    args = parser.parse_args(argv)
    plt = pyplot() if args.png else None  # a missing extra is said before any run is read
    curves = [curve for curve in map(read_curve, args.runs) if curve is not None]
    if not curves:
        raise UserError("no run left to report: every metrics.jsonl was set aside (see the warnings)")
    sys.stdout.write(report(curves, args.threshold) + "\n")
    if plt is not None:
        plot(plt, curves, args.threshold, args.png, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
