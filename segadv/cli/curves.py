"""segadv-curves: accuracy against training time of one or more runs, as text and as a PNG.

Reads each run dir's ``metrics.jsonl``: ``val/mIoU`` and ``perf/train_seconds`` (the training
loop's wall time since step 0 when that evaluation began; a resumed run continues it from its
checkpoint) at every evaluation, and the ``train/loss_*`` of every log step. Records are taken in
step order, the last record of a step winning (a rewound run logs the steps after its rewind again).

    segadv-curves RUN_DIR [RUN_DIR ...] [--threshold 0.80] [--png FILE] [--title TEXT]

Prints per run the first evaluation at or above the threshold (seconds, step) and the final one
(the last step's), then the median and worst time to the threshold; a run that never reaches it is
said so in words. The PNG has two panels: val mIoU against time, and the training losses against
the step. A run whose ``metrics.jsonl`` cannot be read (not
UTF-8 text, not a regular file) is set aside with a warning naming it; records whose step, time or
score is out of range are skipped (segadv/experiment/runs.py). ``--png`` needs matplotlib, the ``plot`` extra
(``pip install "segadv[plot]"``); without it the command exits 2 before reading anything.
"""

from __future__ import annotations

import io
import logging
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Optional

from segadv.cli.args import ArgumentParser, HelpFormatter, docs_epilog, fraction
from segadv.errors import UserError, cli_entry
from segadv.experiment.runs import METRICS_FILE, metrics_records, score_value
from segadv.fsutil import atomic_write_bytes, make_dir, output_file, user_path
from segadv.readback import Unreadable, real_number

log = logging.getLogger(__name__)


@dataclass
class Curve:
    run: str
    points: list[tuple[float, int, float]]  # (train seconds, step, val mIoU), in step order
    losses: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # train/loss_*: (step, value)

    def first_at(self, threshold: float) -> Optional[tuple[float, int, float]]:
        return next((p for p in self.points if p[2] >= threshold), None)

    @property
    def best(self) -> tuple[float, int, float]:
        return max(self.points, key=lambda p: (p[2], -p[1]))


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
    by_step: dict[int, tuple[float, int, float]] = {}
    losses: dict[str, dict[int, float]] = {}
    for record in records:  # in file order: a step logged again (after a rewind) replaces its earlier record
        step = record["step"]
        seconds, miou = real_number(record.get("perf/train_seconds")), score_value(record.get("val/mIoU"))
        if seconds is not None and seconds >= 0 and miou is not None and miou == miou:  # NaN: no point
            by_step[step] = (seconds, step, miou)
        for key, value in record.items():
            number = real_number(value) if key.startswith("train/loss_") else None
            if number is not None and math.isfinite(number):
                losses.setdefault(key.removeprefix("train/"), {})[step] = number
    if not by_step:
        raise UserError(f"{path}: no evaluation with perf/train_seconds (a run from before it was logged?)")
    points = [by_step[step] for step in sorted(by_step)]
    back = next((b for a, b in zip(points, points[1:]) if b[0] < a[0]), None)
    if back is not None:
        log.warning("%s: perf/train_seconds goes back at step %d (a resume by a segadv that did not keep the time "
                    "in its checkpoints): the times from there count from that resume", path, back[1])
    return Curve(str(run_dir), points, {name: sorted(values.items()) for name, values in sorted(losses.items())})


def report(curves: list[Curve], threshold: float) -> str:
    lines = []
    reached = []
    for curve in curves:
        first, (t_end, step_end, miou_end) = curve.first_at(threshold), curve.points[-1]
        if first:
            passed = f"mIoU >= {threshold:.2f} at {first[0]:.0f} s (step {first[1]}, mIoU {first[2]:.3f})"
        else:
            _, best_step, best_miou = curve.best
            passed = f"did not reach {threshold:.2f} (best mIoU {best_miou:.3f} at step {best_step})"
        lines.append(f"{curve.run}: {passed}; final {miou_end:.3f} at {t_end:.0f} s (step {step_end})")
        reached.append(first[0] if first else math.inf)
    lines.append(summary(reached, threshold))
    return "\n".join(lines)


def summary(reached: list[float], threshold: float) -> str:
    """The median and worst time to the threshold over the runs (``inf``: a run that did not reach
    it), in words where a run did not reach it."""
    runs, missed = len(reached), sum(1 for t in reached if t == math.inf)
    median = statistics.median(reached)
    median_text = f"median {median:.0f} s" if median != math.inf else "median: not reached (by half the runs or more)"
    worst = (f"worst {max(reached):.0f} s" if not missed
             else f"worst: not reached ({missed} of {runs} run{'' if runs == 1 else 's'} did not reach {threshold:.2f})")
    return f"time to mIoU >= {threshold:.2f}: {median_text}, {worst} over {runs} run(s)"


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
    """Two panels: val mIoU against training time (the threshold dashed), and each run's training
    losses against the step (one colour per run, one line style per loss)."""
    fig, (ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 3.8), dpi=110)
    styles = ("-", "--", ":", "-.")
    for index, curve in enumerate(curves):
        seconds, _, miou = zip(*curve.points)
        colour = f"C{index % 10}"
        ax.plot(seconds, miou, marker="o", markersize=3, color=colour, label=Path(curve.run).name)
        for number, (name, values) in enumerate(curve.losses.items()):
            steps, value = zip(*values)
            loss_ax.plot(steps, value, color=colour, linestyle=styles[number % len(styles)], linewidth=1,
                         label=f"{Path(curve.run).name} {name}")
    ax.axhline(threshold, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("val mIoU")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("training loss")
    loss_ax.set_title("training losses (train/loss_*)", fontsize=10)
    loss_ax.grid(alpha=0.3)
    if any(curve.losses for curve in curves):
        loss_ax.legend(fontsize=7)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png")
    plt.close(fig)
    make_dir(png.parent)
    atomic_write_bytes(png, image.getvalue())


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="segadv-curves", description=__doc__.splitlines()[0].partition(": ")[2],
                            formatter_class=HelpFormatter, epilog=docs_epilog("experiments.md"))
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories")
    parser.add_argument("--threshold", type=fraction, default=0.80, help="the val mIoU to time, within 0..1 (default 0.80)")
    parser.add_argument("--png", type=Path, help="write the curves here (needs the plot extra: matplotlib)")
    parser.add_argument("--title", default="val mIoU against training time", help="the PNG's title")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.png is not None:  # a device, FIFO, socket or folder there: refused before any run is read
        args.png = output_file(user_path(args.png, "--png"), "--png")
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
