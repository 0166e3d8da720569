"""segadv-train's arguments: its parser, the config they resolve to, and what the command answers
without starting a run (--print-config; --help-config in the parser).

A library module, torch-free, shared by the console script (segadv/train_cli.py, which imports the
training machinery only when a run starts) and ``python -m segadv.train``: neither command imports
the other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from segadv.cli_args import HelpFormatter, add_config_arguments, docs_epilog, parse_args, path_argument


class HelpConfig(argparse.Action):
    """``--help-config [PREFIX]``: every config key under PREFIX with its type, schema default and
    meaning (segadv/config/keys.py), then exit 0, like --help."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs="?", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace, prefix, option_string=None) -> None:
        from segadv.config.keys import key_listing
        from segadv.errors import UserError

        try:
            sys.stdout.write(key_listing(prefix or ""))
        except UserError as err:
            parser.exit(2, f"error: {err}\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="segadv-train", formatter_class=HelpFormatter,
        description="Train a DeepLab generator (G) against a fully convolutional discriminator (D). The config "
                    "is built from --config, then the key=value overrides; a run writes its checkpoints, "
                    "metrics and TensorBoard logs to its run dir.",
        epilog=docs_epilog("training.md", "failures.md"),
    )
    add_config_arguments(parser, "default: default, the embedded demo; when resuming, RUN_DIR/config.yaml")
    parser.add_argument("--device-map", metavar="MAP",
                        help="where each network runs, e.g. g:1,d:0 (G on cuda:1, D on cuda:0), g:0+1,d:2 "
                             "(G on a DataParallel replica set) or cpu (default: cuda:0 if available, else cpu)")
    parser.add_argument("--run-dir", type=path_argument, metavar="DIR",
                        help="output directory (default: runs/<config>-<time>)")
    parser.add_argument("--resume", type=path_argument, metavar="auto|PATH",
                        help="continue from the newest complete checkpoint in the run dir (auto) or from PATH")
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="allow checkpoints that need arbitrary pickled code (off: weights only)")
    parser.add_argument("--force", action="store_true",
                        help="start even if the run dir looks too small for the checkpoints the run keeps")
    parser.add_argument("--nproc-per-node", type=int, metavar="N",
                        help="launch N processes on this node through torchrun (DDP)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (--config, then the overrides, --device-map and --run-dir) "
                             "as YAML and exit, starting nothing")
    parser.add_argument("--help-config", action=HelpConfig, metavar="PREFIX",
                        help="list every config key (under PREFIX, e.g. optim or train.max_steps) with its type, "
                             "default and meaning, and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. train.max_steps=2000 optim.generator.lr=1e-3 "
                             "(the keys: --help-config)")
    return parser


def resolved_config(args: argparse.Namespace):
    """The config a run of ``args`` trains: the file and the overrides (a resume without --config:
    the run's own, segadv/rundir.py), then --device-map and --run-dir."""
    if args.config is None and args.resume is not None and args.run_dir is not None:
        from segadv import rundir

        cfg = rundir.resume_config(Path(args.run_dir), args.resume, args.overrides, trusted=args.trust_checkpoint)
    else:
        from segadv.config import load_config

        cfg = load_config(args.config, args.overrides)
    if args.device_map is not None:
        cfg.device_map = args.device_map
    if args.run_dir is not None:
        cfg.run_dir = args.run_dir
    return cfg


def command(argv: list[str] | None, run: Callable[[argparse.Namespace, list[str]], int]) -> int:
    """segadv-train: parse ``argv``; print the resolved config, or hand the arguments to ``run``."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(build_parser(), argv)
    if args.print_config:
        from segadv.config.loading import config_yaml

        sys.stdout.write(config_yaml(resolved_config(args)))
        return 0
    return run(args, argv)
