"""Reading back a file: the one rule every reader of a run dir, a grid or a config follows.

A file segadv reads back may be anything by the time it is read: cut short by a crash, edited,
replaced by binary bytes, a FIFO, a link loop, or a JSON value no writer of segadv would produce
(``"step": 1e400``, an array nested 100,000 deep). Every way a read can fail is an
:class:`Unreadable` (a :class:`~segadv.errors.UserError`, exit 2) naming the file and what is wrong
with it, so a command either refuses it in one line or, where it reads many run dirs
(``segadv-experiment table``, ``segadv-curves``), catches it, warns and sets that file aside.
A missing file is a ``FileNotFoundError`` as ever: what it means (no status yet, no config) is the
caller's to say. YAML goes through the config loader (:func:`segadv.config.loading.read_yaml`),
which adds its caps on top of this module's bytes.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from typing import Any, Optional, Union

from segadv.errors import UserError

PathLike = Union[str, "os.PathLike[str]"]

# A step, an exit code, a seed: whole numbers a 64-bit signed integer holds. A JSON reader turns
# 1e400 into inf and 1e300 into a float whose int() has 300 digits; neither is a step.
MAX_INT = 2**63 - 1


class Unreadable(UserError):
    """A file that is there but cannot be read as what it should be. ``name``: how the message calls
    the file (its path, or e.g. ``grid G``); ``reason``: a predicate (``is not UTF-8 text: ...``)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name} {reason}")
        self.name, self.reason = name, reason


class TooLarge(Unreadable):
    """A file over the size its reader caps it at (``cap`` bytes)."""

    def __init__(self, name: str, cap: int, what: str) -> None:
        super().__init__(name, f"is larger than {size_text(cap)} (the cap on {what}'s size)")
        self.cap = cap


def size_text(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} bytes"


def os_reason(err: OSError) -> str:
    """``Permission denied (EACCES)``."""
    code = errno.errorcode.get(err.errno or 0, "")
    return f"{err.strerror or err}" + (f" ({code})" if code else "")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def check_regular(path: PathLike, name: Optional[str] = None) -> None:
    """An :class:`Unreadable` unless ``path`` is (a link to) a regular file: reading a FIFO waits
    for a writer that never comes, a device never ends. A missing path is a FileNotFoundError."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise
    except OSError as err:  # a link loop (ELOOP), a name too long, no permission on a folder
        raise Unreadable(name or str(path), f"cannot be read: {os_reason(err)}") from None
    if not stat.S_ISREG(mode):
        raise Unreadable(name or str(path), f"is {_kind(mode)}, not a file: name a regular file")


def read_bytes(path: PathLike, cap: Optional[int] = None, name: Optional[str] = None,
               what: str = "a file") -> bytes:
    """The bytes of regular file ``path`` (at most ``cap``: more is :class:`TooLarge`). Opened
    without blocking and checked on the open descriptor, so a FIFO put there never hangs the read."""
    name = name or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as err:
        raise Unreadable(name, f"cannot be read: {os_reason(err)}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Unreadable(name, f"is {_kind(mode)}, not a file: name a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read() if cap is None else fh.read(cap + 1)
    except OSError as err:
        raise Unreadable(name, f"cannot be read: {os_reason(err)}") from None
    finally:
        os.close(fd)
    if cap is not None and len(data) > cap:
        raise TooLarge(name, cap, what)
    return data


def decode(raw: bytes, name: str) -> str:
    """UTF-8 text, or an :class:`Unreadable` naming the first byte that is not (0-based offset)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Unreadable(name, f"is not UTF-8 text: byte {err.start} is 0x{raw[err.start]:02x}") from None


def read_text(path: PathLike, cap: Optional[int] = None, name: Optional[str] = None, what: str = "a file") -> str:
    name = name or str(path)
    return decode(read_bytes(path, cap, name, what), name)


def parse_json(text: Union[str, bytes]) -> Any:
    """``json.loads`` where every failure is a ValueError: a syntax error, an integer of more digits
    than Python converts, and values nested deeper than the interpreter recurses."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("values nested too deeply") from None


def read_json(path: PathLike, cap: Optional[int] = None, name: Optional[str] = None) -> Any:
    name = name or str(path)
    text = read_text(path, cap, name)
    try:
        return parse_json(text)
    except ValueError as err:
        raise Unreadable(name, f"is not valid JSON: {err}") from None


def whole_number(value: Any, low: int = 0, high: int = MAX_INT) -> Optional[int]:
    """``value`` as an int when it is a whole number in ``low..high`` (a JSON int, or a float that
    is one), else None: a bool, a string, NaN, inf, 1e400 and 10**30 are no step."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            return None
        value = int(value)
    if isinstance(value, int) and low <= value <= high:
        return value
    return None


def real_number(value: Any) -> Optional[float]:
    """``value`` as a float when it is a JSON number that is finite or NaN (an unknown score), else
    None: inf stands for no measurement."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int of more digits than a float holds
        return None
    return None if math.isinf(number) else number
