"""User errors and the exit-code contract shared by every command-line entry point.

Exit codes (docs/failures.md): 0 done, 1 unexpected failure (with traceback), 2 user error (a short
message naming the thing at fault, no traceback), 3 training diverged (a non-finite loss or weight),
4 a file could not be written (disk full, permissions, read-only or failing file system). 3 and 4
print one message naming the last complete checkpoint, no traceback.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import sys
from pathlib import Path
from typing import Callable, Optional

from segadv.signals import Interrupted, handling_signals, stopping_signal

log = logging.getLogger("segadv")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3
EXIT_WRITE_FAILED = 4
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """Something the user can fix: a bad config key, device map, path, data file or checkpoint."""


class RunStopped(Exception):
    """A run that cannot go on and has stopped cleanly: one message, its own exit code."""

    exit_code = EXIT_FAILURE


class Diverged(RunStopped):
    """A non-finite loss or weight (train.on_nonfinite: stop)."""

    exit_code = EXIT_DIVERGED


class WriteFailed(RunStopped, OSError):
    """An OSError writing a file (ENOSPC, EACCES, EROFS, EIO, ...), naming the file meant (not its
    temp file); still an OSError for callers that catch those. ``after``: what the reader needs
    next (the last complete checkpoint), added by whoever knows it."""

    exit_code = EXIT_WRITE_FAILED

    def __init__(self, path: Path | str, err: OSError, after: str = "") -> None:
        super().__init__(err.errno, err.strerror or str(err), str(path))
        self.path, self.err, self.after = Path(path), err, after

    def __str__(self) -> str:
        code = errno.errorcode.get(self.err.errno, "") if self.err.errno else ""
        cause = f"{self.err.strerror or self.err}" + (f" ({code})" if code else "")
        return f"cannot write {self.path}: {cause}" + (f"; {self.after}" if self.after else "")


# An OSError the OS raises about a path the user gave (a name too long, a link loop, a folder where
# a file is meant, no permission): the user's to fix, answered as a user error naming the path.
PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                         errno.EROFS})
# An OSError with no file name from a full or closed stream: what a command printed could not be
# written (``--print-config > /dev/full``, a pipe closed by ``head``). segadv's own files are written
# through segadv/fsutil.py, whose errors name their file (WriteFailed).
STREAM_ERRNOS = frozenset({errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EFBIG, errno.EDQUOT})


def os_error_message(err: OSError) -> tuple[str, int] | None:
    """The message and exit code of an OSError a command should not answer with a traceback, or
    None for any other."""
    reason = err.strerror or str(err)
    code = errno.errorcode.get(err.errno or 0, "")
    reason += f" ({code})" if code else ""
    if err.filename is not None and err.errno in PATH_ERRNOS:
        return f"{err.filename}: {reason}", EXIT_USER_ERROR
    if err.filename is None and (isinstance(err, BrokenPipeError) or err.errno in STREAM_ERRNOS):
        return f"cannot write the output: {reason}", EXIT_WRITE_FAILED
    return None


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def cli_entry(main: Callable[[list[str] | None], int | None]) -> Callable[[list[str] | None], int]:
    """Wrap a CLI ``main(argv)`` so that user errors exit 2 with their message and no traceback;
    what it printed is flushed inside, so a full or closed stdout is answered here too. Its first
    instruction installs the command's answer to SIGINT, SIGTERM and SIGHUP (segadv/signals.py):
    a signal unwinds as :class:`segadv.signals.Interrupted`, answered here with one line and
    128 + N."""

    @functools.wraps(main)
    def wrapper(argv: list[str] | None = None) -> int:
        code: int | None = None
        try:
            with handling_signals():
                try:
                    code = _answered(main, argv)
                except Interrupted as err:  # a signal landed while another answer was printed
                    print(f"error: {err}", file=sys.stderr)
                    code = err.exit_code
        except Interrupted as err:  # one that came as the handlers went back: the answer given stands
            if code is None:
                print(f"error: {err}", file=sys.stderr)
                return err.exit_code
            log.warning("%s as the command ended: it ends as it answered", err.name)
        return code

    return wrapper


def _answered(main: Callable[[list[str] | None], int | None], argv: list[str] | None) -> int:
    """``main(argv)``'s exit code, every error it raises answered as :func:`cli_entry` says."""
    try:
        code = main(argv)
        sys.stdout.flush()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RunStopped as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except RuntimeError as err:
        message = input_shape_message(err)
        if message is not None:
            print(f"error: {message}", file=sys.stderr)
            return EXIT_USER_ERROR
        signum = stopping_signal()
        if signum is None or not is_collective_error(err):
            raise
        # A peer rank ended on the same signal first and closed the process group under this one.
        print(f"error: {Interrupted(signum, 'while another rank stopped first')} "
              f"({str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__})", file=sys.stderr)
        return 128 + signum
    except OSError as err:
        answer = os_error_message(err)
        if answer is None:
            raise
        if answer[1] == EXIT_WRITE_FAILED:
            _silence_stdout()
        print(f"error: {answer[0]}", file=sys.stderr)
        return answer[1]
    except Interrupted as err:  # a stop signal: everything on its way out has been cleaned up
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:  # raised by other code than segadv's handler
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK if code is None else int(code)


def is_collective_error(err: BaseException) -> bool:
    """A torch.distributed collective that failed (its backend's error types, or gloo's and NCCL's
    "closed by peer" messages), told without importing torch."""
    names = {cls.__name__ for cls in type(err).__mro__}
    return bool(names & {"DistError", "DistBackendError", "DistNetworkError"}) or \
        "closed by peer" in str(err) or "Connection reset by peer" in str(err)


def exit_code_of(err: BaseException) -> int:
    """The exit code a command ends with when ``err`` leaves its ``main`` (:func:`cli_entry`'s
    mapping; 1 for what it lets through with a traceback)."""
    if isinstance(err, UserError):
        return EXIT_USER_ERROR
    if isinstance(err, RunStopped):
        return err.exit_code
    if isinstance(err, Interrupted):
        return err.exit_code
    if isinstance(err, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(err, RuntimeError) and input_shape_message(err) is not None:
        return EXIT_USER_ERROR
    if isinstance(err, OSError) and (answer := os_error_message(err)) is not None:
        return answer[1]
    return EXIT_FAILURE


# segmentation-models-pytorch checks G's input in its forward and raises a bare RuntimeError;
# its shape comes from the data and its transforms, so it is the user's to fix.
_SMP_INPUT_SHAPE = re.compile(
    r"Wrong input shape height=(\d+), width=(\d+)\. Expected image height and width divisible by (\d+)"
)


def input_shape_message(err: RuntimeError) -> Optional[str]:
    """The user-facing message for smp's input-size check, or None for any other error."""
    match = _SMP_INPUT_SHAPE.search(str(err))
    if match is None:
        return None
    height, width, divisor = match.groups()
    return (f"images of {height}x{width} reach G, which needs height and width divisible by {divisor} "
            "(its encoder's output stride): resize, crop or pad them to a multiple "
            "(data.train_transforms / data.val_transforms, or the dataset's image size)")
