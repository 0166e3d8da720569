"""User errors and the exit-code contract shared by every command-line entry point.

Exit codes: 0 done, 1 unexpected failure (with traceback), 2 user error (a short message naming
the thing at fault, no traceback).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Callable

log = logging.getLogger("segadv")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USER_ERROR = 2


class UserError(Exception):
    """Something the user can fix: a bad config key, device map, path, data file or checkpoint."""


def cli_entry(main: Callable[[list[str] | None], int | None]) -> Callable[[list[str] | None], int]:
    """Wrap a CLI ``main(argv)`` so that user errors exit 2 with their message and no traceback."""

    @functools.wraps(main)
    def wrapper(argv: list[str] | None = None) -> int:
        try:
            code = main(argv)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_USER_ERROR
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        return EXIT_OK if code is None else int(code)

    return wrapper
