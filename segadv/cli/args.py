"""Command-line parsing shared by every segadv CLI: options and ``key=value`` overrides mix freely,
and ``--config`` takes a file or a shipped config's name (``--list-configs`` names them).

argparse's ``parse_args`` ends a ``nargs="*"`` positional at the first option after it, so
``segadv-train --run-dir R a=1 --resume auto b=2`` failed with "unrecognized arguments";
``parse_intermixed_args`` collects positionals across options, as users expect.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from segadv.config.shipped import CONFIGS_DIR, config_listing
from segadv.errors import EXIT_USER_ERROR, UserError
from segadv.fsutil import user_path

_PACKAGE_DIR = Path(__file__).resolve().parent


def docs_dir() -> Path | None:
    """The reference pages: shipped in the wheel as ``segadv/docs/`` (pyproject maps the
    top-level ``docs/`` onto it), or a checkout's ``docs/`` beside ``segadv/``; None if neither."""
    for folder in (_PACKAGE_DIR / "docs", _PACKAGE_DIR.parent / "docs"):
        if (folder / "training.md").is_file():
            return folder
    return None


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, without breaking a word at a hyphen or for length: a path in the help
    (``site-packages/segadv/docs/training.md``) stays one piece a terminal can open."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width,
                             break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(self._whitespace_matcher.sub(" ", text).strip(), width, initial_indent=indent,
                             subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


class ArgumentParser(argparse.ArgumentParser):
    """Every segadv command's parser (its subcommands' too: argparse makes them of the parser's
    class). A bad option or value is a user error like any other: one line naming it and where the
    options are listed, exit 2, no usage block (``segadv-eval: error: argument --device: expected
    one argument; see segadv-eval --help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def docs_epilog(*pages: str) -> str:
    """``--help``'s last lines: where the pages of ``pages`` (e.g. "training.md") are on this
    machine, which a wheel install carries too."""
    folder = docs_dir()
    where = [str(folder / page) if folder is not None else f"docs/{page} of the segadv source" for page in pages]
    return "documentation: " + ", ".join(where)


class ListShipped(argparse.Action):
    """``--list-configs``: print the configs shipped in ``folder`` (name and title) and exit 0,
    like --version."""

    def __init__(self, option_strings: Sequence[str], dest: str, folder: Path = CONFIGS_DIR, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)
        self.folder = folder

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        sys.stdout.write(config_listing(self.folder))
        parser.exit()


def path_argument(text: str) -> str:
    """argparse ``type`` of every path option: ``~`` expanded (a quoted ``'~/x'`` too, as the config
    keys' paths are); an empty path (an unset shell variable) is refused, never the current dir."""
    try:
        return str(user_path(text, "path"))
    except UserError:
        raise argparse.ArgumentTypeError("empty path (an unset shell variable?); name one") from None


def add_config_arguments(parser: argparse.ArgumentParser, help: str) -> None:
    """``--config`` (``help`` says what its default is) and ``--list-configs``."""
    parser.add_argument("--config", metavar="FILE|NAME",
                        help=f"YAML config file, or the name of a shipped one (--list-configs); {help}")
    parser.add_argument("--list-configs", action=ListShipped,
                        help="list the shipped configs (names for --config) and exit")


# ``--network``'s choices: the keys of segadv/checkpoint/inference.py's NETWORKS (a test holds them
# equal; this module stays torch-free, so --help answers without torch).
NETWORK_CHOICES = ("student", "teacher")


def add_network_argument(parser: argparse.ArgumentParser) -> None:
    """``--network student|teacher``, one option for every command that takes a checkpoint's G
    (segadv-eval, -export, -predict, segadv-ckpt convert): a mean_teacher run's student (the
    default) or its EMA teacher."""
    parser.add_argument("--network", choices=NETWORK_CHOICES,
                        help="of a checkpoint with an EMA teacher (mean_teacher, unimatch v2): the student (G, default: "
                             "the network the run scored as val/mIoU) or its EMA teacher")


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_intermixed_args``; with subcommands (which it does not support), the chosen
    subcommand's own arguments are parsed intermixed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        args = parser.parse_intermixed_args(argv)
    elif not argv or argv[0] not in sub.choices:
        return parser.parse_args(argv)  # help, or argparse's own message naming the commands
    else:
        args = sub.choices[argv[0]].parse_intermixed_args(argv[1:])
        setattr(args, sub.dest, argv[0])
    check_no_expanded_glob(getattr(args, "overrides", None) or [])
    return args


# argparse ``type=`` checks for numeric options: a bad value exits 2 with argparse's message naming
# the option ("argument --rtol: ..."), before anything is loaded.


def tolerance(text: str) -> float:
    """A finite number >= 0 (``--atol``, ``--rtol``)."""
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number within 0..1 (``--min-agreement``)."""
    value = _number(text)
    if not 0 <= value <= 1:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"expected a number within 0..1, got {text!r}")
    return value


def count(low: int, high: int) -> Callable[[str], int]:
    """A whole number within ``low..high`` (``--workers``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low}..{high}, got {value}")
        return value

    parse.__name__ = "count"  # argparse names the type in its "invalid count value" fallback
    return parse


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def check_no_expanded_glob(overrides: Sequence[str]) -> None:
    """A ``key=value`` slot holding existing paths is a glob the shell expanded (``--input
    dir/*.png`` arrives as ``--input dir/a.png dir/b.png ...``): a UserError saying so, before any
    message about overrides would mislead."""
    paths = [item for item in overrides if "=" not in item and Path(item).exists()]
    if paths:
        more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
        raise UserError(f"{paths[0]!r}{more} stand where key=value overrides go: the shell expanded an unquoted "
                        "glob into several paths, and an option takes one. Quote the glob so that segadv gets it "
                        "whole, e.g. --input 'dir/*.png'")
