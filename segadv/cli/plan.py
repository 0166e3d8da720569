"""segadv-plan: will this device map fit? segadv's own iteration dry-run on stand-in devices.

    segadv-plan [--config FILE|NAME] --device-map MAP [--steps N] [--gpu-memory GIB] [--max-batch]
                [--measure] [--json] [key=value ...]
    segadv-plan [--config FILE|NAME] --advise --gpus N --gpu-memory GIB [--steps N] [--json]
                [key=value ...]

Exit codes: 0 every device fits (or no --gpu-memory given), 3 a device does not (named, with by
how much) or --max-batch finds no batch that fits or --advise no setting, 2 a user error
(including a tensor the map does not place).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import asdict
from typing import Any, Callable

from typing import TYPE_CHECKING

from segadv.cli.args import HelpFormatter, add_config_arguments, docs_epilog, parse_args
from segadv.config import Config, load_config
from segadv.data.batch_checks import BatchTooSmall
from segadv.errors import UserError, cli_entry

if TYPE_CHECKING:  # the dry run imports torch when it runs: --help answers without it
    from segadv.plan.advise import Option
    from segadv.plan.dry_run import DevicePlan, Plan

log = logging.getLogger("segadv.plan")

EXIT_DOES_NOT_FIT = 3
GiB, MiB = 2**30, 2**20
# What a tensor count cannot see on a CUDA device (an assumption, stated beside every plan): the
# CUDA context with cuBLAS/cuDNN handles and a cuDNN workspace, and the caching allocator's
# block rounding and fragmentation over the counted peak.
CONTEXT_BYTES = 768 * MiB
ALLOCATOR_OVERHEAD = 0.10
ALLOWANCE_TEXT = (f"allowance per CUDA device (assumed, not measured): {CONTEXT_BYTES // MiB} MiB for the CUDA "
                  f"context, library handles and cuDNN workspace + {ALLOCATOR_OVERHEAD:.0%} of the peak for the "
                  "caching allocator's rounding and fragmentation")
MAX_BATCH_LIMIT = 4096


def allowance(device: str, peak: int) -> int:
    return CONTEXT_BYTES + int(ALLOCATOR_OVERHEAD * peak) if device.startswith("cuda") else 0


def peak_of_run(row: DevicePlan) -> int:
    """The most live at once over the run: the iterations', the evaluation's or a save's and
    resume's, whichever is most."""
    return max(row.peak_bytes, row.evaluation_peak_bytes, row.checkpoint_peak_bytes)


def need(name: str, row: DevicePlan) -> int:
    return peak_of_run(row) + allowance(name, peak_of_run(row))


def shortfalls(plan: Plan, budget: int | None) -> dict[str, int]:
    """Bytes by which each CUDA device misses ``budget`` (none: it fits). The host is not budgeted."""
    if budget is None:
        return {}
    short = {}
    for name, row in plan.devices.items():
        if name.startswith("cuda") and need(name, row) > budget:
            short[name] = need(name, row) - budget
    return short


def with_batch(cfg: Config, batch_size: int) -> Config:
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"batch_size": batch_size})})


def largest_batch(cfg: Config, steps: int, budget: int) -> tuple[int | None, Plan | None]:
    """The largest ``data.batch_size`` whose dry run fits every device, and its plan (None, None
    when none fits; a batch too small to train, e.g. one sample through BatchNorm, does not fit).

    A device's need grows affinely with the batch, so each next probe is where the line through
    the two probes nearest the budget meets it (kept strictly between the largest fit and the
    smallest miss known; bisection while fewer than two probes trained or where the line leaves that
    bracket), and the search ends when
    those are neighbours or the fit reaches ``MAX_BATCH_LIMIT``. With ``train.accumulation_steps``
    K, the batches searched are multiples of K (the search counts in K-sample units)."""
    from segadv.plan.dry_run import IterationFails, dry_run

    unit = cfg.train.accumulation_steps
    plans: dict[int, Plan] = {}
    excess: dict[int, int] = {}
    untrainable: set[int] = set()

    def probe(batch: int) -> None:
        try:
            plans[batch] = dry_run(with_batch(cfg, batch * unit), steps)
        except (IterationFails, BatchTooSmall) as err:
            if batch * unit >= cfg.data.batch_size:
                raise
            log.info("batch %d: does not train (%s)", batch * unit, str(err).splitlines()[0])
            untrainable.add(batch)
            excess[batch] = 1  # a miss for the bounds; the line fit below leaves it out
            return
        excess[batch] = max((need(name, row) - budget
                             for name, row in plans[batch].devices.items() if name.startswith("cuda")), default=-1)
        log.info("batch %d: %s", batch * unit, "fits" if excess[batch] <= 0 else f"{excess[batch] / GiB:.2f} GiB over")

    first = cfg.data.batch_size // unit
    limit = MAX_BATCH_LIMIT // unit
    probe(first)
    probe(first * 2 if excess[first] <= 0 else max(first // 2, 1))
    while True:
        fit = max((b for b, e in excess.items() if e <= 0), default=0)
        miss = min((b for b, e in excess.items() if e > 0), default=None)
        if miss is not None and miss == fit + 1 or fit >= limit:
            return (fit * unit, plans[fit]) if fit else (None, None)
        trained = sorted((b for b in excess if b not in untrainable), key=lambda n: abs(excess[n]))
        upper = limit + 1 if miss is None else miss
        guess = fit * 2 if miss is None else (fit + miss) // 2
        if len(trained) >= 2:
            a, b = trained[:2]  # the two probes nearest the budget
            slope = (excess[b] - excess[a]) / (b - a)
            if slope > 0:
                guess = int(a - excess[a] / slope)
        if miss is not None and not fit < guess < miss:
            # The line leaves the bracket: the need is not affine there (an evaluation's peak, which
            # the batch does not move, sets it at small batches; with accumulation up to large ones).
            guess = (fit + miss) // 2
        probe(min(max(guess, fit + 1), upper - 1))


def max_batch_text(batch: int) -> str:
    """The search stops at MAX_BATCH_LIMIT: a fit there is a lower bound."""
    return f"at least {batch} (the search's cap)" if batch >= MAX_BATCH_LIMIT else str(batch)


def plan_json(plan: Plan, budget: int | None, max_batch: int | None, searched: bool) -> dict[str, Any]:
    short = shortfalls(plan, budget)
    devices = {}
    for name, row in plan.devices.items():
        entry = {k: v for k, v in asdict(row).items() if k != "device" and v is not None}
        entry["allowance_bytes"] = allowance(name, peak_of_run(row))
        entry["need_bytes"] = need(name, row)
        entry["fits"] = name not in short
        devices[name] = entry
    out: dict[str, Any] = {
        "devices": devices,
        "transfer_bytes_per_iteration": plan.transfer_bytes_per_iteration,
        "host_to_device_bytes_per_iteration": plan.host_to_device_bytes_per_iteration,
        "fits": not short,
        "gpu_memory_bytes": budget,
        "steps": plan.steps,
        "steps_run": plan.steps_run,
    }
    if searched:
        out["max_batch"] = max_batch
        out["max_batch_is_lower_bound"] = bool(max_batch and max_batch >= MAX_BATCH_LIMIT)
    return out


def plan_table(plan: Plan, budget: int | None) -> str:
    short = shortfalls(plan, budget)
    unit, size = ("GiB", GiB) if max(r.peak_bytes for r in plan.devices.values()) >= GiB else ("MiB", MiB)

    def gib(n: int) -> str:
        return f"{n / size:.2f}"

    measured = any(row.measured_peak_bytes is not None for row in plan.devices.values())
    columns = ["device", "params", "grads", "optimizer", "activations", "peak", "peak at step", "evaluation",
               "checkpoint", "+allowance", "need"]
    if measured:
        columns += ["measured peak", "allocator peak"]
    if budget is not None:
        columns.append(f"fits {budget / GiB:.2f} GiB")
    rows = []
    for name, row in plan.devices.items():
        extra = allowance(name, peak_of_run(row))
        extra_cells = [_measured(row.measured_peak_bytes, row, gib), _measured(row.allocator_peak_bytes, row, gib)]
        cells = [name, gib(row.params_bytes), gib(row.grads_bytes), gib(row.optimizer_bytes),
                 gib(row.activations_bytes), gib(row.peak_bytes),
                 "build" if row.peak_step is None else str(row.peak_step), gib(row.evaluation_peak_bytes),
                 gib(row.checkpoint_peak_bytes), gib(extra), gib(need(name, row))]
        if measured:
            cells += extra_cells
        if budget is not None:
            cells.append("no" if name in short else "yes" if name.startswith("cuda") else "(host)")
        rows.append(cells)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(columns, widths)))]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.append(f"{unit}; each column its own largest over the iterations, peak the most live at once "
                 "(tensor bytes, as torch.cuda.max_memory_allocated counts them); evaluation: the most live during "
                 "an evaluation (G at data.val_batch_size, the panels); checkpoint: during a save and a resume's "
                 "load; need: the largest of the three + allowance")
    lines.append(ALLOWANCE_TEXT)
    lines.append(f"between devices per iteration: {plan.transfer_bytes_per_iteration / MiB:.1f} MiB; "
                 f"host to devices: {plan.host_to_device_bytes_per_iteration / MiB:.1f} MiB")
    lines.extend(f"note: {note}" for note in plan.notes)
    return "\n".join(lines)


def _measured(value: int | None, row: DevicePlan, fmt: Callable[[int], str]) -> str:
    if value is None:
        return "-"
    return f"{fmt(value)} ({(value - row.peak_bytes) / row.peak_bytes:+.1%})" if row.peak_bytes else fmt(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="segadv-plan", formatter_class=HelpFormatter,
        description="Dry-run segadv's own training iteration on stand-in devices: placement checked, peak "
                    "memory per device, before the GPUs exist.",
        epilog=docs_epilog("planning.md"))
    add_config_arguments(parser, "default: default, the embedded demo")
    parser.add_argument("--device-map", help="the map to plan, e.g. g:1,d:0 (CUDA indices 0-127, none need exist) or cpu")
    parser.add_argument("--steps", type=int, default=2, metavar="N", help="iterations to run (default 2)")
    parser.add_argument("--gpu-memory", type=float, metavar="GIB", help="memory of each GPU, GiB: judge the fit")
    parser.add_argument("--max-batch", action="store_true",
                        help="find the largest data.batch_size that fits every device (needs --gpu-memory)")
    parser.add_argument("--measure", action="store_true",
                        help="also run the iterations for real on the map's devices and show the real peaks")
    parser.add_argument("--advise", action="store_true",
                        help="the settings that fit --gpus GPUs of --gpu-memory each (device map, per-network dtype, "
                             "activation checkpointing, gradient accumulation; the batch kept), best first")
    parser.add_argument("--gpus", type=int, metavar="N", help="with --advise: how many GPUs there are")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides (the keys: segadv-train --help-config)")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), sys.argv[1:] if argv is None else argv)
    from segadv.plan import torch_surfaces
    from segadv.plan.dry_run import dry_run, measure
    from segadv.training.process import setup_logging

    setup_logging(level=logging.WARNING if args.json else logging.INFO)
    if args.steps < 1:
        raise UserError(f"--steps: at least 1, got {args.steps}")
    if args.gpu_memory is not None and not (math.isfinite(args.gpu_memory) and args.gpu_memory > 0):
        raise UserError(f"--gpu-memory: a finite size in GiB above 0, got {args.gpu_memory}")
    if args.max_batch and args.gpu_memory is None:
        raise UserError("--max-batch needs --gpu-memory (the budget to fit)")
    # A torch the planner cannot run on is refused before any config is read or network built.
    torch_surfaces.require(*torch_surfaces.PLAN, *(torch_surfaces.MEASURE if args.measure else ()))
    if args.advise:
        return advise_main(args)
    if args.gpus is not None:
        raise UserError("--gpus goes with --advise")
    cfg = load_config(args.config, args.overrides)
    if args.device_map is not None:
        cfg.device_map = args.device_map
    budget = None if args.gpu_memory is None else int(args.gpu_memory * GiB)
    max_batch = None
    if args.max_batch:
        max_batch, plan = largest_batch(cfg, args.steps, budget)
        if plan is None:
            plan = dry_run(cfg, args.steps)  # the configured batch, to show by how much it misses
        else:
            cfg = with_batch(cfg, max_batch)
    else:
        plan = dry_run(cfg, args.steps)
    if args.measure:
        measure(cfg, plan, args.steps)
    if args.json:
        print(json.dumps(plan_json(plan, budget, max_batch, args.max_batch), indent=1))
    else:
        batch = "" if not args.max_batch else (
            f"largest data.batch_size that fits: {max_batch_text(max_batch)}\n" if max_batch
            else "no batch size fits (not even the smallest that trains)\n")
        print(f"plan of {cfg.method.name}, data.batch_size {cfg.data.batch_size}, {len(plan.steps_run)} iterations "
              f"at steps {', '.join(map(str, plan.steps_run))} ({plan.seconds:.1f} s), device map {cfg.device_map}:\n"
              f"{batch}{plan_table(plan, budget)}")
    short = shortfalls(plan, budget)
    if args.max_batch and not max_batch:
        for name, missing in short.items():
            log.error("%s does not fit in %.2f GiB at data.batch_size %d: %.2f GiB short", name, budget / GiB,
                      cfg.data.batch_size, missing / GiB)
        return EXIT_DOES_NOT_FIT
    if short:
        for name, missing in short.items():
            log.error("%s does not fit in %.2f GiB: %.2f GiB short", name, budget / GiB, missing / GiB)
        return EXIT_DOES_NOT_FIT
    return 0


def advise_main(args: argparse.Namespace) -> int:
    """--advise: plan the candidate settings, print those that fit, best first; 3 when none does."""
    from segadv.plan.advise import advise

    if args.gpus is None or args.gpus < 1:
        raise UserError(f"--advise needs --gpus N (at least 1), got {args.gpus}")
    if args.gpu_memory is None:
        raise UserError("--advise needs --gpu-memory (each GPU's memory, GiB)")
    if args.device_map is not None or args.max_batch or args.measure:
        raise UserError("--advise chooses the device map itself; leave out --device-map, --max-batch and --measure")
    budget = int(args.gpu_memory * GiB)
    if budget <= CONTEXT_BYTES:
        options = []  # no setting can fit: the allowance alone is more than a GPU holds
        log.error("the allowance alone (%d MiB per GPU) is more than --gpu-memory %.2f GiB", CONTEXT_BYTES // MiB,
                  args.gpu_memory)
    else:
        # The dry runs' own build logs, once per setting tried, would drown the advice.
        quiet, saved = logging.getLogger("segadv"), logging.getLogger("segadv").level
        quiet.setLevel(logging.WARNING)
        try:
            options = advise(args.config, args.overrides, args.gpus, lambda plan: not shortfalls(plan, budget),
                             args.steps)
        finally:
            quiet.setLevel(saved)
    if args.json:
        print(json.dumps({"gpus": args.gpus, "gpu_memory_bytes": budget,
                          "options": [option_json(option) for option in options]}, indent=1))
    else:
        print(advice_table(options, args.gpus, budget))
    if not options:
        log.error("no setting fits %d GPU(s) of %.2f GiB", args.gpus, budget / GiB)
        return EXIT_DOES_NOT_FIT
    return 0


def option_json(option: Option) -> dict[str, Any]:
    return {
        "device_map": option.device_map,
        "overrides": option.overrides,
        "flops_per_iteration": option.flops,
        "transfer_bytes_per_iteration": option.plan.transfer_bytes_per_iteration,
        "devices": {name: {"peak_bytes": peak_of_run(row), "need_bytes": need(name, row),
                           "flops_per_iteration": row.flops_per_iteration}
                    for name, row in option.plan.devices.items()},
    }


def advice_table(options: list[Option], gpus: int, budget: int) -> str:
    lines = [f"settings that fit {gpus} GPU(s) of {budget / GiB:.2f} GiB, best first (compute per iteration, "
             "then bytes between devices):"]
    for rank, option in enumerate(options, 1):
        needs = ", ".join(f"{name} {need(name, row) / GiB:.2f} GiB" for name, row in option.plan.devices.items()
                          if name.startswith("cuda"))
        lines.append(f"{rank}. --device-map {option.device_map} {' '.join(option.overrides)}\n"
                     f"   {option.flops / 1e9:.1f} GFLOP per iteration, "
                     f"{option.plan.transfer_bytes_per_iteration / MiB:.1f} MiB between devices; need: {needs}")
    if not options:
        lines.append("none")
    lines.append(ALLOWANCE_TEXT)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
