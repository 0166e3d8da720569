"""segadv-experiment: run a grid of configs x seeds and tabulate it, or tabulate any run dirs.

    segadv-experiment run GRID.yaml|NAME [--out DIR] [--seeds 0 1 2] [--dry-run] [--table-only] [--baseline ROW]
    segadv-experiment table RUN_DIR [RUN_DIR ...] [--json]
    segadv-experiment --list-grids

``run``: NAME is a shipped grid (``semi``: configs/experiments/semi.yaml, segadv/experiment/grid.py
gives the format). The whole grid is checked first (every row's config, seeds in range, and each
run still to run through its trainer's own start checks, segadv/training/preflight.py: the config's,
the warm starts and local encoder weights, the data roots and the folders their layout reads, the
batches and the input sizes): a mistake or a missing file anywhere exits 2, naming each with its
rows, before any run starts; ``--dry-run`` makes the same check, then prints the commands. Runs go one after another, each in ``OUT/<row>/seed<k>`` through
``segadv-train`` in a subprocess (its log in ``experiment.log`` there); a run is finished when its
``status.json`` says so (segadv/experiment/launcher.py). The table goes to ``OUT/results.md`` and
``OUT/results.json`` (segadv/experiment/results.py): per run the final and the best val mIoU, per
row their mean and sample std over the finished seeds, each row against its baseline. ``--baseline
ROW`` compares every row with ROW instead, into ``results_vs_<row>.md`` / ``.json``.

``table``: one line per run dir (segadv/experiment/table.py), Markdown or ``--json``: the scores and
the config keys whose values differ between the runs.

Exit codes: 0 all runs finished, 1 some run failed or stopped early (named; the table still lists
the finished ones), 2 a bad grid, run dir or argument, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from segadv.cli.args import ArgumentParser, HelpFormatter, ListShipped, docs_epilog, parse_args
from segadv.config import EXPERIMENTS_DIR, resolve_config
from segadv.errors import cli_entry
from segadv.experiment.grid import Grid, load_grid
from segadv.experiment.launcher import RunSpec, check_runs, dry_run_line, run_one
from segadv.experiment.results import warn_few_seeds, write_table
from segadv.experiment.table import RunTable

log = logging.getLogger("segadv.experiment")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="segadv-experiment", description=__doc__.splitlines()[0].partition(": ")[2],
                            formatter_class=HelpFormatter, epilog=docs_epilog("experiments.md"))
    parser.add_argument("--list-grids", action=ListShipped, folder=EXPERIMENTS_DIR,
                        help="list the shipped grids (configs/experiments/) and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a grid (or continue it) and write its table")
    run.add_argument("grid", help="the grid YAML, or the name of a shipped one (--list-grids)")
    run.add_argument("--out", type=Path, help="output directory (default: runs/experiments/<name>)")
    run.add_argument("--seeds", type=int, nargs="+", help="override the grid's seeds (every row's)")
    run.add_argument("--dry-run", action="store_true",
                     help="check the grid and put each run through its trainer's start checks (exit 2 naming "
                          "every problem), print the commands, run nothing")
    run.add_argument("--table-only", action="store_true", help="write the table from finished runs")
    run.add_argument("--baseline", metavar="ROW",
                     help="compare every other row with ROW instead of the grid's baselines; the table goes to "
                          "results_vs_<row>.md/.json beside results.md")
    table = sub.add_parser("table", help="tabulate run dirs: outcome, steps, final and best mIoU, wall time, "
                                         "the config keys that differ")
    table.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    table.add_argument("--json", action="store_true", help="print one JSON object instead of Markdown")
    return parser


def run_grid(args: argparse.Namespace) -> int:
    grid: Grid = load_grid(resolve_config(args.grid, folder=EXPERIMENTS_DIR, what="grid"))
    if args.seeds:
        grid = grid.with_seeds(list(args.seeds))
    out = args.out or Path("runs") / "experiments" / (grid.name or "grid")
    stem = "results"
    if args.baseline is not None:
        grid = grid.with_baseline(args.baseline)
        stem = f"results_vs_{grid.row_named(args.baseline, '--baseline').slug}"
    warn_few_seeds(grid)
    specs = [RunSpec.of(grid, row, seed, out) for row in grid.rows for seed in grid.seeds_of(row)]
    if not args.table_only:
        check_runs(specs, grid.name or "grid")
    if args.dry_run:
        for spec in specs:
            sys.stdout.write(f"{spec.label}: {dry_run_line(spec)}\n")
        return 0
    failed = [] if args.table_only else [f"{spec.row.name} (seed {spec.seed})" for spec in specs if not run_one(spec)]
    sys.stdout.write(write_table(grid, out, stem))
    log.info("table: %s", out / f"{stem}.md")
    if failed:
        log.error("%d run(s) failed: %s", len(failed), ", ".join(failed))
        return 1
    return 0


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.command == "table":
        table = RunTable.of(args.runs)
        sys.stdout.write(json.dumps(table.to_json(), indent=1) + "\n" if args.json else table.markdown())
        return 0
    return run_grid(args)


if __name__ == "__main__":
    sys.exit(main())
