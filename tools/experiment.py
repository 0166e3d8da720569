#!/usr/bin/env python
"""Run a grid of configs x seeds and tabulate final and best val mIoU.

    python tools/experiment.py GRID.yaml [--out DIR] [--seeds 0 1 2] [--dry-run] [--table-only]

GRID.yaml:

    name: semi                       # default output: runs/experiments/<name>
    seeds: [0, 1, 2]
    common_overrides: []             # appended to every run
    rows:
      - name: CE only
        config: configs/semi.yaml
        overrides: [method.name=supervised, loss.lambda_adv=0]

Runs go one after another, each in ``OUT/<row>/seed<k>`` through ``segadv-train`` in a
subprocess (its log in ``experiment.log`` there). A finished run (``experiment_done.json``) is
never repeated; an interrupted one continues with ``--resume auto``. The table is written as
``OUT/results.md`` and ``OUT/results.json``: per run the final and the best ``val/mIoU`` (with
its step) from ``metrics.jsonl``, per row their mean and sample std over seeds.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from segadv.errors import UserError, cli_entry
from segadv.fsutil import atomic_write_text

log = logging.getLogger("segadv.experiment")

DONE_FILE = "experiment_done.json"
GRID_KEYS = {"name", "seeds", "rows", "common_overrides"}
ROW_KEYS = {"name", "config", "overrides"}


@dataclass
class Row:
    name: str
    config: str
    overrides: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") or "row"


@dataclass
class Grid:
    name: str
    seeds: list[int]
    rows: list[Row]
    common_overrides: list[str] = field(default_factory=list)


def _string_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{what}: expected a list of key=value strings")
    return list(value)


def load_grid(path: Path) -> Grid:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"grid {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UserError(f"grid {path}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise UserError(f"grid {path}: expected a mapping with name, seeds and rows")
    unknown = set(data) - GRID_KEYS
    if unknown:
        raise UserError(f"grid {path}: unknown key(s) {', '.join(sorted(unknown))}; keys: {', '.join(sorted(GRID_KEYS))}")
    name = data.get("name") or path.stem
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise UserError(f"grid {path}: seeds: expected a non-empty list of integers")
    rows_data = data.get("rows")
    if not isinstance(rows_data, list) or not rows_data:
        raise UserError(f"grid {path}: rows: expected a non-empty list")
    rows: list[Row] = []
    for i, entry in enumerate(rows_data):
        where = f"grid {path}: rows[{i}]"
        if not isinstance(entry, dict):
            raise UserError(f"{where}: expected a mapping with name and config")
        unknown = set(entry) - ROW_KEYS
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; keys: {', '.join(sorted(ROW_KEYS))}")
        if not entry.get("name") or not entry.get("config"):
            raise UserError(f"{where}: needs a name and a config")
        row = Row(str(entry["name"]), str(entry["config"]), _string_list(entry.get("overrides"), f"{where}.overrides"))
        if not Path(row.config).is_file():
            raise UserError(f"{where}: config {row.config} does not exist")
        if any(r.name == row.name or r.slug == row.slug for r in rows):
            raise UserError(f"{where}: row name {row.name!r} is used twice")
        rows.append(row)
    return Grid(str(name), list(seeds), rows, _string_list(data.get("common_overrides"), f"grid {path}: common_overrides"))


# ------------------------------------------------------------------------------ metrics


def read_val_metrics(metrics_path: Path) -> dict[str, Any]:
    """Final and best ``val/mIoU`` of a run (a resumed run's repeated steps: the last record wins)."""
    by_step: dict[int, dict[str, Any]] = {}
    if metrics_path.is_file():
        for line in metrics_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "val/mIoU" in record and "step" in record:
                by_step[int(record["step"])] = record
    if not by_step:
        return {}
    final_step = max(by_step)
    best_step = max(by_step, key=lambda s: (by_step[s]["val/mIoU"], -s))
    return {
        "final_step": final_step,
        "final_mIoU": by_step[final_step]["val/mIoU"],
        "final_pixel_acc": by_step[final_step].get("val/pixel_acc"),
        "best_step": best_step,
        "best_mIoU": by_step[best_step]["val/mIoU"],
    }


# ------------------------------------------------------------------------------ running


def run_dir_for(out: Path, row: Row, seed: int) -> Path:
    return out / row.slug / f"seed{seed}"


def command_for(grid: Grid, row: Row, seed: int, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "segadv.train", "--config", row.config, "--run-dir", str(run_dir),
               *row.overrides, *grid.common_overrides, f"train.seed={seed}"]
    if run_dir.exists():
        command += ["--resume", "auto"]
    return command


def run_one(grid: Grid, row: Row, seed: int, out: Path) -> bool:
    """Runs (or continues) one run; True when it finished."""
    run_dir = run_dir_for(out, row, seed)
    if (run_dir / DONE_FILE).is_file():
        log.info("skip (done): %s, seed %d", row.name, seed)
        return True
    command = command_for(grid, row, seed, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("run: %s, seed %d: %s", row.name, seed, " ".join(command))
    start = time.perf_counter()
    with open(run_dir / "experiment.log", "a", encoding="utf-8") as log_file:  # a file, never an unread pipe
        code = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    attempts_path = run_dir / "experiment_attempts.json"
    attempts = json.loads(attempts_path.read_text()) if attempts_path.is_file() else []
    attempts.append({"wall_s": round(wall, 1), "exit_code": code})
    atomic_write_text(attempts_path, json.dumps(attempts) + "\n")
    if code != 0:
        tail = (run_dir / "experiment.log").read_text(encoding="utf-8", errors="replace").splitlines()[-20:]
        log.error("failed (exit %d): %s, seed %d; last lines of %s:\n%s", code, row.name, seed,
                  run_dir / "experiment.log", "\n".join(tail))
        return False
    done = {"row": row.name, "seed": seed, "command": command,
            "wall_s": round(sum(a["wall_s"] for a in attempts), 1), **read_val_metrics(run_dir / "metrics.jsonl")}
    atomic_write_text(run_dir / DONE_FILE, json.dumps(done, indent=1) + "\n")
    log.info("done: %s, seed %d in %.0f s: final mIoU %.4f, best %.4f (step %s)", row.name, seed, wall,
             done.get("final_mIoU", float("nan")), done.get("best_mIoU", float("nan")), done.get("best_step"))
    return True


# ------------------------------------------------------------------------------ table


def _mean_std(values: list[float]) -> tuple[Optional[float], Optional[float]]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def collect_results(grid: Grid, out: Path) -> dict[str, Any]:
    rows = []
    for row in grid.rows:
        runs = []
        for seed in grid.seeds:
            path = run_dir_for(out, row, seed) / DONE_FILE
            if path.is_file():
                done = json.loads(path.read_text(encoding="utf-8"))
                runs.append({"seed": seed, "run_dir": str(path.parent),
                             **{k: done.get(k) for k in ("final_mIoU", "best_mIoU", "best_step", "final_step", "wall_s")}})
        final_mean, final_std = _mean_std([r["final_mIoU"] for r in runs if r["final_mIoU"] is not None])
        best_mean, best_std = _mean_std([r["best_mIoU"] for r in runs if r["best_mIoU"] is not None])
        rows.append({"name": row.name, "config": row.config, "overrides": row.overrides, "n": len(runs),
                     "final_mean": final_mean, "final_std": final_std, "best_mean": best_mean, "best_std": best_std,
                     "wall_mean_s": statistics.fmean([r["wall_s"] for r in runs]) if runs else None, "runs": runs})
    total = sum(r["wall_s"] or 0 for row in rows for r in row["runs"])
    return {"grid": grid.name, "seeds": grid.seeds, "common_overrides": grid.common_overrides,
            "total_wall_s": round(total, 1), "rows": rows}


def _points(mean: Optional[float], std: Optional[float]) -> str:
    if mean is None:
        return "-"
    return f"{100 * mean:.1f} ± {100 * std:.1f}" if std is not None else f"{100 * mean:.1f}"


def markdown_table(results: dict[str, Any]) -> str:
    seeds = results["seeds"]
    lines = [
        f"Grid `{results['grid']}`, seeds {', '.join(map(str, seeds))}; total wall time "
        f"{results['total_wall_s'] / 60:.1f} min. val mIoU in points (mean ± sample std over seeds).",
        "",
        "| row | n | final mIoU | best mIoU | per-seed final | wall (s, mean) |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        by_seed = {r["seed"]: r for r in row["runs"]}
        per_seed = " / ".join(
            f"{100 * by_seed[s]['final_mIoU']:.1f}" if s in by_seed and by_seed[s]["final_mIoU"] is not None else "missing"
            for s in seeds
        )
        wall = f"{row['wall_mean_s']:.0f}" if row["wall_mean_s"] is not None else "-"
        lines.append(f"| {row['name']} | {row['n']}/{len(seeds)} | {_points(row['final_mean'], row['final_std'])} | "
                     f"{_points(row['best_mean'], row['best_std'])} | {per_seed} | {wall} |")
    return "\n".join(lines) + "\n"


def write_table(grid: Grid, out: Path) -> str:
    results = collect_results(grid, out)
    table = markdown_table(results)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(results, indent=1) + "\n")
    atomic_write_text(out / "results.md", table)
    return table


# ------------------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="experiment", description=__doc__.split("\n\n")[0])
    parser.add_argument("grid", type=Path, help="the grid YAML")
    parser.add_argument("--out", type=Path, help="output directory (default: runs/experiments/<name>)")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the grid's seeds")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--table-only", action="store_true", help="write the table from finished runs")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    grid = load_grid(args.grid)
    if args.seeds:
        grid.seeds = list(args.seeds)
    out = args.out or Path("runs") / "experiments" / grid.name
    failed = []
    if not args.table_only:
        for row in grid.rows:
            for seed in grid.seeds:
                run_dir = run_dir_for(out, row, seed)
                if args.dry_run:
                    state = "done" if (run_dir / DONE_FILE).is_file() else " ".join(command_for(grid, row, seed, run_dir))
                    sys.stdout.write(f"{row.name}, seed {seed}: {state}\n")
                elif not run_one(grid, row, seed, out):
                    failed.append(f"{row.name} (seed {seed})")
    if args.dry_run:
        return 0
    table = write_table(grid, out)
    sys.stdout.write(table)
    log.info("table: %s", out / "results.md")
    if failed:
        log.error("%d run(s) failed: %s", len(failed), ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sys.exit(main())
