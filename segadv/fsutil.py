"""Crash-safe file writes shared by config dumps, checkpoints and exports, a file's sha256, the
rule that no output replaces an input, and the rule for what may stand where a file is written.

**Outputs are regular files** (docs/failures.md "Outputs that are not regular files"). What stands
at a path segadv writes a file at is looked at through its symbolic links (a link to a link to
``/dev/full`` is a character device): a regular file is replaced atomically, a new name is created;
anything else (a character or block device, a FIFO, a socket, a directory, a link loop) is a
:class:`NotAFile` (a UserError, exit 2) naming it, and is never replaced, opened or written.
:func:`check_output` says so before any slow work; every writer here checks again at write time, so
no caller can bypass the rule. A writer never writes through a link: the name is what it writes
(an atomic write's rename replaces a link to a regular file with the new file, and the file the link
pointed at is left as it was). A command's output named on the command line is resolved first
(:func:`output_file`), so there a link to a regular file gets the file it leads to written; a run
dir's files are segadv's, and a link among them is replaced, never followed (:func:`open_append`).
Every byte goes through :func:`write_all`.

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
import logging
import os
import stat
from pathlib import Path
from typing import Iterable, Iterator, Union

from segadv.errors import UserError, WriteFailed

PathLike = Union[str, "os.PathLike[str]"]

log = logging.getLogger(__name__)

# Flags of every open that writes: a link in the last component is refused by the OS (ELOOP), a FIFO
# without a reader answers ENXIO instead of blocking (regular files ignore O_NONBLOCK).
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class NotAFile(UserError):
    """A path where a file is to be written holds something that is not a regular file (a device,
    a FIFO, a socket, a directory, a link to one, a link loop): exit 2, and nothing written there."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = path


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in words."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return words
    return "not a regular file"


def check_output(path: PathLike, what: str = "") -> Path:
    """The rule for a path a file is to be written at (the module docstring): nothing there, a
    regular file, or a link (to links) that leads to one or to nothing (a new name) passes;
    anything else is a :class:`NotAFile` naming the path (``what``: the option or key that named
    it) and what stands there. Nothing is created or opened. Errors looking (a parent that is a
    file, no permission) are left to the write, which names them."""
    target = Path(path)
    label = f"{what} {target}" if what else str(target)
    try:
        st = os.lstat(target)
    except OSError:
        return target
    if stat.S_ISREG(st.st_mode):
        return target
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(target)
        except FileNotFoundError:
            return target  # a dangling link: a new name
        except OSError as err:
            raise NotAFile(f"{label} is a symbolic link that cannot be followed ({err.strerror or err}): "
                           "nothing is written there; name a regular file", target) from None
        if stat.S_ISREG(st.st_mode):
            return target
        where = f"a symbolic link to {os.path.realpath(target)}, {kind_of(st.st_mode)}"
    else:
        where = kind_of(st.st_mode)
    hint = "name a file to write in it" if stat.S_ISDIR(st.st_mode) else \
        "segadv writes its outputs to regular files only (a new one, or one it replaces); name a file"
    raise NotAFile(f"{label} is {where}, not a regular file: nothing is written there; {hint}", target)


def output_file(path: PathLike, what: str) -> Path:
    """A command's output file named on its command line (``what``: the option), checked by
    :func:`check_output` before any slow work, and resolved: a link to a regular file (or to
    nothing) is the file it leads to, written there with the link kept."""
    target = check_output(path, what)
    return Path(os.path.realpath(target)) if target.is_symlink() else target


def check_output_dir(path: PathLike, what: str) -> Path:
    """A folder a command writes files in: nothing there, or a directory (through links); anything
    else is a :class:`NotAFile` naming it."""
    target = Path(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as err:
        if err.errno == errno.ENOTDIR:
            return target  # a parent is a file: make_dir and check_parent name it
        raise NotAFile(f"{what} {target} cannot be looked at ({err.strerror or err}); name a folder", target) \
            from None
    if not stat.S_ISDIR(st.st_mode):
        link = f"a symbolic link to {os.path.realpath(target)}, " if target.is_symlink() else ""
        raise NotAFile(f"{what} {target} is {link}{kind_of(st.st_mode)}, not a folder: nothing is written there; "
                       "name a folder", target)
    return target


def write_all(fh: object, data: bytes) -> None:
    """Every byte segadv writes into a file goes through here: ``data`` written whole to the binary
    unbuffered file ``fh`` (a short write goes on where it stopped)."""
    view = memoryview(data)
    while view:
        written = fh.write(view)
        if not written:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        view = view[written:]


def _clear_temp(path: Path) -> None:
    """A stale temp file of ours (a process killed mid-write with this pid) is removed; what
    cannot be (a directory) makes the exclusive create fail with EEXIST, naming the output."""
    with contextlib.suppress(OSError):
        if not os.path.isdir(path) or os.path.islink(path):
            os.unlink(path)


def _new_file_opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o666)


def _existing_opener(path: str, flags: int) -> int:
    return os.open(path, flags | _NO_FOLLOW, 0o666)


def write_new(path: PathLike, data: bytes, fsync: bool = False) -> None:
    """``data`` in a file created at ``path``, a temp name of ours (:func:`staged`'s ``.path``): any
    stale file there is removed first, and the file is created exclusively, never through a link."""
    target = Path(path)
    _clear_temp(target)
    with open(target, "wb", buffering=0, opener=_new_file_opener) as fh:
        write_all(fh, data)
        if fsync:
            os.fsync(fh.fileno())


def _replace_link(path: Path) -> None:
    """A run dir's file that is a link (to a regular file, or to nothing): the link is removed, so
    the file is created in its place; what it pointed at is left as it was."""
    if not path.is_symlink():
        return
    target = os.path.realpath(path)
    path.unlink()
    log.warning("%s was a symbolic link to %s: replaced by a regular file (a run dir's files are never written "
                "through a link; %s is left as it was)", path, target, target)


def open_append(path: PathLike) -> object:
    """A run dir's file that grows (``train.log``, ``metrics.jsonl``, ``experiment.log``) opened to
    append, binary and unbuffered (write with :func:`write_all`). The rule of :func:`check_output`,
    and a link there is replaced by a regular file, never followed. A :class:`NotAFile` or an
    OSError (the caller names the file)."""
    target = check_output(path)
    _replace_link(target)
    fh = open(target, "ab", buffering=0, opener=_existing_opener)
    try:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):  # swapped in since the check
            raise NotAFile(f"{target} is {kind_of(mode)}, not a regular file: nothing is written there", target)
    except BaseException:
        fh.close()
        raise
    return fh


def open_run_file(path: PathLike, flags: int) -> int:
    """A run dir's file opened with ``flags`` (os.open's; ``O_CREAT`` to create it) by the rule of
    :func:`open_append` (a link replaced, never followed); a descriptor of a regular file. A
    :class:`NotAFile` or the OSError of the open."""
    target = check_output(path)
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        _replace_link(target)
    fd = os.open(target, flags | _NO_FOLLOW, 0o644)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotAFile(f"{target} is {kind_of(mode)}, not a regular file: nothing is written there", target)
    return fd


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


def refuse_folder_overlap(what: str, folder: PathLike, inputs: Iterable[tuple[str, PathLike]]) -> None:
    """UserError when the output ``folder`` (``what``: the option naming it) is an input folder
    (``(what, path)``: a data root, the folder of an input), lies inside one, or holds one: what a
    command writes never lands among what a run reads. Paths compared resolved (links followed)."""
    output = Path(folder)
    out = output.expanduser().resolve()
    for in_what, source in inputs:
        src = Path(source).expanduser().resolve()
        relation = ("is" if out == src else "lies inside" if out.is_relative_to(src)
                    else "holds" if src.is_relative_to(out) else None)
        if relation is not None:
            raise UserError(f"{what} {output} {relation} {in_what} {source}: files written there would land among "
                            "the inputs; choose a folder outside it")


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; the parent directory must already exist.

    Writes a temp file in the same directory, fsyncs it, renames it over ``path`` and fsyncs the
    directory. On any exception the temp file is removed and the old ``path`` is left untouched;
    an OSError (a full disk, no permission, a read-only or failing file system) comes out as
    :class:`segadv.errors.WriteFailed` naming ``path``.
    """
    target = check_output(path)
    tmp = _temp_path(target)
    try:
        _clear_temp(tmp)
        with open(tmp, "wb", buffering=0, opener=_new_file_opener) as fh:
            write_all(fh, data)
            os.fsync(fh.fileno())
        check_output(target)  # again at the rename: nothing else may have taken the name meanwhile
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
        _clear_temp(probe)
        os.close(_new_file_opener(str(probe), os.O_WRONLY))
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
        with open(self.path, "rb", opener=_existing_opener) as fh:
            os.fsync(fh.fileno())
        umask_mode(self.path)
        check_output(self.target)  # again at the rename (staged() checked before the slow work)
        os.replace(self.path, self.target)
        self.committed = True
        _fsync_dir(self.target.parent)


@contextlib.contextmanager
def staged(target: PathLike) -> Iterator[StagedFile]:
    """Write to ``.path``, check the file, then ``commit()``; without a commit (an error or a
    failed check) the temp file is removed and an existing ``target`` is left untouched. An
    OSError on the way (writing, committing) is a :class:`WriteFailed` naming ``target``; what
    stands at ``target`` follows :func:`check_output`'s rule, before and at the commit."""
    staged_file = StagedFile(check_output(target))
    try:
        _clear_temp(staged_file.path)
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
