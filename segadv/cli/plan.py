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

from segadv.cli.args import ArgumentParser, HelpFormatter, add_config_arguments, docs_epilog, parse_args
from segadv.config import load_config
from segadv.errors import UserError, cli_entry
from segadv.plan.fit import CONTEXT_BYTES, GiB, MiB, fitting_options, largest_batch, shortfalls, with_batch
from segadv.plan.report import advice_table, max_batch_text, option_json, plan_json, plan_table

log = logging.getLogger("segadv.plan")

EXIT_DOES_NOT_FIT = 3


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
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
    parser.add_argument("--world-size", type=int, metavar="N",
                        help="plan one rank of an N-process launch (default 1): parallel.<network>=fsdp shards its "
                             "parameters, gradients and optimizer state over the N ranks, ddp adds its gradient "
                             "buckets; with --advise: rank DDP, FSDP, the split, checkpointing and a frozen encoder "
                             "for N GPUs")
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
    if args.world_size is not None and args.world_size < 1:
        raise UserError(f"--world-size: the processes of the launch, at least 1, got {args.world_size}")
    world_size = 1 if args.world_size is None else args.world_size
    if args.measure and world_size > 1:
        raise UserError("--measure runs this process's iterations for real: it measures one process, not a "
                        f"--world-size {world_size} launch (tests/plan/test_plan_fsdp_measured.py measures FSDP on "
                        "gloo ranks)")
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
        max_batch, plan = largest_batch(cfg, args.steps, budget, world_size)
        if plan is None:
            plan = dry_run(cfg, args.steps, world_size)  # the configured batch, to show by how much it misses
        else:
            cfg = with_batch(cfg, max_batch)
    else:
        plan = dry_run(cfg, args.steps, world_size)
    if args.measure:
        measure(cfg, plan, args.steps)
    if args.json:
        print(json.dumps(plan_json(plan, budget, max_batch, args.max_batch), indent=1))
    else:
        batch = "" if not args.max_batch else (
            f"largest data.batch_size that fits: {max_batch_text(max_batch)}\n" if max_batch
            else "no batch size fits (not even the smallest that trains)\n")
        rank = "" if plan.world_size == 1 else f", one rank of {plan.world_size} processes"
        print(f"plan of {cfg.method.name}, data.batch_size {cfg.data.batch_size}, {len(plan.steps_run)} iterations "
              f"at steps {', '.join(map(str, plan.steps_run))} ({plan.seconds:.1f} s), device map {cfg.device_map}"
              f"{rank}:\n"
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
    if args.world_size is not None:
        return launch_main(args)
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
        options = fitting_options(args.config, args.overrides, args.gpus, budget, args.steps)
    if args.json:
        print(json.dumps({"gpus": args.gpus, "gpu_memory_bytes": budget,
                          "options": [option_json(option) for option in options]}, indent=1))
    else:
        print(advice_table(options, args.gpus, budget))
    if not options:
        log.error("no setting fits %d GPU(s) of %.2f GiB", args.gpus, budget / GiB)
        return EXIT_DOES_NOT_FIT
    return 0


def launch_main(args: argparse.Namespace) -> int:
    """--advise --world-size N: DDP, FSDP and the split, each without and with activation
    checkpointing and a frozen encoder, planned for N GPUs and ranked; 3 when none fits."""
    from segadv.plan.launch import advise_launch, launch_json, launch_table

    cards = args.world_size
    if args.gpus is not None and args.gpus != cards:
        raise UserError(f"--advise --world-size {cards} plans {cards} GPUs, one process each; --gpus {args.gpus} "
                        "says otherwise (leave --gpus out)")
    if args.gpu_memory is None:
        raise UserError("--advise needs --gpu-memory (each GPU's memory, GiB)")
    if args.device_map is not None or args.max_batch or args.measure:
        raise UserError("--advise chooses the device map itself; leave out --device-map, --max-batch and --measure")
    wrappers = [o for o in args.overrides if o.split("=")[0].startswith("parallel.")]
    if wrappers:
        raise UserError(f"--advise --world-size chooses each network's wrapper itself; leave out {' '.join(wrappers)}")
    budget = int(args.gpu_memory * GiB)
    quiet, saved = logging.getLogger("segadv"), logging.getLogger("segadv").level
    quiet.setLevel(logging.WARNING)  # each dry run's build logs, eight times over, would drown the advice
    try:
        options = advise_launch(lambda extra: load_config(args.config, [*args.overrides, *extra]), cards, budget,
                                args.steps)
    finally:
        quiet.setLevel(saved)
    if args.json:
        print(json.dumps(launch_json(options, cards, budget), indent=1))
    else:
        print(launch_table(options, cards, budget))
    if not any(option.fits for option in options):
        log.error("no way of training fits %d GPU(s) of %.2f GiB", cards, budget / GiB)
        return EXIT_DOES_NOT_FIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
