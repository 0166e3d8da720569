"""``segadv-train --nproc-per-node N``: the same command, re-launched through torchrun.

Signals (docs/distributed.md "Signals and exit codes"): the launcher forwards SIGTERM and SIGINT to
its workers once each time it gets one, and exits with what the workers did: 0 when every rank
stopped cleanly (a stop checkpoint saved), 130 after a second Ctrl-C (the workers were
interrupted), the code of the first rank that failed, or 128 + N for a rank killed by signal N.
A third Ctrl-C kills the workers. torchrun's own handling (forward, wait 30 s, SIGKILL, then a
``SignalException`` traceback and exit 1 whatever the workers did) is left to plain ``torchrun``.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from types import FrameType

from segadv.errors import UserError

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130
FORWARDED = (signal.SIGTERM, signal.SIGINT)
TORCHRUN_SIGNAL_VARIABLES = ("PET_SIGNALS_TO_HANDLE", "TORCHELASTIC_SIGNALS_TO_HANDLE")


def strip_option(argv: list[str], option: str) -> list[str]:
    """argv without ``option VALUE`` / ``option=VALUE``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def launch_with_torchrun(nproc_per_node: int, argv: list[str]) -> int:
    """Run ``python -m segadv.cli.train ARGV`` in N processes via torch.distributed.run (standalone
    rendezvous on this node). Returns the exit code documented above."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    if nproc_per_node < 1:
        raise UserError(f"--nproc-per-node {nproc_per_node}: give the number of processes to start, 1 or more")
    args = ["--standalone", f"--nproc-per-node={nproc_per_node}", "-m", "segadv.cli.train",
            *strip_option(argv, "--nproc-per-node")]
    with ForwardedSignals() as signals:
        try:
            torchrun_main(args)
        except ChildFailedError as err:
            return EXIT_INTERRUPTED if signals.interrupted else exit_code_of(err)
    return EXIT_INTERRUPTED if signals.interrupted else 0


def exit_code_of(err: Exception) -> int:
    """The exit code of the rank that failed first (torchrun's root cause); within the same
    second a death by SIGTERM comes last, as the others may have died of the SIGTERM torchrun sent
    them after the first failure. A rank killed by signal N (torch reports -N) as the shell does,
    128 + N."""
    failures = [f for f in err.failures.values() if f.exitcode]
    if not failures:
        return 1
    code = min(failures, key=lambda f: (f.timestamp, f.exitcode == -signal.SIGTERM)).exitcode
    return 128 - code if code < 0 else code


class ForwardedSignals:
    """While active (Linux), SIGTERM and SIGINT reach the workers through this process: each one
    it gets is sent once to each worker (torchrun starts them in sessions of their own, so a
    terminal's Ctrl-C reaches only the launcher). The workers stop at the next step and save; a
    second SIGINT interrupts them (their own rule), a third kills them and ends the launcher."""

    def __init__(self) -> None:
        self.sigints = 0
        self._previous: dict[int, object] = {}
        self._saved_env: dict[str, str | None] = {}

    @property
    def interrupted(self) -> bool:
        return self.sigints >= 2

    def __enter__(self) -> "ForwardedSignals":
        if not Path("/proc/self/stat").exists():
            return self  # no way to find the workers: torchrun's own handling
        # torchrun would replace these handlers with its own (forward, wait, SIGKILL, re-raise):
        # its --signals-to-handle (PET_ variable) or, in older releases, the variable it sets.
        for name in TORCHRUN_SIGNAL_VARIABLES:
            self._saved_env[name] = os.environ.get(name)
            os.environ[name] = "SIGHUP,SIGQUIT"
        for sig in FORWARDED:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._previous.clear()
        self._saved_env.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        workers = child_pids(os.getpid())
        if signum == signal.SIGINT:
            self.sigints += 1
        if self.sigints >= 3:
            log.warning("third Ctrl-C: killing the workers (%s)", ", ".join(map(str, workers)))
            send(workers, signal.SIGKILL)
            raise KeyboardInterrupt
        log.warning("%s: passed on to the workers (%s)", signal.Signals(signum).name, ", ".join(map(str, workers)))
        send(workers, signum)


def send(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass  # it has just exited


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc; the workers torchrun started)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == parent:
            pids.append(int(stat.parent.name))
    return sorted(pids)
