#!/usr/bin/env python
"""Run a grid of configs x seeds and tabulate final and best val mIoU.

    python tools/experiment.py GRID.yaml|NAME [--out DIR] [--seeds 0 1 2] [--dry-run] [--table-only]
                                              [--baseline ROW]
    python tools/experiment.py --list-grids

NAME is a grid shipped in configs/experiments/ (``semi``: configs/experiments/semi.yaml). GRID.yaml:

    name: semi                       # default output: runs/experiments/<name>
    seeds: [0, 1, 2]
    baseline: CE only                # optional: the row the others are compared with
    common_overrides: []             # appended to every run
    rows:
      - name: CE only
        config: semi                 # a config file, or a shipped config's name
        overrides: [method.name=supervised, loss.lambda_adv=0]
      - name: CE only, all labeled (reference)
        config: semi
        overrides: [data.labeled_fraction=1.0]
        seeds: [0]                   # a row may run its own seeds (``--seeds`` overrides all)
                                     # and name its own baseline (``baseline: <row name>``)

Runs go one after another, each in ``OUT/<row>/seed<k>`` through ``segadv-train`` in a
subprocess (its log in ``experiment.log`` there). A finished run (``experiment_done.json``) is
never repeated; an interrupted one continues with ``--resume auto``. The table is written as
``OUT/results.md`` and ``OUT/results.json``: per run the final and the best ``val/mIoU`` (with
its step) from ``metrics.jsonl``, per row their mean and sample std over seeds.

Statistics: a row with a baseline (the grid's ``baseline``, or its own) is compared with that
row on final and on best val mIoU: the difference of the means (``diff``, ``best_diff``),
Welch's t (``t``, with Welch-Satterthwaite ``df``) and its two-sided p (``p``), and where both
rows finished two or more of the same seeds the paired per-seed difference (``paired``: its
seeds, mean difference, t, df and p; same seed = same initial weights and data order). Rows
want at least 3 seeds, 5 where the difference is within two standard deviations (the larger of
the two rows' sample stds): a row short of that is logged as a warning and noted under the
table (no seed is added by itself: pass ``--seeds`` or give the row more). ``--baseline ROW``
compares every row with ROW instead (e.g. a control row), in ``results_vs_<row>.md`` / ``.json``.
Each row also gets its runs' diagnostics (``diagnostics``: D's loss and accuracies, the share of
unlabeled pixels or images self-training took, over the last quarter of each run).

A run counts as finished only when it exits 0 *and* reached its ``train.max_steps`` (the trainer
also exits 0 when a SIGTERM/SIGINT stops it early at a checkpoint). Ctrl-C lets the current run
stop at its next step and save a checkpoint, then exits 130; a second Ctrl-C stops at once. A
finished run whose config file or arguments have changed since is kept (with a warning): delete
its directory to run it again.

Exit codes: 0 all runs finished, 1 some run failed or stopped early (named; the table still lists
the finished ones), 2 a bad grid or argument, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Iterator, Optional

import yaml

from segadv.cli_args import ListShipped
from segadv.config import EXPERIMENTS_DIR, resolve_config
from segadv.errors import UserError, cli_entry
from segadv.fsutil import atomic_write_text
from segadv.stats import paired_test, welch_test

log = logging.getLogger("segadv.experiment")

DONE_FILE = "experiment_done.json"
ATTEMPTS_FILE = "experiment_attempts.json"
LOG_FILE = "experiment.log"
GRID_KEYS = {"name", "seeds", "rows", "common_overrides", "baseline"}
ROW_KEYS = {"name", "config", "overrides", "seeds", "baseline"}
MIN_SEEDS = 3  # seeds a compared row wants
MIN_SEEDS_CLOSE = 5  # ... where its difference from the baseline is within two standard deviations


@dataclass
class Row:
    name: str
    config: str
    overrides: list[str] = field(default_factory=list)
    seeds: Optional[list[int]] = None  # None: the grid's (a reference row may run fewer)
    baseline: Optional[str] = None  # the row it is compared with; None: the grid's

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") or "row"


@dataclass
class Grid:
    name: str
    seeds: list[int]
    rows: list[Row]
    common_overrides: list[str] = field(default_factory=list)
    baseline: Optional[str] = None  # the row every other row is compared with

    def seeds_of(self, row: Row) -> list[int]:
        return self.seeds if row.seeds is None else row.seeds

    def baseline_of(self, row: Row) -> Optional[str]:
        """The name of the row ``row`` is compared with (None: not compared; never itself)."""
        name = row.baseline or self.baseline
        return None if name == row.name else name


def _string_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{what}: expected a list of key=value strings")
    for item in value:
        if "=" not in item or item.startswith("-"):
            raise UserError(f"{what}: {item!r} is not a dotted key=value override")
    return list(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_seeds(seeds: Any, what: str) -> list[int]:
    """A non-empty list of distinct integers (each seed has its own run dir)."""
    if not isinstance(seeds, list) or not seeds or not all(_is_int(s) for s in seeds):
        raise UserError(f"{what}: expected a non-empty list of integers")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise UserError(f"{what}: seed(s) {', '.join(map(str, repeated))} listed twice")
    return list(seeds)


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
    seeds = check_seeds(data.get("seeds", [0]), f"grid {path}: seeds")
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
        row_seeds = check_seeds(entry["seeds"], f"{where}.seeds") if "seeds" in entry else None
        row = Row(str(entry["name"]), str(entry["config"]), _string_list(entry.get("overrides"), f"{where}.overrides"),
                  row_seeds, _row_name(entry.get("baseline"), f"{where}.baseline"))
        try:
            exists = resolve_config(row.config).is_file()
        except UserError as err:  # an unknown name: the message lists the shipped ones
            raise UserError(f"{where}: {err}") from None
        if not exists:
            raise UserError(f"{where}: config {row.config} does not exist")
        if any(r.name == row.name for r in rows):
            raise UserError(f"{where}: row name {row.name!r} is used twice")
        clash = next((r for r in rows if r.slug == row.slug), None)
        if clash is not None:
            raise UserError(f"{where}: row names {clash.name!r} and {row.name!r} share the run directory {row.slug}")
        rows.append(row)
    names = [r.name for r in rows]
    baseline = _row_name(data.get("baseline"), f"grid {path}: baseline")
    for where, wanted in [(f"grid {path}: baseline", baseline),
                          *((f"grid {path}: rows[{i}].baseline", r.baseline) for i, r in enumerate(rows))]:
        if wanted is not None and wanted not in names:
            raise UserError(f"{where}: no row is named {wanted!r}; rows: {', '.join(map(repr, names))}")
    self_compared = next((r.name for r in rows if r.baseline == r.name), None)
    if self_compared is not None:
        raise UserError(f"grid {path}: row {self_compared!r} names itself as its baseline")
    return Grid(str(name), seeds, rows, _string_list(data.get("common_overrides"), f"grid {path}: common_overrides"),
                baseline)


def _row_name(value: Any, what: str) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise UserError(f"{what}: expected a row name")
    return value


# ------------------------------------------------------------------------------ metrics


def metrics_records(metrics_path: Path) -> Iterator[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` that carry a step, in order (none if it is missing;
    a line that is not JSON, e.g. cut short by a crash, is skipped)."""
    if not metrics_path.is_file():
        return
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and _is_number(record.get("step")):
            yield record


def read_val_metrics(metrics_path: Path) -> dict[str, Any]:
    """Final and best ``val/mIoU`` of a run (a resumed run's repeated steps: the last record wins)."""
    by_step = {int(r["step"]): r for r in metrics_records(metrics_path) if _is_number(r.get("val/mIoU"))}
    if not by_step:
        return {}
    final_step = max(by_step)
    scored = [s for s in by_step if not math.isnan(by_step[s]["val/mIoU"])]
    best_step = max(scored, key=lambda s: (by_step[s]["val/mIoU"], -s)) if scored else None  # earliest of ties
    return {
        "final_step": final_step,
        "final_mIoU": by_step[final_step]["val/mIoU"],
        "final_pixel_acc": by_step[final_step].get("val/pixel_acc"),
        "best_step": best_step,
        "best_mIoU": by_step[best_step]["val/mIoU"] if best_step is not None else None,
    }


# What a run's log says about why a method did or did not help (docs/experiments.md): D's loss and
# accuracies (real/fake, or source/target), the share of unlabeled pixels (AdvSemiSeg) or images
# (s4GAN) self-training took, G's supervised loss. Averaged over the last quarter of the run.
DIAGNOSTICS = ("loss_seg", "loss_d", "d_acc_real", "d_acc_fake", "d_acc_source", "d_acc_target",
               "semi_pixel_ratio", "st_image_ratio", "d_confidence_auroc", "d_mask_precision")
# Logged at evaluations under diag/ (does D know which of G's pixels are right?), the rest under train/.
DIAGNOSTIC_PREFIX = {"d_confidence_auroc": "diag", "d_mask_precision": "diag"}


def read_train_diagnostics(metrics_path: Path, keys: tuple[str, ...] = DIAGNOSTICS) -> dict[str, float]:
    """The mean of each ``train/<key>`` (``diag/<key>``, :data:`DIAGNOSTIC_PREFIX`) a run logged
    over the last quarter of its steps (steps past 3/4 of its last logged step); keys it never
    logged are left out."""
    records = list(metrics_records(metrics_path))
    if not records:
        return {}
    since = 0.75 * max(r["step"] for r in records)
    values: dict[str, list[float]] = {}
    for record in records:
        if record["step"] > since:
            for key in keys:
                value = record.get(f"{DIAGNOSTIC_PREFIX.get(key, 'train')}/{key}")
                if _is_number(value) and math.isfinite(value):
                    values.setdefault(key, []).append(value)
    return {key: statistics.fmean(values[key]) for key in keys if key in values}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ------------------------------------------------------------------------------ running


def run_dir_for(out: Path, row: Row, seed: int) -> Path:
    return out / row.slug / f"seed{seed}"


def command_for(grid: Grid, row: Row, seed: int, run_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "segadv.train", "--config", row.config, "--run-dir", str(run_dir),
               *row.overrides, *grid.common_overrides, f"train.seed={seed}"]
    if run_dir.exists():
        command += ["--resume", "auto"]
    return command


def run_identity(command: list[str]) -> list[str]:
    """What makes a run's result: the config and overrides, not the interpreter, run dir or resume."""
    args, identity = command[3:], []
    while args:
        arg, args = args[0], args[1:]
        if arg in ("--run-dir", "--resume"):
            args = args[1:]
        else:
            identity.append(arg)
    return identity


def config_sha256(config: str) -> Optional[str]:
    """SHA-256 of the file a row's config (a path or a shipped name) means; None: unreadable."""
    try:
        return hashlib.sha256(resolve_config(config).read_bytes()).hexdigest()
    except (OSError, UserError):
        return None


def stale_reason(done: dict[str, Any], row: Row, command: list[str]) -> Optional[str]:
    """Why a finished run no longer matches its grid row (None: it does)."""
    if run_identity(done.get("command", [])) != run_identity(command):
        return f"it ran {' '.join(run_identity(done.get('command', [])))}"
    if done.get("config_sha256") and done["config_sha256"] != config_sha256(row.config):
        return f"{row.config} has changed since"
    return None


def max_steps_of(run_dir: Path) -> Optional[int]:
    """``train.max_steps`` from the config the trainer saved in the run dir (None: unreadable)."""
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        value = saved["train"]["max_steps"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return value if _is_number(value) else None


@dataclass
class _Interrupt:
    requested: bool = False


@contextlib.contextmanager
def deferred_ctrl_c() -> Iterator[_Interrupt]:
    """While a run is going, the first Ctrl-C only takes note: the trainer (same process group)
    got it too and stops at its next step with a checkpoint. A second one interrupts at once."""
    state = _Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handle(signum: int, frame: Optional[FrameType]) -> None:
        if state.requested:
            raise KeyboardInterrupt
        state.requested = True
        log.warning("Ctrl-C: letting the run stop at its next step and save a checkpoint (Ctrl-C again: stop now)")

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)


def launch(command: list[str], log_path: Path) -> tuple[int, float, bool]:
    """Runs the command with its output appended to ``log_path``: exit code, wall seconds, and
    whether Ctrl-C was pressed meanwhile."""
    start = time.perf_counter()
    with deferred_ctrl_c() as interrupt, open(log_path, "a", encoding="utf-8") as log_file:  # never an unread pipe
        code = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT).returncode
    return code, time.perf_counter() - start, interrupt.requested


def record_attempt(run_dir: Path, wall: float, code: int) -> list[dict[str, Any]]:
    path = run_dir / ATTEMPTS_FILE
    try:
        attempts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        attempts = []
    attempts.append({"wall_s": round(wall, 1), "exit_code": code})
    atomic_write_text(path, json.dumps(attempts) + "\n")
    return attempts


def log_tail(run_dir: Path, lines: int = 20) -> str:
    text = (run_dir / LOG_FILE).read_text(encoding="utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def run_one(grid: Grid, row: Row, seed: int, out: Path) -> bool:
    """Runs (or continues) one run; True when it finished (now or before)."""
    run_dir = run_dir_for(out, row, seed)
    command = command_for(grid, row, seed, run_dir)
    if (run_dir / DONE_FILE).is_file():
        stale = stale_reason(json.loads((run_dir / DONE_FILE).read_text(encoding="utf-8")), row, command)
        if stale:
            log.warning("skip (done, but %s; delete %s to run it again): %s, seed %d", stale, run_dir, row.name, seed)
        else:
            log.info("skip (done): %s, seed %d", row.name, seed)
        return True
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("run: %s, seed %d: %s", row.name, seed, " ".join(command))
    code, wall, interrupted = launch(command, run_dir / LOG_FILE)
    attempts = record_attempt(run_dir, wall, code)
    if interrupted:
        log.warning("interrupted: %s, seed %d (exit %d); run again to continue it", row.name, seed, code)
        raise KeyboardInterrupt
    if code != 0:
        log.error("failed (exit %d): %s, seed %d; last lines of %s:\n%s", code, row.name, seed,
                  run_dir / LOG_FILE, log_tail(run_dir))
        return False
    metrics = read_val_metrics(run_dir / "metrics.jsonl")
    max_steps = max_steps_of(run_dir)
    if max_steps is not None and metrics.get("final_step") != max_steps:
        log.error("stopped early (a signal?) at step %s of %d: %s, seed %d; run again to continue it",
                  metrics.get("final_step", 0), max_steps, row.name, seed)
        return False
    done = {"row": row.name, "seed": seed, "command": command, "config_sha256": config_sha256(row.config),
            "wall_s": round(sum(a["wall_s"] for a in attempts), 1),
            "attempts_wall_s": [a["wall_s"] for a in attempts], **metrics}
    atomic_write_text(run_dir / DONE_FILE, json.dumps(done, indent=1) + "\n")
    log.info("done: %s, seed %d in %.0f s: final mIoU %.4f, best %.4f (step %s)", row.name, seed, wall,
             _or_nan(done.get("final_mIoU")), _or_nan(done.get("best_mIoU")), done.get("best_step"))
    return True


def _or_nan(value: Optional[float]) -> float:
    return float("nan") if value is None else value


# ------------------------------------------------------------------------------ statistics


def seeds_wanted(diff: Optional[float], std: Optional[float], baseline_std: Optional[float]) -> int:
    """At least MIN_SEEDS; MIN_SEEDS_CLOSE where |diff| is within two standard deviations (the
    larger of the two rows'), or where a spread is not known yet."""
    if diff is None or std is None or baseline_std is None:
        return MIN_SEEDS
    return MIN_SEEDS_CLOSE if abs(diff) <= 2 * max(std, baseline_std) else MIN_SEEDS


def compare_rows(row: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """The comparison keys of ``row`` against ``baseline`` (both collected result rows)."""
    compared: dict[str, Any] = {"baseline": baseline["name"]}
    for metric, prefix in (("final_mIoU", ""), ("best_mIoU", "best_")):
        ours, theirs = _by_seed(row, metric), _by_seed(baseline, metric)
        welch = welch_test(list(ours.values()), list(theirs.values()))
        compared.update({prefix + key: value for key, value in welch.items()})
        compared[prefix + "paired"] = paired_test(ours, theirs)
    wanted = seeds_wanted(compared["diff"], row["final_std"], baseline["final_std"])
    compared["seeds_wanted"] = wanted
    short = [r for r in (row, baseline) if r["n"] < wanted]
    compared["seeds_note"] = None if not short else (
        f"{row['name']!r} vs {baseline['name']!r}: {row['n']} and {baseline['n']} finished seeds, {wanted} wanted"
        + (" (Δ final within two standard deviations)" if wanted == MIN_SEEDS_CLOSE else ""))
    return compared


def _by_seed(row: dict[str, Any], metric: str) -> dict[int, float]:
    return {r["seed"]: r[metric] for r in row["runs"] if r[metric] is not None}


# ------------------------------------------------------------------------------ table


def _mean_std(values: list[float]) -> tuple[Optional[float], Optional[float]]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def _logged(items: list[dict[str, Any]]) -> list[str]:
    """The :data:`DIAGNOSTICS` any of ``items`` (runs or rows) has, in their order."""
    return [k for k in DIAGNOSTICS if any(k in item.get("diagnostics", {}) for item in items)]


def _mean_diagnostics(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each diagnostic's mean over the runs that logged it."""
    return {k: statistics.fmean(r["diagnostics"][k] for r in runs if k in r["diagnostics"]) for k in _logged(runs)}


def collect_results(grid: Grid, out: Path) -> dict[str, Any]:
    rows = []
    for row in grid.rows:
        runs = []
        for seed in grid.seeds_of(row):
            path = run_dir_for(out, row, seed) / DONE_FILE
            if path.is_file():
                done = json.loads(path.read_text(encoding="utf-8"))
                runs.append({"seed": seed, "run_dir": str(path.parent),
                             **{k: done.get(k) for k in ("final_mIoU", "best_mIoU", "best_step", "final_step", "wall_s")},
                             "diagnostics": read_train_diagnostics(path.parent / "metrics.jsonl")})
        final_mean, final_std = _mean_std([r["final_mIoU"] for r in runs if r["final_mIoU"] is not None])
        best_mean, best_std = _mean_std([r["best_mIoU"] for r in runs if r["best_mIoU"] is not None])
        rows.append({"name": row.name, "config": row.config, "overrides": row.overrides,
                     "seeds": grid.seeds_of(row), "n": len(runs),
                     "final_mean": final_mean, "final_std": final_std, "best_mean": best_mean, "best_std": best_std,
                     "wall_mean_s": statistics.fmean([r["wall_s"] for r in runs]) if runs else None,
                     "diagnostics": _mean_diagnostics(runs), "runs": runs})
    by_name = {r["name"]: r for r in rows}
    for row, result in zip(grid.rows, rows):
        baseline = grid.baseline_of(row)
        if baseline is not None:
            result.update(compare_rows(result, by_name[baseline]))
    total = sum(r["wall_s"] or 0 for row in rows for r in row["runs"])
    return {"grid": grid.name, "seeds": grid.seeds, "common_overrides": grid.common_overrides,
            "baseline": grid.baseline, "total_wall_s": round(total, 1), "rows": rows}


def _points(mean: Optional[float], std: Optional[float]) -> str:
    if mean is None:
        return "-"
    return f"{100 * mean:.1f} ± {100 * std:.1f}" if std is not None else f"{100 * mean:.1f} ± -"


def _test_cell(test: Optional[dict[str, Any]], paired: bool = False) -> str:
    if test is None or test["diff"] is None:
        return "-"
    n = f"{len(test['seeds'])} seeds, " if paired else ""
    if test["t"] is None:
        stats = "t -"
    else:
        stats = f"t {test['t']:.2f}, " + ("p < 0.001" if test["p"] < 0.0005 else f"p {test['p']:.3f}")
    return f"{100 * test['diff']:+.1f} ({n}{stats})"


def markdown_table(results: dict[str, Any]) -> str:
    seeds = results["seeds"]
    compared = any("baseline" in row for row in results["rows"])
    lines = [
        f"Grid `{results['grid']}`, seeds {', '.join(map(str, seeds))}; total wall time "
        f"{results['total_wall_s'] / 60:.1f} min. val mIoU in points (mean ± sample std over seeds).",
        "",
        "| row | n | final mIoU (mean ± std) | best mIoU (mean ± std) | per-seed final | wall (s, mean) |"
        + (" vs | Δ final (Welch) | Δ final (paired) | Δ best (Welch) |" if compared else ""),
        "|---|---|---|---|---|---|" + ("---|---|---|---|" if compared else ""),
    ]
    notes = []
    for row in results["rows"]:
        by_seed = {r["seed"]: r for r in row["runs"]}
        row_seeds = row.get("seeds", seeds)
        per_seed = " / ".join(
            f"{100 * by_seed[s]['final_mIoU']:.1f}" if s in by_seed and by_seed[s]["final_mIoU"] is not None else "missing"
            for s in row_seeds
        )
        if row_seeds != seeds:
            per_seed += f" (seed{'s' if len(row_seeds) > 1 else ''} {', '.join(map(str, row_seeds))})"
        wall = f"{row['wall_mean_s']:.0f}" if row["wall_mean_s"] is not None else "-"
        line = (f"| {row['name']} | {row['n']}/{len(row_seeds)} | {_points(row['final_mean'], row['final_std'])} | "
                f"{_points(row['best_mean'], row['best_std'])} | {per_seed} | {wall} |")
        if compared and "baseline" in row:
            best = {"diff": row["best_diff"], "t": row["best_t"], "p": row["best_p"]}
            line += (f" {row['baseline']} | {_test_cell(row)} | {_test_cell(row['paired'], paired=True)} | "
                     f"{_test_cell(best)} |")
            if row["seeds_note"]:
                notes.append(f"- More seeds wanted: {row['seeds_note']}.")
        elif compared:
            line += " - | - | - | - |"
        lines.append(line)
    if compared:
        lines += ["", "Δ: difference of the means in points against the row named under vs, with Welch's t and "
                  "its two-sided p; paired: the mean per-seed difference over the seeds both rows finished, paired "
                  f"t and p. Rows want {MIN_SEEDS} seeds, {MIN_SEEDS_CLOSE} where Δ final is within two standard "
                  "deviations.", *([""] + notes if notes else [])]
    return "\n".join(lines + diagnostics_table(results["rows"])) + "\n"


def diagnostics_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: each row's :data:`DIAGNOSTICS` (those any row logged), or none at all."""
    keys = _logged(rows)
    if not keys:
        return []
    lines = ["", "Diagnostics: the mean of each logged `train/` value (`diag/` for d_confidence_auroc and "
             "d_mask_precision, measured at evaluations) over the last quarter of a run, then over its seeds "
             "(- : not logged by that method). A CE-only row's D trains but reaches nothing.", "",
             "| row | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{row['diagnostics'][k]:.3f}" if k in row.get("diagnostics", {}) else "-" for k in keys]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return lines


def write_table(grid: Grid, out: Path, stem: str = "results") -> str:
    results = collect_results(grid, out)
    table = markdown_table(results)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{stem}.json", json.dumps(results, indent=1) + "\n")
    atomic_write_text(out / f"{stem}.md", table)
    for row in results["rows"]:
        if row.get("seeds_note"):
            log.warning("more seeds wanted: %s", row["seeds_note"])
    return table


def warn_few_seeds(grid: Grid) -> None:
    """Before running: a row in a comparison that will run fewer than MIN_SEEDS seeds."""
    pairs = [(row.name, grid.baseline_of(row)) for row in grid.rows if grid.baseline_of(row) is not None]
    compared = {name for pair in pairs for name in pair}
    for row in grid.rows:
        if row.name in compared and len(grid.seeds_of(row)) < MIN_SEEDS:
            log.warning("row %r runs %d seed(s); a comparison wants at least %d (%d where the difference is "
                        "within two standard deviations)", row.name, len(grid.seeds_of(row)), MIN_SEEDS, MIN_SEEDS_CLOSE)


# ------------------------------------------------------------------------------ CLI


def dry_run_line(grid: Grid, row: Row, seed: int, run_dir: Path) -> str:
    command = command_for(grid, row, seed, run_dir)
    if not (run_dir / DONE_FILE).is_file():
        return " ".join(command)
    stale = stale_reason(json.loads((run_dir / DONE_FILE).read_text(encoding="utf-8")), row, command)
    return f"done (but {stale})" if stale else "done"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="experiment", description=__doc__.split("\n\n")[0])
    parser.add_argument("grid", help="the grid YAML, or the name of a shipped one (--list-grids)")
    parser.add_argument("--list-grids", action=ListShipped, folder=EXPERIMENTS_DIR,
                        help="list the shipped grids (configs/experiments/) and exit")
    parser.add_argument("--out", type=Path, help="output directory (default: runs/experiments/<name>)")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the grid's seeds")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--table-only", action="store_true", help="write the table from finished runs")
    parser.add_argument("--baseline", metavar="ROW",
                        help="compare every other row with ROW instead of the grid's baselines; the table goes to "
                             "results_vs_<row>.md/.json beside results.md")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    grid = load_grid(resolve_config(args.grid, folder=EXPERIMENTS_DIR, what="grid"))
    if args.seeds:  # every row, those with seeds of their own included
        grid.seeds = check_seeds(list(args.seeds), "--seeds")
        for row in grid.rows:
            row.seeds = None
    out = args.out or Path("runs") / "experiments" / grid.name
    stem = "results"
    if args.baseline is not None:
        by_name = {row.name: row for row in grid.rows}
        if args.baseline not in by_name:
            raise UserError(f"--baseline {args.baseline!r}: no such row; rows: {', '.join(by_name)}")
        grid.baseline = args.baseline
        for row in grid.rows:
            row.baseline = None
        stem = f"results_vs_{by_name[args.baseline].slug}"
    warn_few_seeds(grid)
    failed = []
    if not args.table_only:
        for row in grid.rows:
            for seed in grid.seeds_of(row):
                run_dir = run_dir_for(out, row, seed)
                if args.dry_run:
                    sys.stdout.write(f"{row.name}, seed {seed}: {dry_run_line(grid, row, seed, run_dir)}\n")
                elif not run_one(grid, row, seed, out):
                    failed.append(f"{row.name} (seed {seed})")
    if args.dry_run:
        return 0
    table = write_table(grid, out, stem)
    sys.stdout.write(table)
    log.info("table: %s", out / f"{stem}.md")
    if failed:
        log.error("%d run(s) failed: %s", len(failed), ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sys.exit(main())
