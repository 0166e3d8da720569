"""Command-line parsing shared by every segadv CLI: options and ``key=value`` overrides mix freely,
and ``--config`` takes a file or a shipped config's name (``--list-configs`` names them).

argparse's ``parse_args`` ends a ``nargs="*"`` positional at the first option after it, so
``segadv-train --run-dir R a=1 --resume auto b=2`` failed with "unrecognized arguments";
``parse_intermixed_args`` collects positionals across options, as users expect.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from segadv.config.shipped import CONFIGS_DIR, config_listing


class ListShipped(argparse.Action):
    """``--list-configs``: print the configs shipped in ``folder`` (name and title) and exit 0,
    like --version."""

    def __init__(self, option_strings: Sequence[str], dest: str, folder: Path = CONFIGS_DIR, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)
        self.folder = folder

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        sys.stdout.write(config_listing(self.folder))
        parser.exit()


def add_config_arguments(parser: argparse.ArgumentParser, help: str) -> None:
    """``--config`` (``help`` says what its default is) and ``--list-configs``."""
    parser.add_argument("--config", metavar="FILE|NAME",
                        help=f"YAML config file, or the name of a shipped one (--list-configs); {help}")
    parser.add_argument("--list-configs", action=ListShipped, help="list the shipped configs and exit")


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_intermixed_args``; with subcommands (which it does not support), the chosen
    subcommand's own arguments are parsed intermixed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        return parser.parse_intermixed_args(argv)
    if not argv or argv[0] not in sub.choices:
        return parser.parse_args(argv)  # help, or argparse's own message naming the commands
    args = sub.choices[argv[0]].parse_intermixed_args(argv[1:])
    setattr(args, sub.dest, argv[0])
    return args
