"""A segadv command held at one point until a signal reaches it, for tests/integration/test_signals.py
(not collected by pytest).

    python tests/integration/signal_driver.py POINT COMMAND [ARG ...]

COMMAND is a console script's name (``segadv-train``, ``segadv-export``); POINT is where it waits:

- ``placement``: right after segadv-train logs its placement table (the start not yet complete);
- ``write:NAME``: in the middle of the first atomic write of ``NAME`` (``config.yaml``, ``last.pt``,
  ``status.json``): its temp file written, before the fsync and the rename;
- ``verify``: while segadv-export verifies its output (its temp file written);
- ``end``: as segadv-train records how its run ended (``RunRecord.end``, the loop over);
- ``A+B``: at A, then at B (a second signal);
- ``self-SIGNAME:NAME`` (no waiting): the command sends itself SIGNAME in the middle of its first
  write into the file NAME (``.segadv.lock``, ``train.log``, ``data_split.json``: the file itself or
  its temp file ``.NAME.tmp-PID``), half of the bytes written; ``self-SIGNAME:write-probe`` right
  after the run dir's write probe is created. The signal is raised where it lands, in the write.

There it prints ``SIGNAL-DRIVER: waiting at POINT`` on stderr and sleeps until a stop signal has
come (at most 10 minutes): a handler that raises ends the sleep with its exception, one that only
notes the signal (the training loop's) lets the command go on. The test waits for that line, so a
busy machine never makes the signal land elsewhere. Everything else is the real command.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import segadv.signals as signals

MARK = "SIGNAL-DRIVER: waiting at"
received: list[int] = []
_dispatch = signals._dispatch


def noting_dispatch(signum, frame):
    received.append(signum)
    _dispatch(signum, frame)


signals._dispatch = noting_dispatch  # what handling_signals() and StopRequests install from here on


def wait_here(point: str) -> None:
    seen = len(received)
    print(f"{MARK} {point}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + 600
    while len(received) == seen and time.monotonic() < deadline:
        time.sleep(0.02)  # a raising handler ends the wait here, with its exception


def hold_after_placement() -> None:
    from segadv.training import session

    real = session.log_placement

    def log_placement(parts):
        real(parts)
        wait_here("placement")

    session.log_placement = log_placement


def hold_in_write(name: str) -> None:
    from segadv import fsutil

    real_fsync, held = os.fsync, []

    def fsync(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if not held and os.path.basename(path).startswith(f".{name}.tmp-"):
            held.append(path)
            wait_here(f"write:{name}")
        real_fsync(fd)

    fsutil.os.fsync = fsync  # fsutil.os is os: every atomic write's fsync


def signal_in_write(sig: signal.Signals, name: str) -> None:
    from segadv import fsutil

    def ours(path: str) -> bool:
        base = os.path.basename(path)
        if name == "write-probe":
            return base.startswith(".write-probe-")
        return base == name or base.startswith(f".{name}.tmp-")

    def send(where: str) -> None:
        sent.append(where)
        print(f"SIGNAL-DRIVER: {sig.name} to itself in {where}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), sig)

    sent: list[str] = []
    real_write_all, real_opener = fsutil.write_all, fsutil._new_file_opener

    def write_all(fh, data):
        path = fh.name if isinstance(fh.name, str) else os.readlink(f"/proc/self/fd/{fh.fileno()}")
        if sent or not ours(path) or len(data) < 2:
            return real_write_all(fh, data)
        half = len(data) // 2
        real_write_all(fh, data[:half])
        send(path)  # the handler runs here or at the next instruction: inside this write either way
        return real_write_all(fh, data[half:])

    def opener(path, flags):
        fd = real_opener(path, flags)
        if not sent and name == "write-probe" and ours(path):
            send(path)
        return fd

    fsutil.write_all, fsutil._new_file_opener = write_all, opener


def hold_in_verification() -> None:
    from segadv.export import verify as verify_module

    real = verify_module.verify

    def verify(*args, **kwargs):
        wait_here("verify")
        return real(*args, **kwargs)

    verify_module.verify = verify


def hold_at_the_end() -> None:
    from segadv.monitor.status import RunRecord

    real = RunRecord.end

    def end(self, stopped_by):
        wait_here("end")
        return real(self, stopped_by)

    RunRecord.end = end


def main() -> int:
    points, command, *argv = sys.argv[1:]
    for point in points.split("+"):
        if point == "placement":
            hold_after_placement()
        elif point.startswith("write:"):
            hold_in_write(point.removeprefix("write:"))
        elif point == "verify":
            hold_in_verification()
        elif point == "end":
            hold_at_the_end()
        elif point.startswith("self-"):
            sig, name = point.removeprefix("self-").split(":", 1)
            signal_in_write(signal.Signals[sig], name)
        else:
            raise SystemExit(f"unknown point {point!r}")
    module = {"segadv-train": "segadv.cli.train", "segadv-export": "segadv.cli.export"}[command]
    main_of = __import__(module, fromlist=["main"]).main
    return main_of(argv)


if __name__ == "__main__":
    sys.exit(main())
