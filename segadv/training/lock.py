"""One run at a time in a run dir: a lock held by the rank that writes (rank 0) for the whole run.

Two launches into one run dir would interleave their metrics and overwrite each other's
checkpoints without a word. The lock is an ``flock`` on ``RUN/.segadv.lock``: the kernel drops it
when its holder dies however it dies (kill -9 included), so a crashed run never leaves a stale
lock behind. The file names the holder (pid, host, start time) for the second launch's message.
It is a run dir file like any other (segadv/fsutil.py): never opened through a link (one there is
replaced by a regular file), a device, FIFO or socket there is a user error naming it, and a lock
file that cannot be written (a full disk) is a :class:`WriteFailed` naming it, removed if this
launch created it.

A run dir this process cannot write in (read-only, another user's) is locked through the lock file
opened for reading, or, where there is none, not at all: no run can write there, and a command that
only reads it (``--resume auto`` of a finished run saying it is finished) needs no more. Whatever
would write is refused before the lock by its own check (``check_writable``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import time
from pathlib import Path

from segadv import fsutil
from segadv.errors import UserError, WriteFailed
from segadv.parallel import distributed
from segadv.parallel.distributed import DistEnv
from segadv.signals import deferred

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there are single-process anyway
    fcntl = None

log = logging.getLogger(__name__)

LOCK_FILE = ".segadv.lock"
# What opening the lock file for writing answers in a run dir this process cannot write in.
READ_ONLY_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class RunDirLock:
    """``with RunDirLock(run_dir, env):`` the run dir is this run's, or a UserError (exit 2) on
    every rank naming the run that holds it."""

    def __init__(self, run_dir: Path, env: DistEnv = DistEnv()) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.env = env
        self._fd: int | None = None
        # Whether the run dir is this launch's to write in (locked by it, or lockable by nobody):
        # what a start that fails entering the lock may clean up (segadv/training/run_dir.py).
        self.ours = False

    def __enter__(self) -> "RunDirLock":
        failure: BaseException | None = None
        try:
            # A signal meanwhile is raised once the lock is taken or refused, never between the
            # lock file's creation and its lock: ``ours`` then says whose run dir it is.
            with deferred():
                problem = self._acquire() if self.env.is_main and fcntl is not None else None
                self.ours = problem is None
        except (WriteFailed, UserError) as err:  # every rank is told before rank 0 raises it
            problem, failure = str(err), err
        if distributed.any_rank(problem is not None):
            self.release()
            if failure is not None:
                raise failure
            raise UserError(problem or "rank 0 found the run dir in use (its message names the run holding it)")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def _acquire(self) -> str | None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not os.path.lexists(self.path)
        try:
            fd = fsutil.open_run_file(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as err:
            if err.errno not in READ_ONLY_ERRNOS:
                raise WriteFailed(self.path, err) from None
            return self._acquire_read_only()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return self._in_use(fd)
        except OSError as err:  # a file system without locks (some network mounts)
            os.close(fd)
            log.warning("cannot lock the run dir (%s): a second launch into it would not be refused", err)
            return None
        holder = f"pid {os.getpid()} on host {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        try:
            os.ftruncate(fd, 0)
            with os.fdopen(fd, "wb", buffering=0, closefd=False) as fh:
                fsutil.write_all(fh, holder.encode())
        except OSError as err:  # a full disk: no lock file is left behind by this launch
            if created:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            os.close(fd)
            raise WriteFailed(self.path, err) from None
        self._fd = fd
        return None

    def _in_use(self, fd: int) -> str:
        """The refusal when another process holds the lock (``fd``, closed here): who holds it, as
        the lock file says."""
        holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
        os.close(fd)
        return (f"run dir {self.path.parent} is in use by {holder}: wait for that run to end, "
                "stop it, or give another --run-dir")

    def _acquire_read_only(self) -> str | None:
        """The lock in a run dir this process cannot write in (module docstring)."""
        try:
            fd = fsutil.open_run_file(self.path, os.O_RDONLY)
        except OSError:  # no lock file either: nobody can have locked it through one
            log.debug("run dir %s is not writable and has no lock file: not locked", self.path.parent)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return self._in_use(fd)
        except OSError:
            os.close(fd)
            return None
        self._fd = fd
        return None


def is_held(run_dir: Path) -> bool:
    """Whether a live process holds ``run_dir`` (a run going on there). Without flock (Windows, a
    file system without locks) it cannot tell and answers True."""
    path = Path(run_dir) / LOCK_FILE
    if fcntl is None:
        return True
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO there never blocks
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # held (BlockingIOError), or no locks on this file system
        return True
    finally:
        os.close(fd)  # closing drops the shared lock this probe took
    return False
