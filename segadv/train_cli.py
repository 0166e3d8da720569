"""segadv-train's console script.

    segadv-train [--config FILE|NAME] [--device-map MAP] [--run-dir DIR] [--resume auto|PATH] [key=value ...]
    segadv-train [--config FILE|NAME] [key=value ...] --print-config
    segadv-train --help-config [PREFIX]

Nothing here imports torch: ``--help``, ``--list-configs``, ``--print-config`` and
``--help-config`` answer at once (segadv/train_args.py); a run imports the training machinery
(segadv/train.py) only when it starts.
"""

from __future__ import annotations

import argparse
import sys

from segadv.errors import cli_entry
from segadv.train_args import build_parser, command, resolved_config  # noqa: F401 (the command's parser)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    from segadv.train import run_command

    return run_command(args, argv)


@cli_entry
def main(argv: list[str] | None = None) -> int:
    return command(argv, _run)


if __name__ == "__main__":
    sys.exit(main())
