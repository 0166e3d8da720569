#!/usr/bin/env python
"""segadv-plan's predicted peak on the ``cpu`` map against a real run's, in one process.

The real run is ``segadv.training.loop.train`` itself (the loader's own batches, the panel images, the
evaluations, the checkpoint saves) for a few steps with every loss term on from the first
(warm-ups and schedule starts at 0), under torch.profiler's memory events: the CPU allocator's
peak over the whole run, the model's build included. The plan is ``segadv-plan``'s dry run of the
same config. No weights are read (``init`` and the encoder's weights off, on both sides).

    python tools/plan_vs_run.py [--config NAME] [--steps N] [key=value ...]

Prints ``plan_peak``, ``run_peak`` (bytes) and ``deviation`` (run / plan - 1).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile

from torch.profiler import ProfilerActivity, profile

from segadv.cli.args import add_config_arguments
from segadv.config import load_config
from segadv.errors import cli_entry
from segadv.plan.fit import peak_of_run
from segadv.plan.dry_run import dry_run, plan_config, profiler_peak
from segadv.training.process import setup_logging
from segadv.training.loop import train

# Every term on from the first step, so a few steps reach the run's full iteration.
SCHEDULES_AT_ZERO = ("loss.adv_warmup_steps=0", "method.advsemiseg.semi_start=0", "method.advsemiseg.semi_start_adv=0",
                     "method.s4gan.st_start=0")


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plan_vs_run.py", description=__doc__.splitlines()[0])
    add_config_arguments(parser, "default: default")
    parser.add_argument("--steps", type=int, default=2, help="steps of the real run (default 2)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging(level=logging.WARNING)
    steps = args.steps
    cfg = load_config(args.config, [*SCHEDULES_AT_ZERO, f"train.max_steps={steps}", f"train.eval_every={steps}",
                                     f"checkpoint.every={steps}", "log.progress_bar=false", *args.overrides])
    cfg.device_map = "cpu"
    cfg = plan_config(cfg)
    plan = dry_run(cfg, steps=steps)
    with tempfile.TemporaryDirectory() as run_dir:
        cfg.run_dir = run_dir
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            train(cfg)
    planned, real = peak_of_run(plan.devices["cpu"]), profiler_peak(prof)
    print(f"plan_peak {planned}\nrun_peak {real}\ndeviation {real / planned - 1:+.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
