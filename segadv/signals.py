"""Stop signals, one rule for every command from its first instruction to its last.

SIGINT (Ctrl-C), SIGTERM (preemption, ``kill``, ``scancel``) and SIGHUP (a closed terminal or SSH
session) are answered alike, by one handler (:func:`_dispatch`), which every command installs as
its first instruction (:func:`handling_signals`, entered by ``segadv.errors.cli_entry``, and by
``segadv.training.loop.train`` called as a library, before a run's first write):

- **Outside a training loop** a signal raises :class:`Interrupted` in the main thread. It unwinds
  like any exception: every ``finally`` and ``__exit__`` runs, so an atomic write removes its temp
  file (segadv/fsutil.py), a start of segadv-train removes what it wrote in its run dir
  (segadv/training/run_dir.py ``StartCleanup``), and ``cli_entry`` prints one ``error:`` line and
  exits 128 + N (130 SIGINT, 129 SIGHUP, 143 SIGTERM). Killed outright instead (the default action
  of SIGTERM and SIGHUP), a process leaves its temp files and a half-made run dir behind.
- **While a training loop runs** (:class:`StopRequests`, entered once the start is complete) the
  first signal only asks the loop to stop at the next step boundary and save a checkpoint (exit 0);
  a second SIGINT interrupts at once (:class:`Interrupted`). A second SIGTERM or SIGHUP is not
  a hurry: a job's SIGTERM often reaches a rank twice (from the scheduler and from its launcher).
- **The first signal's answer stands**: once the loop stopped on a signal, a repeat while the
  command ends (the files closing, status.json's last record) is logged and changes nothing, so
  the exit code and status.json agree. Handlers are swapped with the signals held back
  (:func:`_held`): no signal meets a moment between two handlers, and one held back while the
  handlers found go back is taken and logged (:func:`_restore`), never released to the default
  action they may be, which would end the process without a word.
- **While unwinding** from an :class:`Interrupted`, a second signal is only logged, so the
  clean-up it runs is never cut short; a third takes the signal's default action (ends the
  process at once, as SIGKILL would). :func:`deferred` holds a signal back over a few lines that
  must not be cut in the middle (recording a run's outcome, removing a failed start's files).

Before a command's first instruction (the interpreter importing it) nothing has been written, so
the default actions there lose nothing. Data-loader workers leave the signals to their main
process (:func:`ignore_stop_signals`). Signal handlers run in the main thread only; installed from
another thread, the helpers here do nothing.
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

# The signals that stop a command (SIGHUP does not exist on Windows).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Interrupted(KeyboardInterrupt):
    """A stop signal that ends a command at once. A KeyboardInterrupt, so it unwinds through code
    that catches ``Exception`` and is met where Ctrl-C always was (a run's status records
    ``stopped``). ``after``: what the reader needs next (where the run can go on from, or that
    nothing was saved), added by whoever knows it; ``when``: where it landed."""

    def __init__(self, signum: int, when: str = "", after: str = "") -> None:
        super().__init__(signum)
        self.signum, self.when, self.after = signum, when, after

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {self.name}" + (f" {self.when}" if self.when else "") + \
            (f"; {self.after}" if self.after else "")


class _State:
    """The process's answer to a stop signal; touched only by the main thread."""

    def __init__(self) -> None:
        self.installed = 0  # handling_signals() depth
        self.previous: dict[int, object] = {}
        self.stops: list[StopRequests] = []  # graceful-stop scopes, innermost last
        self.deferring = 0  # deferred() depth
        self.pending: int | None = None  # a signal deferred() held back
        self.raised: int | None = None  # the signal an Interrupted was raised for
        self.repeats = 0  # signals received since then
        self.stop_signal: int | None = None  # the signal a graceful stop was requested by

    def reset(self) -> None:
        self.pending = self.raised = self.stop_signal = None
        self.repeats = 0


_state = _State()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _repeated(signum: int, doing: str) -> None:
    """A repeat of a stop signal while the command is already on its way out: logged the first
    time; the next one takes the signal's default action (the process ends at once)."""
    name = signal.Signals(signum).name
    _state.repeats += 1
    if _state.repeats >= 2:
        log.warning("%s again: ending at once", name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    log.warning("%s: %s (once more ends the process at once)", name, doing)


def _dispatch(signum: int, frame: FrameType | None) -> None:
    """The one handler of SIGINT, SIGTERM and SIGHUP (module docstring)."""
    name = signal.Signals(signum).name
    if _state.raised is None and _state.stop_signal is not None and not _state.stops:
        # The loop has stopped on a signal and the command is on its way out (the files closing,
        # status.json's last write): the first signal's answer stands, a repeat changes nothing.
        _repeated(signum, f"already stopping on {signal.Signals(_state.stop_signal).name}, the checkpoint saved; "
                          "this changes nothing")
        return
    if _state.raised is not None:  # already unwinding: let the clean-up finish
        _repeated(signum, "already stopping, cleaning up")
        return
    if _state.stops:
        _state.stops[-1]._handle(signum)
        return
    if _state.deferring:
        if _state.pending is None:
            _state.pending = signum
        log.warning("%s: stopping once the current write is complete", name)
        return
    _raise(signum)


def _raise(signum: int, when: str = "") -> None:
    _state.raised = signum
    raise Interrupted(signum, when)


def _install() -> dict[int, object]:
    with _held():  # all three at once: no signal finds one installed and the next not yet
        return {sig: signal.signal(sig, _dispatch) for sig in STOP_SIGNALS}


def _restore(handlers: dict[int, object]) -> None:
    """The handlers found put back. A signal that came while they were swapped (held back by
    :func:`_held`) came while segadv still answered: it is taken here, not released to the handler
    put back (the default action, which would end the process without a word)."""
    with _held():
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if handlers:
            _take_held()


def _take_held() -> None:
    """Stop signals held back and pending, taken (inside :func:`_held`) and logged: they came as
    the scope that answers them ended, when its answer was given (the first signal's answer stands)."""
    if not hasattr(signal, "sigtimedwait"):
        return  # macOS: no way to take one; it reaches the handler put back
    while (info := signal.sigtimedwait(STOP_SIGNALS, 0)) is not None:
        log.warning("%s as the command ended: it ends as it answered", signal.Signals(info.si_signo).name)


@contextlib.contextmanager
def _held() -> Iterator[None]:
    """The stop signals blocked for a few instructions (handlers swapped, the state reset): one
    arriving meanwhile is delivered, to what is installed then, as the block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def handling_signals() -> Iterator[None]:
    """A command's stop signals answered by :func:`_dispatch` while active (re-entrant); the
    handlers found are restored at the end."""
    if not _in_main_thread():  # signal() only works there
        yield
        return
    if _state.installed == 0:
        with _held():
            _state.previous = _install()
            _state.reset()
    _state.installed += 1
    try:
        yield
    finally:
        _state.installed -= 1
        if _state.installed == 0:
            with _held():
                _restore(_state.previous)
                _state.previous = {}
                _state.reset()


@contextlib.contextmanager
def interrupted_note(after: str) -> Iterator[None]:
    """An :class:`Interrupted` leaving the block says ``after`` (what was kept), unless a block
    inside it said more."""
    try:
        yield
    except Interrupted as err:
        err.after = err.after or after
        raise


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal arriving in the block is held back to its end (then raised as
    :class:`Interrupted`, unless an exception already leaves the block): a few lines that must
    not be cut in the middle."""
    if not _in_main_thread():
        yield
        return
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
    # Reached only when the block ended normally: an exception on its way wins over the signal.
    if _state.deferring == 0 and _state.pending is not None and _state.raised is None and not _state.stops:
        signum, _state.pending = _state.pending, None
        _raise(signum)


class Shielded:
    """A context manager whose ``__exit__`` runs under :func:`deferred`: a signal never cuts its
    clean-up short (``with Shielded(StartCleanup(...)):``)."""

    def __init__(self, manager: object) -> None:
        self.manager = manager

    def __enter__(self) -> object:
        return self.manager.__enter__()

    def __exit__(self, *exc: object) -> object:
        with deferred():
            return self.manager.__exit__(*exc)


def ignore_stop_signals() -> None:
    """For a data-loader worker: SIGINT, SIGTERM and SIGHUP are the main process's to act on. The
    one SIGTERM a worker obeys is its own main process's: ``multiprocessing`` ends workers that
    outlive their loader that way when the process exits (a worker ignoring it would hang that
    exit), so SIGTERM is blocked and a thread waits for it, ending the worker only when its
    parent sent it. Without ``sigwaitinfo`` (macOS) SIGTERM is ignored outright."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
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
    """While active, the first stop signal sets ``requested``: the training loop stops at its next
    step boundary and saves (module docstring); a second SIGINT raises :class:`Interrupted`.

    ``watch_parent`` (a worker of torchrun): the launcher's death is a stop request too, seen by
    the next read of ``requested`` (every step). A launcher killed outright (SIGKILL) cannot pass a
    signal on, and its workers would otherwise train on headless; they stop and save instead. The
    check is a ``getppid()`` per read, not a thread: a thread in the training process makes each
    data-loader fork riskier (a fork copies no thread but the caller, and no lock another held).
    """

    SIGNALS = STOP_SIGNALS

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
        if _in_main_thread():  # signal() only works there
            if _state.installed == 0 and not _state.stops:  # used on its own (a test): the same handler
                _state.reset()  # what an earlier call left (an interrupt it raised) is not this one's
                self._previous = _install()
            _state.stops.append(self)
        self._launcher = os.getppid() if self.watch_parent else None
        return self

    def __exit__(self, *exc: object) -> None:
        self._launcher = None
        if self in _state.stops:
            _state.stops.remove(self)
        with _held():
            _restore(self._previous)
            if self._previous:  # it installed the handlers: the process's answer ends with it
                _state.reset()
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None = None) -> None:
        name = signal.Signals(signum).name
        _state.stop_signal = _state.stop_signal or signum
        if self._requested and signum == signal.SIGINT:
            _state.stops.remove(self)  # from here the run unwinds: a third signal is the OS's
            _raise(signum, f"again (a stop was requested by {self._requested})")
        self._request(name, f"{name} received")

    def _request(self, reason: str, why: str) -> None:
        if self._requested:
            return  # a stop is on its way (a SIGTERM both from the job and from its launcher)
        self._requested = reason
        log.warning("%s: stopping after the current step and saving a checkpoint", why)


def stopping_signal() -> int | None:
    """The signal this command was asked to stop by (a graceful stop or an interrupt), or None:
    a rank whose collective fails after it is seeing a peer that stopped first, not a fault."""
    return _state.raised or _state.stop_signal


class Terminated(SystemExit):
    """SIGTERM (or SIGHUP) passed on by segadv-experiment to its trainer: the launcher ends with the
    signal's exit code once the trainer has stopped (segadv/experiment/launcher.py)."""
