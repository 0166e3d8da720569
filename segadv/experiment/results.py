"""A grid's results: per run its final and best val mIoU (from ``status.json``), per row their
mean and sample std over the finished seeds, each row against its baseline (Welch's t, the paired
t), the diagnostics; as ``results.json`` and a Markdown table."""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from segadv.experiment.grid import Grid, Row
from segadv.experiment.runs import METRICS_FILE, diagnostics, read_train_diagnostics, summarize
from segadv.experiment.stats import PairedTest, WelchTest, paired_test, welch_test
from segadv.fsutil import atomic_write_text, make_dir

log = logging.getLogger(__name__)

MIN_SEEDS = 3  # seeds a compared row wants
MIN_SEEDS_CLOSE = 5  # ... where its difference from the baseline is within two standard deviations


def run_dir_for(out: Path, row: Row, seed: int) -> Path:
    return out / row.slug / f"seed{seed}"


@dataclass
class RunResult:
    """One finished run of a row."""

    seed: int
    run_dir: str
    final_mIoU: Optional[float]
    final_step: Optional[int]
    best_mIoU: Optional[float]
    best_step: Optional[int]
    wall_s: Optional[float]  # over its attempts (status.json's total_wall_s)
    diagnostics: dict[str, float]
    best_by: Optional[str] = None  # the score that chose its best (checkpoint.best_by); None: val/mIoU


@dataclass
class Comparison:
    """A row against its baseline row, on final and on best val mIoU."""

    baseline: str
    final: WelchTest
    final_paired: Optional[PairedTest]
    best: WelchTest
    best_paired: Optional[PairedTest]
    seeds_wanted: int
    seeds_note: Optional[str]  # a row short of seeds_wanted finished seeds, said as a sentence

    def to_json(self) -> dict[str, Any]:
        """results.json's keys: diff, t, df, p, paired, best_diff, ..., best_paired."""
        return {"baseline": self.baseline, **asdict(self.final),
                "paired": asdict(self.final_paired) if self.final_paired else None,
                **{f"best_{key}": value for key, value in asdict(self.best).items()},
                "best_paired": asdict(self.best_paired) if self.best_paired else None,
                "seeds_wanted": self.seeds_wanted, "seeds_note": self.seeds_note}


@dataclass
class RowResult:
    """A row's finished runs, their mean and sample std over seeds, its comparison if any."""

    name: str
    config: str
    overrides: list[str]
    seeds: list[int]
    n: int
    final_mean: Optional[float]
    final_std: Optional[float]
    best_mean: Optional[float]
    best_std: Optional[float]
    wall_mean_s: Optional[float]
    diagnostics: dict[str, float]  # each diagnostic's mean over the runs that logged it
    runs: list[RunResult]
    comparison: Optional[Comparison] = None

    @classmethod
    def of(cls, row: Row, seeds: list[int], runs: list[RunResult]) -> "RowResult":
        keys = [k for k in diagnostics() if any(k in r.diagnostics for r in runs)]
        walls = [r.wall_s for r in runs if r.wall_s is not None]
        return cls(row.name, row.config, row.overrides, seeds, len(runs),
                   *_mean_std([r.final_mIoU for r in runs if r.final_mIoU is not None]),
                   *_mean_std([r.best_mIoU for r in runs if r.best_mIoU is not None]),
                   statistics.fmean(walls) if walls else None,
                   {k: statistics.fmean(r.diagnostics[k] for r in runs if k in r.diagnostics) for k in keys}, runs)

    def by_seed(self, metric: str) -> dict[int, float]:
        return {r.seed: getattr(r, metric) for r in self.runs if getattr(r, metric) is not None}

    def to_json(self) -> dict[str, Any]:
        fields = {key: value for key, value in asdict(self).items() if key != "comparison"}
        return {**fields, **(self.comparison.to_json() if self.comparison else {})}


@dataclass
class GridResults:
    grid: str
    seeds: list[int]
    common_overrides: list[str]
    baseline: Optional[str]
    rows: list[RowResult]

    @property
    def total_wall_s(self) -> float:
        return round(sum(r.wall_s or 0.0 for row in self.rows for r in row.runs), 1)

    def to_json(self) -> dict[str, Any]:
        return {"grid": self.grid, "seeds": self.seeds, "common_overrides": self.common_overrides,
                "baseline": self.baseline, "total_wall_s": self.total_wall_s,
                "rows": [row.to_json() for row in self.rows]}


def _mean_std(values: list[float]) -> tuple[Optional[float], Optional[float]]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def seeds_wanted(diff: Optional[float], std: Optional[float], baseline_std: Optional[float]) -> int:
    """At least MIN_SEEDS; MIN_SEEDS_CLOSE where |diff| is within two standard deviations (the
    larger of the two rows'), or where a spread is not known yet."""
    if diff is None or std is None or baseline_std is None:
        return MIN_SEEDS
    return MIN_SEEDS_CLOSE if abs(diff) <= 2 * max(std, baseline_std) else MIN_SEEDS


def compare_rows(row: RowResult, baseline: RowResult) -> Comparison:
    tests = {}
    for metric in ("final_mIoU", "best_mIoU"):
        ours, theirs = row.by_seed(metric), baseline.by_seed(metric)
        tests[metric] = welch_test(list(ours.values()), list(theirs.values())), paired_test(ours, theirs)
    (final, final_paired), (best, best_paired) = tests["final_mIoU"], tests["best_mIoU"]
    wanted = seeds_wanted(final.diff, row.final_std, baseline.final_std)
    short = [r for r in (row, baseline) if r.n < wanted]
    note = None if not short else (
        f"{row.name!r} vs {baseline.name!r}: {row.n} and {baseline.n} finished seeds, {wanted} wanted"
        + (" (Δ final within two standard deviations)" if wanted == MIN_SEEDS_CLOSE else ""))
    return Comparison(baseline.name, final, final_paired, best, best_paired, wanted, note)


def collect_results(grid: Grid, out: Path) -> GridResults:
    """The finished runs of every row (``status.json``: ``finished``), compared with their baselines."""
    rows = []
    for row in grid.rows:
        runs = []
        for seed in grid.seeds_of(row):
            run_dir = run_dir_for(out, row, seed)
            if not (run_dir / "status.json").is_file():
                continue
            summary = summarize(run_dir)
            if summary.finished:
                final, best = summary.final, summary.best
                runs.append(RunResult(seed, str(run_dir), final.mIoU if final else None, final.step if final else None,
                                      best.mIoU if best else None, best.step if best else None, summary.wall_s,
                                      read_train_diagnostics(run_dir / METRICS_FILE), best.by if best else None))
        rows.append(RowResult.of(row, grid.seeds_of(row), runs))
    by_name = {r.name: r for r in rows}
    for row, result in zip(grid.rows, rows):
        baseline = grid.baseline_of(row)
        if baseline is not None:
            result.comparison = compare_rows(result, by_name[baseline])
    return GridResults(grid.name or "", grid.seeds, grid.common_overrides, grid.baseline, rows)


# ------------------------------------------------------------------------------ Markdown


def _points(mean: Optional[float], std: Optional[float]) -> str:
    if mean is None:
        return "-"
    return f"{100 * mean:.1f} ± {100 * std:.1f}" if std is not None else f"{100 * mean:.1f} ± -"


def stat_cell(test: Union[WelchTest, PairedTest, None]) -> str:
    """``+3.2 (t 2.32, p 0.099)``; a paired test names its seeds' count."""
    if test is None or test.diff is None:
        return "-"
    n = f"{len(test.seeds)} seeds, " if isinstance(test, PairedTest) else ""
    if test.t is None:
        stats = "t -"
    else:
        stats = f"t {test.t:.2f}, " + ("p < 0.001" if test.p < 0.0005 else f"p {test.p:.3f}")
    return f"{100 * test.diff:+.1f} ({n}{stats})"


def markdown_table(results: GridResults) -> str:
    seeds = results.seeds
    compared = any(row.comparison for row in results.rows)
    lines = [
        f"Grid `{results.grid}`, seeds {', '.join(map(str, seeds))}; total wall time "
        f"{results.total_wall_s / 60:.1f} min. val mIoU in points (mean ± sample std over seeds).",
        "",
        "| row | n | final mIoU (mean ± std) | best mIoU (mean ± std) | per-seed final | wall (s, mean) |"
        + (" vs | Δ final (Welch) | Δ final (paired) | Δ best (Welch) |" if compared else ""),
        "|---|---|---|---|---|---|" + ("---|---|---|---|" if compared else ""),
    ]
    notes = []
    for row in results.rows:
        by_seed = {r.seed: r for r in row.runs}
        per_seed = " / ".join(
            f"{100 * by_seed[s].final_mIoU:.1f}" if s in by_seed and by_seed[s].final_mIoU is not None else "missing"
            for s in row.seeds
        )
        if row.seeds != seeds:
            per_seed += f" (seed{'s' if len(row.seeds) > 1 else ''} {', '.join(map(str, row.seeds))})"
        wall = f"{row.wall_mean_s:.0f}" if row.wall_mean_s is not None else "-"
        line = (f"| {row.name} | {row.n}/{len(row.seeds)} | {_points(row.final_mean, row.final_std)} | "
                f"{_points(row.best_mean, row.best_std)} | {per_seed} | {wall} |")
        comparison = row.comparison
        if comparison is not None:
            line += (f" {comparison.baseline} | {stat_cell(comparison.final)} | {stat_cell(comparison.final_paired)} | "
                     f"{stat_cell(comparison.best)} |")
            if comparison.seeds_note:
                notes.append(f"- More seeds wanted: {comparison.seeds_note}.")
        elif compared:
            line += " - | - | - | - |"
        lines.append(line)
        chosen_by = sorted({r.best_by for r in row.runs if r.best_by})
        if chosen_by:
            notes.append(f"- {row.name}: best is the val mIoU of the checkpoint chosen by {', '.join(chosen_by)} "
                         "(checkpoint.best_by), not the highest val mIoU.")
    if notes and not compared:
        lines += ["", *notes]
    if compared:
        lines += ["", "Δ: difference of the means in points against the row named under vs, with Welch's t and "
                  "its two-sided p; paired: the mean per-seed difference over the seeds both rows finished, paired "
                  f"t and p. Rows want {MIN_SEEDS} seeds, {MIN_SEEDS_CLOSE} where Δ final is within two standard "
                  "deviations.", *([""] + notes if notes else [])]
    return "\n".join(lines + diagnostics_table({row.name: row.diagnostics for row in results.rows})) + "\n"


def diagnostics_table(rows: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Markdown lines: each row's diagnostics (:func:`diagnostics`; row name -> its means; those any
    row logged), or none at all."""
    keys = [k for k in diagnostics() if any(k in means for means in rows.values())]
    if not keys:
        return []
    lines = ["", "Diagnostics: the mean of each logged `train/` value (`diag/` for d_confidence_auroc and "
             "d_mask_precision, measured at evaluations) over the last quarter of a run, then over its seeds "
             "(- : not logged by that method). A CE-only row's D trains but reaches nothing.", "",
             "| row | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, means in rows.items():
        cells = [f"{means[k]:.3f}" if k in means else "-" for k in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def write_table(grid: Grid, out: Path, stem: str = "results") -> str:
    """``OUT/<stem>.json`` and ``OUT/<stem>.md``; returns the Markdown."""
    results = collect_results(grid, out)
    table = markdown_table(results)
    make_dir(out)
    atomic_write_text(out / f"{stem}.json", json.dumps(results.to_json(), indent=1) + "\n")
    atomic_write_text(out / f"{stem}.md", table)
    for row in results.rows:
        if row.comparison and row.comparison.seeds_note:
            log.warning("more seeds wanted: %s", row.comparison.seeds_note)
    return table


def warn_few_seeds(grid: Grid) -> None:
    """Before running: a row in a comparison that will run fewer than MIN_SEEDS seeds."""
    compared = {name for row in grid.rows if grid.baseline_of(row) is not None
                for name in (row.name, grid.baseline_of(row))}
    for row in grid.rows:
        if row.name in compared and len(grid.seeds_of(row)) < MIN_SEEDS:
            log.warning("row %r runs %d seed(s); a comparison wants at least %d (%d where the difference is "
                        "within two standard deviations)", row.name, len(grid.seeds_of(row)), MIN_SEEDS, MIN_SEEDS_CLOSE)
