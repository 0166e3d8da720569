"""Command-line parsing shared by every segadv CLI: options and ``key=value`` overrides mix freely.

argparse's ``parse_args`` ends a ``nargs="*"`` positional at the first option after it, so
``segadv-train --run-dir R a=1 --resume auto b=2`` failed with "unrecognized arguments";
``parse_intermixed_args`` collects positionals across options, as users expect.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


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
