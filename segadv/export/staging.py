"""Write a model file next to its destination, check it, then rename it into place atomically.

ONNX and TorchScript writers want a path, not bytes, and the file must be verified before it
replaces anything: a failed export or verification leaves the old file (if any) untouched.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class StagedFile:
    def __init__(self, target: Path) -> None:
        self.target = target
        self.path = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        self.committed = False

    def commit(self) -> None:
        """fsync the staged file, rename it over the target, fsync the directory."""
        _fsync_file(self.path)
        os.replace(self.path, self.target)
        self.committed = True
        _fsync_dir(self.target.parent)


@contextlib.contextmanager
def staged(target: str | Path) -> Iterator[StagedFile]:
    """A temp path in the target's directory; removed on exit unless committed."""
    staged_file = StagedFile(Path(target))
    try:
        yield staged_file
    finally:
        if not staged_file.committed:
            staged_file.path.unlink(missing_ok=True)
