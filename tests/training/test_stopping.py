"""The loop's stop decision (segadv/training/stopping.py) without a training: each reason, the
ranks' agreement one step late, and which reason wins where two arrive at the same step. The runs
these stand for: tests/integration/test_signals.py (signals), test_resume.py (stop_at),
tests/training/test_discriminator_health.py (D's health)."""

from __future__ import annotations

import pytest

from segadv.errors import EXIT_OK
from segadv.training.stopping import ANOTHER_RANK, StopDecision


class Requests:
    """StopRequests as the loop reads it: the request seen from ``at`` on."""

    def __init__(self, reason: str | None = None, at: int | None = None) -> None:
        self.reason, self.at = reason, at
        self.read: list[int] = []

    def seen(self, step: int) -> str | None:
        self.read.append(step)
        return self.reason if self.at is not None and step >= self.at else None


class Alone:
    """One process: the flag agreed at once."""

    def __init__(self) -> None:
        self.flags: list[bool] = []
        self.settled = self.closed = 0

    def any(self, flag: bool) -> bool:
        self.flags.append(flag)
        return flag

    def settle(self) -> None:
        self.settled += 1

    def close(self) -> None:
        self.closed += 1


class Ranks(Alone):
    """Under DDP: each call answers the previous call's flag, raised on any rank (``others``:
    the calls at which another rank raised it)."""

    def __init__(self, others: set[int] = frozenset()) -> None:
        super().__init__()
        self.others, self.previous = others, False

    def any(self, flag: bool) -> bool:
        self.flags.append(flag)
        agreed, self.previous = self.previous, flag or len(self.flags) in self.others
        return agreed


def decision(max_steps=10, requests=None, agreement=None, stop_at=None, step=0):
    return StopDecision(step, max_steps, requests or Requests(), agreement or Alone(), stop_at=stop_at)


def run_to_stop(stop: StopDecision, health: dict[int, str] | None = None, log_every: int = 1) -> int:
    """The loop's calls, step after step, until it leaves; the step it left at."""
    step = stop.step
    while not stop.now:
        step += 1
        stop.after_step(step)
        if step % log_every == 0 or step == stop.max_steps or stop.early:
            stop.at_log((health or {}).get(step))
    return step


def test_nothing_asked_runs_to_max_steps_and_finishes():
    stop = decision(max_steps=10)
    stop.after_step(3)
    assert not (stop.now or stop.early or stop.final) and stop.reason is None
    assert run_to_stop(stop) == 10
    assert (stop.final, stop.early, stop.now) == (True, False, True)
    assert (stop.stopped_by, stop.outcome, stop.exit_code) == (None, "finished", EXIT_OK)


def test_a_resume_at_max_steps_runs_no_step():
    stop = decision(max_steps=10, step=10)
    assert stop.now and stop.final and run_to_stop(stop) == 10 and stop.outcome == "finished"


def test_a_signal_stops_after_the_step_it_was_seen_at():
    requests = Requests("SIGTERM", at=4)
    stop = decision(requests=requests)
    assert run_to_stop(stop) == 4
    assert (stop.early, stop.final, stop.now) == (True, False, True)
    assert (stop.stopped_by, stop.outcome, stop.exit_code) == ("SIGTERM", "stopped", EXIT_OK)
    assert requests.read == [1, 2, 3, 4]


def test_under_ddp_a_signal_stops_every_rank_one_step_late():
    """The rank that got it and the ranks that did not stop at the same step, the next one."""
    here = decision(requests=Requests("SIGINT", at=4), agreement=Ranks())
    assert run_to_stop(here) == 5 and here.stopped_by == "SIGINT"
    elsewhere = decision(agreement=Ranks(others={4}))
    assert run_to_stop(elsewhere) == 5 and elsewhere.stopped_by == ANOTHER_RANK


def test_stop_at_stops_after_that_step():
    stop = decision(stop_at=4)
    assert run_to_stop(stop) == 4
    assert (stop.stopped_by, stop.outcome, stop.exit_code) == ("stop_at", "stopped", EXIT_OK)


def test_stop_at_the_last_step_finishes():
    stop = decision(max_steps=6, stop_at=6)
    assert run_to_stop(stop) == 6 and stop.reason == "stop_at"
    assert (stop.stopped_by, stop.outcome) == (None, "finished")


def test_d_health_stops_at_a_log_step_only():
    """D's reason is known where the reporter logs: at step 6, not at the step 5 it was unlogged."""
    stop = decision()
    assert run_to_stop(stop, health={5: "discriminator collapse", 6: "discriminator collapse"}, log_every=3) == 6
    assert (stop.stopped_by, stop.outcome) == ("discriminator collapse", "stopped")


@pytest.mark.parametrize("at", [1, 5])
def test_the_agreement_is_asked_every_step_whatever_else_stops(at):
    """A collective on every rank every step: a stop_at or a signal never skips it."""
    agreement = Alone()
    stop = decision(requests=Requests("SIGTERM", at=at), agreement=agreement, stop_at=at)
    assert run_to_stop(stop) == at and agreement.flags == [False] * (at - 1) + [True]
    stop.settle()
    stop.close()
    assert (agreement.settled, agreement.closed) == (1, 1)


# Two reasons at the same step: which one the run ends with.

def test_a_signal_at_the_last_step_finishes_the_run():
    stop = decision(max_steps=10, requests=Requests("SIGTERM", at=10))
    assert run_to_stop(stop) == 10
    assert stop.reason == "SIGTERM" and not stop.early
    assert (stop.stopped_by, stop.outcome, stop.exit_code) == (None, "finished", EXIT_OK)


def test_another_ranks_signal_at_the_last_step_finishes_the_run():
    stop = decision(max_steps=10, agreement=Ranks(others={9}))
    assert run_to_stop(stop) == 10 and (stop.stopped_by, stop.outcome) == (None, "finished")


def test_stop_at_wins_over_a_signal_at_the_same_step():
    stop = decision(requests=Requests("SIGHUP", at=4), stop_at=4)
    assert run_to_stop(stop) == 4 and stop.stopped_by == "stop_at"


def test_a_signal_wins_over_d_health_at_the_same_step():
    stop = decision(requests=Requests("SIGTERM", at=4))
    assert run_to_stop(stop, health={4: "discriminator collapse"}) == 4 and stop.stopped_by == "SIGTERM"


def test_stop_at_wins_over_d_health_at_the_same_step():
    stop = decision(stop_at=4)
    assert run_to_stop(stop, health={4: "discriminator collapse"}) == 4 and stop.stopped_by == "stop_at"


def test_d_health_at_the_last_step_finishes_the_run():
    stop = decision(max_steps=10)
    assert run_to_stop(stop, health={10: "discriminator collapse"}) == 10
    assert (stop.reason, stop.stopped_by, stop.outcome) == (None, None, "finished")
