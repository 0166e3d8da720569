"""Graceful stop: SIGTERM (preemption) or SIGINT (Ctrl-C) ends the run at the next step boundary.

The training process owns the stop. Its data-loader workers ignore both signals
(:func:`ignore_stop_signals`): a SIGTERM to every process of a job (``scancel``, SLURM preemption,
``kill -TERM -PGID``) would otherwise kill them, and the rank would die of a dead worker before it
could save.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from types import FrameType
from typing import Iterator

log = logging.getLogger(__name__)


def ignore_stop_signals() -> None:
    """For a data-loader worker: SIGINT and SIGTERM are the main process's to act on. The one
    SIGTERM a worker obeys is its own main process's: ``multiprocessing`` ends workers that
    outlive their loader that way when the process exits (a worker ignoring it would hang that
    exit), so SIGTERM is blocked and a thread waits for it, ending the worker only when its
    parent sent it. Without ``sigwaitinfo`` (macOS) SIGTERM is ignored outright."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not hasattr(signal, "sigwaitinfo"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit it
    threading.Thread(target=_obey_sigterm_from, args=(parent,), name="segadv-sigterm", daemon=True).start()


def _obey_sigterm_from(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)  # asked to end by the process it serves: not a failure


class StopRequests:
    """While active, the first SIGTERM/SIGINT sets ``requested``; a second SIGINT interrupts.

    ``watch_parent`` (a worker of torchrun): the launcher's death is a stop request too, seen by
    the next read of ``requested`` (every step). A launcher killed outright (SIGKILL) cannot pass a
    signal on, and its workers would otherwise train on headless; they stop and save instead. The
    check is a ``getppid()`` per read, not a thread: a thread in the training process makes each
    data-loader fork riskier (a fork copies no thread but the caller, and no lock another held).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, watch_parent: bool = False) -> None:
        self._requested: str | None = None
        self.seen_after: int | None = None  # the step after which the loop first saw a request
        self.watch_parent = watch_parent
        self._launcher: int | None = None
        self._previous: dict[int, object] = {}

    def seen(self, step: int) -> str | None:
        """``requested``, read by the loop after ``step``; the first time it is set, logged with
        that step: the stop lands after it (one process) or after the next step (the ranks'
        agreement, one step late), wherever the step was when the signal came."""
        requested = self.requested
        if requested is not None and self.seen_after is None:
            self.seen_after = step
            log.warning("stop request (%s) seen after step %d", requested, step)
        return requested

    @property
    def requested(self) -> str | None:
        if self._requested is None and self._launcher is not None and os.getppid() != self._launcher:
            self._request("launcher gone", f"the launcher (pid {self._launcher}) is gone")
        return self._requested

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():  # signal() only works there
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        self._launcher = os.getppid() if self.watch_parent else None
        return self

    def __exit__(self, *exc: object) -> None:
        self._launcher = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self._request(name, f"{name} received")

    def _request(self, reason: str, why: str) -> None:
        if self._requested:
            return  # a stop is on its way (a SIGTERM both from the job and from its launcher)
        self._requested = reason
        log.warning("%s: stopping after the current step and saving a checkpoint", why)


class Terminated(SystemExit):
    """SIGTERM received by a command that stops at once rather than at a step boundary."""


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While active, SIGTERM raises :class:`Terminated` (exit 143, 128 + SIGTERM) in the main thread
    instead of killing the process outright, so ``finally`` blocks run: a command writing through a
    temp file (segadv-export's verification) removes it. SIGINT already raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():  # signal() only works there
        yield
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
