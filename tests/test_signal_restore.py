"""segadv/signals.py's handler in a process of its own: a signal that comes while the handlers go
back is taken by segadv, never released to the default action. Commands under real signals:
tests/integration/test_signals.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SIGNAL_AS_THE_HANDLERS_GO_BACK = """
import logging, os, signal, sys
logging.basicConfig(level=logging.WARNING)
from segadv import signals

real = signal.signal

def swap(sig, handler):
    previous = real(sig, handler)
    if sig == signal.SIGTERM and handler is signal.SIG_DFL:  # handling_signals() putting the default back
        os.kill(os.getpid(), signal.SIGTERM)  # held back meanwhile: pending as the block ends
    return previous

signal.signal = swap
with signals.handling_signals():
    pass
print("still here", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def test_a_signal_held_back_while_the_default_goes_back_is_taken_not_released_to_it():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SIGNAL_AS_THE_HANDLERS_GO_BACK], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "still here True"), done.stderr
    assert "SIGTERM as the command ended: it ends as it answered" in done.stderr
