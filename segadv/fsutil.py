"""Crash-safe file writes shared by config dumps, checkpoints and exports, a file's sha256, and
the rule that no output replaces an input.

A run killed mid-write (OOM, Ctrl-C, power loss) must never leave a truncated ``config.yaml`` or
checkpoint where a good one used to be: readers either see the old file or the complete new one.
Every OSError while writing is a :class:`segadv.errors.WriteFailed` naming the file meant (exit 4).
Temp files never outlive the write: any exception removes them, a stop signal's too (it unwinds
as :class:`segadv.signals.Interrupted`). Only a kill that no process can catch (SIGKILL, the OOM
killer, power loss) leaves one; a run's start removes those of its checkpoints.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from pathlib import Path
from typing import Iterable, Iterator, Union

from segadv.errors import UserError, WriteFailed

PathLike = Union[str, "os.PathLike[str]"]


# Most file systems take names of at most 255 bytes; a temp name must fit wherever its file's does.
NAME_MAX = 255


def _temp_path(path: Path) -> Path:
    """Hidden sibling of ``path``: same directory, so ``os.replace`` is an atomic rename. A name
    too long to take the temp name's additions is cut, with a digest of the whole name, so any
    legal name is written the same way."""
    suffix = f".tmp-{os.getpid()}"
    name = f".{path.name}{suffix}"
    if len(os.fsencode(name)) > NAME_MAX:
        digest = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:12]
        keep = os.fsencode(path.name)[:NAME_MAX - len(suffix) - len(digest) - 2].decode(errors="ignore")
        name = f".{keep}~{digest}{suffix}"
    return path.with_name(name)


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself; without it a crash can forget the new directory entry.

    Best effort: some platforms and file systems (Windows, some network mounts) refuse to open or
    fsync a directory, and the data is already safe in the file by then.
    """
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


def user_path(text: PathLike, what: str) -> Path:
    """A path as the user wrote it (an option, a config key): ``~`` expanded as a shell would; an
    empty one (an unset shell variable) is a UserError naming ``what``, never the current dir."""
    if not str(text).strip():
        raise UserError(f"{what}: the path is empty (an unset shell variable?); name one")
    return Path(os.path.expanduser(str(text)))


def umask_mode(path: PathLike) -> None:
    """Give a file the mode a plain ``open`` would (0666 less the umask): writers that go through
    ``tempfile`` create 0600 files, which an atomic rename would otherwise keep."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def make_dir(path: PathLike) -> None:
    """``mkdir -p``: a path that exists and is not a directory is a UserError, an OSError a
    :class:`WriteFailed` naming ``path``."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{directory} exists and is not a directory") from None
    except OSError as err:
        raise WriteFailed(directory, err) from None


def check_parent(path: PathLike) -> None:
    """Before any slow work: a file meant for ``path`` whose folder is, or lies under, an existing
    file cannot be written; the folder is named as the OS would name it (:class:`WriteFailed`,
    ENOTDIR, exit 4), the answer every command gives for it. Nothing is created."""
    target = Path(path)
    for folder in target.parents:
        if folder.exists():
            if not folder.is_dir():
                raise WriteFailed(target.parent, OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))
            return


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def refuse_overwriting(outputs: Iterable[tuple[str, PathLike]], inputs: Iterable[tuple[str, PathLike]]) -> None:
    """UserError when an output (``(what, path)``) is one of the inputs: the same file or folder,
    by path, symlink or hard link. No output ever replaces an input."""
    inputs = [(what, Path(path)) for what, path in inputs]
    for out_what, out_path in outputs:
        output = Path(out_path)
        for in_what, source in inputs:
            if _same_file(output, source):
                raise UserError(f"{out_what} {output} is {in_what} {source}: nothing replaces an input; "
                                "choose another output")


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; the parent directory must already exist.

    Writes a temp file in the same directory, fsyncs it, renames it over ``path`` and fsyncs the
    directory. On any exception the temp file is removed and the old ``path`` is left untouched;
    an OSError (a full disk, no permission, a read-only or failing file system) comes out as
    :class:`segadv.errors.WriteFailed` naming ``path``.
    """
    target = Path(path)
    tmp = _temp_path(target)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and not isinstance(err, WriteFailed):
            raise WriteFailed(target, err) from None
        raise
    _fsync_dir(target.parent)


def file_sha256(path: PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def unwritable(directory: Path) -> str | None:
    """Why files cannot be written in ``directory`` (created if missing), or None: it is tried."""
    probe = directory / f".write-probe-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
    except OSError as err:
        return err.strerror or str(err)
    finally:  # whatever ends the try (a signal's exception too): the probe never outlives it
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    return None


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    """Text flavour of :func:`atomic_write_bytes` (UTF-8 by default, newlines written as given)."""
    atomic_write_bytes(path, text.encode(encoding))


class StagedFile:
    """A temp path beside ``target`` for writers that want a path, not bytes (ONNX, TorchScript)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.path = _temp_path(target)
        self.committed = False

    def commit(self) -> None:
        """fsync the staged file, rename it over the target, fsync the directory."""
        with open(self.path, "rb") as fh:
            os.fsync(fh.fileno())
        umask_mode(self.path)
        os.replace(self.path, self.target)
        self.committed = True
        _fsync_dir(self.target.parent)


@contextlib.contextmanager
def staged(target: PathLike) -> Iterator[StagedFile]:
    """Write to ``.path``, check the file, then ``commit()``; without a commit (an error or a
    failed check) the temp file is removed and an existing ``target`` is left untouched. An
    OSError on the way (writing, committing) is a :class:`WriteFailed` naming ``target``."""
    staged_file = StagedFile(Path(target))
    try:
        yield staged_file
    except OSError as err:
        if isinstance(err, WriteFailed):
            raise
        raise WriteFailed(staged_file.target, err) from None
    finally:
        if not staged_file.committed:
            with contextlib.suppress(OSError):
                staged_file.path.unlink(missing_ok=True)


def list_dir(path: Union[str, "os.PathLike[str]"], what: str) -> list[Path]:
    """The entries of directory ``path``, sorted. One that cannot be listed (no read permission,
    an I/O error) is a UserError naming it; ``what`` says what the directory is (a config key or
    an option), so every command that lists a directory answers the same way."""
    try:
        with os.scandir(path) as entries:
            return sorted(Path(entry.path) for entry in entries)
    except OSError as err:
        cause = err.strerror or str(err)
        raise UserError(f"{what}: cannot list the directory {path}: {cause}") from None
