"""segadv/training/loop.py's ``train`` called as a library (no command around it): the stop signals
are segadv's from before the start's first write to the return."""

from __future__ import annotations

import signal

import pytest

from segadv import signals
from segadv.errors import UserError
from segadv.training import loop, run_dir as rundir


def test_train_as_a_library_answers_the_stop_signals_from_its_first_write(tiny_cfg, monkeypatch):
    seen = []

    def check_writable(run_dir):  # the start's first write: the run dir's write probe
        seen.append({sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS})
        raise UserError("stopped here")

    monkeypatch.setattr(rundir, "check_writable", check_writable)
    before = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    with pytest.raises(UserError, match="stopped here"):
        loop.train(tiny_cfg)
    assert seen == [{sig: signals._dispatch for sig in signals.STOP_SIGNALS}]
    assert {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS} == before  # put back at the return
