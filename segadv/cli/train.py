"""segadv-train: train G against D on the configured data.

    segadv-train [--config FILE|NAME] [--device-map MAP] [--run-dir DIR] [--resume auto|last|best|PATH] [key=value ...]
    segadv-train [--config FILE|NAME] [key=value ...] --print-config
    segadv-train --help-config [PREFIX]
    python -m segadv.cli.train ...            (the same command: what torchrun launches)

Its parser, the config the arguments resolve to and what the command answers without a run
(``--help``, ``--list-configs``, ``--print-config``, ``--help-config``) import no torch; a run imports
the training machinery (segadv/training/loop.py) only when it starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable

from segadv.cli.args import ArgumentParser, HelpFormatter, add_config_arguments, docs_epilog, parse_args, path_argument
from segadv.errors import cli_entry


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
    parser = ArgumentParser(
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
    parser.add_argument("--resume", type=path_argument, metavar="auto|last|best|PATH",
                        help="continue from the newest complete checkpoint in the run dir (auto), from its "
                             "checkpoints/last.pt (last) or checkpoints/best.pt (best), or from PATH")
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
    the run's own, segadv/training/run_dir.py), then --device-map and --run-dir."""
    if args.config is None and args.resume is not None and args.run_dir is not None:
        from segadv.training.run_dir import resume_config

        # --print-config changes nothing on disk: a garbled config.yaml is not moved aside for it.
        cfg = resume_config(Path(args.run_dir), args.resume, args.overrides, trusted=args.trust_checkpoint,
                            set_aside=not args.print_config)
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
    if args.resume in ("last", "best"):  # a run dir's own checkpoints/last.pt, best.pt
        from segadv.training.run_dir import named_checkpoint

        args.resume = named_checkpoint(args.resume, args.run_dir)
    if args.print_config:
        from segadv.config.loading import config_yaml

        sys.stdout.write(config_yaml(resolved_config(args)))
        return 0
    return run(args, argv)


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    """segadv-train's run: the training machinery is imported here, when a run starts."""
    from segadv.config.shipped import resolve_config
    from segadv.errors import Diverged
    from segadv.parallel import distributed
    from segadv.training.loop import train
    from segadv.training.process import setup_logging

    if args.nproc_per_node is not None:
        # Re-launch this command through torchrun (torch.distributed.run), one process per rank.
        from segadv.parallel.launch import launch_with_torchrun

        setup_logging(logging.WARNING)  # the launcher's own lines: signals passed on
        return launch_with_torchrun(args.nproc_per_node, argv)
    env = distributed.env_from()
    setup_logging(env=env)
    cfg = resolved_config(args)
    name = Path(args.config).stem if args.config else "default"
    config_path = resolve_config(args.config) if args.config else None
    together = False  # every rank ends at the same point: a finished or stopped run, an agreed divergence
    try:
        train(cfg, config_name=name, resume=args.resume, trusted=args.trust_checkpoint, force=args.force,
              config_path=config_path)
        together = True
    except Diverged:  # the losses and states it is decided on are agreed across ranks
        together = True
        raise
    finally:
        distributed.destroy_process_group(barrier_first=together)
    return 0


@cli_entry
def main(argv: list[str] | None = None) -> int:
    return command(argv, run_command)


if __name__ == "__main__":
    sys.exit(main())
