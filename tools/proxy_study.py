"""How well the label-free scores pick a checkpoint (issue 51; docs/experiments.md "Choosing a
checkpoint without labels"): every ``step_<N>.pt`` of every finished run of a grid's output
folder scored again on its val split with segadv's own evaluation (``proxy/*`` and the val mIoU,
through ``segadv.training.run_data.evaluate_generator``, D's score included where the run has a D),
then per grid row and proxy:

- Spearman's rank correlation between the proxy (signed so that higher is better) and the val
  mIoU over all the row's checkpoints (every seed's), with its p;
- the regret: per run, the val mIoU of the checkpoint the labels pick minus that of the one the
  proxy picks, averaged over the row's seeds (0: the proxy picks as the labels do).

Then every grid's runs pooled: per proxy, and for keeping the last checkpoint, in how many runs it
picks the labels' checkpoint, and its mean and worst regret.

And D's health check (segadv/monitor/diagnostics.py ``DHealthWatch``, the run's own settings)
replayed over each run's logged ``train/*`` values: which runs it warned for, and their final mIoU.

    python tools/proxy_study.py runs/experiments/uda-mean-teacher --out runs/proxy-uda.json

Runs on the CPU (``--threads``); the re-evaluated mIoU of each checkpoint is checked against the
one the run logged at that step (the largest difference is reported).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("proxy_study")


def score_run(run_dir: Path) -> list[dict[str, Any]]:
    """Each step checkpoint of ``run_dir`` evaluated on the run's val split with every proxy."""
    import torch

    from segadv.checkpoint import load_weights
    from segadv.config import load_config
    from segadv.data import build_val_loader
    from segadv.parallel import parse_device_map
    from segadv.training.build import build_training
    from segadv.training.run_data import evaluate_generator

    cfg = load_config(run_dir / "config.yaml", saved=True)  # written by segadv: its old key names read as saved
    roles = type_of(cfg).networks(cfg)
    device_map = ",".join(f"{short(role)}:cpu" for role in roles)
    parts = build_training(cfg, parse_device_map(device_map))
    val_data = cfg.target_data if cfg.target_data is not None else cfg.data
    loader = build_val_loader(val_data, seed=cfg.train.seed, pin_memory=False)
    logged = logged_miou(run_dir)
    rows = []
    for step, path in step_checkpoints(run_dir):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        for role, net in parts.members():
            if role.trained:  # the student and D are scored; an untrained role (the teacher) is not read
                load_weights(checkpoint, net.module, role=role.name, name=str(path))
        result = evaluate_generator(cfg, parts, loader, proxies=True)
        rows.append({"step": step, "mIoU": result.metrics["mIoU"], "logged_mIoU": logged.get(step),
                     **result.proxies})
    return rows


def health_events(run_dir: Path) -> list[dict[str, Any]]:
    """The warnings D's health check gives over the run's log steps, replayed from metrics.jsonl."""
    from segadv.config import load_config
    from segadv.monitor.diagnostics import DHealthWatch

    cfg = load_config(run_dir / "config.yaml", saved=True)  # written by segadv: its old key names read as saved
    watch = DHealthWatch.for_run(cfg, type_of(cfg), announce=False)
    events = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        logged = {key.removeprefix("train/"): value for key, value in record.items() if key.startswith("train/")}
        if logged:
            events += [{"step": e.step, "since": e.since, "condition": e.label, "loss": e.loss}
                       for e in watch.update(int(record["step"]), logged) if not e.back]
    return events


def type_of(cfg: Any) -> Any:
    from segadv.methods.registry import method_class

    return method_class(cfg.method.name)


def short(role: str) -> str:
    from segadv.config.roles import role as role_of

    return role_of(role).short


def step_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in (run_dir / "checkpoints").glob("step_*.pt"):
        match = re.fullmatch(r"step_(\d+)\.pt", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def logged_miou(run_dir: Path) -> dict[int, float]:
    logged = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "val/mIoU" in record:
            logged[int(record["step"])] = float(record["val/mIoU"])
    return logged


def finished_runs(grid_out: Path) -> dict[str, list[Path]]:
    """Each row's finished run dirs (``<row>/seed<k>``), by row folder."""
    rows: dict[str, list[Path]] = {}
    for status in sorted(grid_out.glob("*/seed*/status.json")):
        if json.loads(status.read_text()).get("outcome") == "finished":
            rows.setdefault(status.parent.parent.name, []).append(status.parent)
    return rows


def regret(run: list[dict[str, Any]], key: str) -> float:
    """The val mIoU of the run's checkpoint the labels pick minus that of the one ``key`` picks
    (a ``proxy/*`` score in its direction, or ``last``: the last checkpoint)."""
    from segadv.config.schema import higher_is_better

    if key == "last":
        pick = run[-1]
    else:
        pick = max(run, key=lambda r: r[key] if higher_is_better(key) else -r[key])
    return max(r["mIoU"] for r in run) - pick["mIoU"]


def pooled(report: dict[str, Any]) -> str:
    """Every grid's runs together: per proxy (and the last checkpoint) how many runs it picks the
    labels' checkpoint in, its mean and worst regret (points)."""
    from segadv.config.schema import PROXY_SCORES

    runs = [run for grid in report.values() for row in grid["scores"].values() for run in row.values()]
    lines = ["| choice | picks the labels' checkpoint | mean regret | worst regret |", "|---|---|---|---|"]
    for key in [*(f"proxy/{name}" for name in PROXY_SCORES), "last"]:
        regrets = [100 * regret(run, key) for run in runs if key == "last" or all(key in r for r in run)]
        if regrets:
            lines.append(f"| {key} | {sum(r == 0 for r in regrets)} / {len(regrets)} | "
                         f"{sum(regrets) / len(regrets):.2f} | {max(regrets):.1f} |")
    return "\n".join(lines)


def summarise(scored: dict[str, dict[str, list[dict[str, Any]]]],
              health: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per row and proxy: Spearman over the row's checkpoints and the regret per run."""
    from scipy.stats import spearmanr

    from segadv.config.schema import PROXY_SCORES

    summary: dict[str, Any] = {}
    for row, runs in scored.items():
        per_proxy = {}
        for name, higher in PROXY_SCORES.items():
            key = f"proxy/{name}"
            points = [(r[key] if higher else -r[key], r["mIoU"]) for run in runs.values() for r in run if key in r]
            if len(points) < 3:
                continue
            rho, p = spearmanr([a for a, _ in points], [b for _, b in points])
            regrets = [regret(run, key) for run in runs.values() if all(key in r for r in run)]
            mean = sum(regrets) / len(regrets)
            std = math.sqrt(sum((x - mean) ** 2 for x in regrets) / (len(regrets) - 1)) if len(regrets) > 1 else 0.0
            per_proxy[name] = {"spearman": float(rho), "p": float(p), "n_checkpoints": len(points),
                               "regret_mean": mean, "regret_std": std, "regret_max": max(regrets),
                               "runs": len(regrets), "picks_as_labels": sum(r == 0 for r in regrets)}
        fired = [seed for seed, events in health.get(row, {}).items() if events]
        finals = {seed: run[-1]["mIoU"] for seed, run in runs.items()}
        summary[row] = {"proxies": per_proxy, "runs": len(runs),
                        "regret_of_last": sum(regret(run, "last") for run in runs.values()) / len(runs),
                        "health_fired": fired,
                        "final_fired": [finals[s] for s in fired],
                        "final_quiet": [finals[s] for s in finals if s not in fired]}
    return summary


def table(summary: dict[str, Any]) -> str:
    from segadv.config.schema import PROXY_SCORES

    names = list(PROXY_SCORES)
    lines = ["| row | runs | " + " | ".join(f"{n}: ρ (p) / regret" for n in names) + " | last: regret | D health fired |",
             "|---|---|" + "---|" * len(names) + "---|---|"]
    for row, s in summary.items():
        cells = []
        for n in names:
            c = s["proxies"].get(n)
            cells.append("-" if c is None else
                         f"{c['spearman']:+.2f} ({c['p']:.3f}) / {100 * c['regret_mean']:.1f} ± {100 * c['regret_std']:.1f}")
        fired = f"{len(s['health_fired'])}/{s['runs']}"
        lines.append(f"| {row} | {s['runs']} | " + " | ".join(cells) + f" | {100 * s['regret_of_last']:.1f} | {fired} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grids", nargs="+", type=Path, help="a grid's output folder (runs/experiments/<name>)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write (every score, the summary)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="a JSON file of runs already scored (read, and rewritten after each run): a run dir in "
                             "it is not scored again")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from segadv.fsutil import atomic_write_text

    cache: dict[str, Any] = json.loads(args.cache.read_text()) if args.cache and args.cache.is_file() else {}
    report: dict[str, Any] = {}
    for grid in args.grids:
        scored: dict[str, dict[str, list[dict[str, Any]]]] = {}
        health: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for row, run_dirs in finished_runs(grid).items():
            for run_dir in run_dirs:
                key = str(run_dir.resolve())
                if key not in cache:
                    cache[key] = {"scores": score_run(run_dir), "health": health_events(run_dir)}
                    if args.cache:
                        atomic_write_text(args.cache, json.dumps(cache) + "\n")
                health.setdefault(row, {})[run_dir.name] = cache[key]["health"]
                scored.setdefault(row, {})[run_dir.name] = rows = cache[key]["scores"]
                diff = max((abs(r["mIoU"] - r["logged_mIoU"]) for r in rows if r["logged_mIoU"] is not None),
                           default=float("nan"))
                log.info("%s/%s: %d checkpoints, largest |mIoU - logged| %.2e", row, run_dir.name, len(rows), diff)
        summary = summarise(scored, health)
        report[grid.name] = {"scores": scored, "health": health, "summary": summary}
        print(f"## {grid.name}\n\n{table(summary)}\n")
    print(f"## Pooled over every run\n\n{pooled(report)}\n")
    atomic_write_text(args.out, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
