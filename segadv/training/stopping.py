"""When the training loop stops, and how a run that returns ends: one object, asked after every step.

A run ends at ``train.max_steps`` (``finished``) or earlier (``stopped``, with a checkpoint), for one
of these reasons, each checked where it can be known:

- ``stop_at`` (``train(stop_at=N)``): after step N, as a preempted run would;
- a stop signal (segadv/signals.py ``StopRequests``: SIGINT, SIGTERM, SIGHUP, a torchrun launcher
  gone), agreed across the ranks every step (``StepAgreement``: one step late, so a signal that
  reaches one rank only stops them all at the same step);
- D out of its band under ``train.on_discriminator_collapse: stop``, known at log steps only
  (the reporter reads the losses there) and the same on every rank;
- ``train.early_stop``: its score without improvement for ``patience`` evaluations, known at
  evaluations only (segadv/training/early_stop.py) and the same on every rank (the metrics are
  all-reduced).

Precedence: reaching ``train.max_steps`` wins (a stop asked at the last step ends the run
``finished``), then ``stop_at``, then a signal, then D's health, then the early stop (each read
only where nothing before it stops the run). Both endings exit 0; an error that ends a run
(diverged, a failed write, a second SIGINT) is an exception, recorded as it leaves
(segadv/monitor/status.py ``RunRecord``).
"""

from __future__ import annotations

from typing import Literal, Protocol

from segadv.errors import EXIT_OK

ANOTHER_RANK = "a signal on another rank"


class Requests(Protocol):
    def seen(self, step: int) -> str | None: ...  # segadv/signals.py StopRequests


class Agreement(Protocol):  # segadv/parallel/distributed.py StepAgreement
    def any(self, flag: bool) -> bool: ...
    def settle(self) -> None: ...
    def close(self) -> None: ...


class StopDecision:
    """Whether the loop stops after the step it last heard of, why, and how the run then ends.

    The loop calls :meth:`after_step` after every step (on every rank: it takes part in the ranks'
    agreement, a collective each step), :meth:`at_log` at the steps it logs and
    :meth:`at_evaluation` after the evaluations; it then reads
    :attr:`early` (stop before ``max_steps``: log this step and checkpoint it), :attr:`final` (the
    last step of the run: evaluate it) and :attr:`now` (this step is the loop's last, whichever).
    Once the loop has left, :attr:`stopped_by`, :attr:`outcome` and :attr:`exit_code` tell the end.
    """

    def __init__(self, step: int, max_steps: int, requests: Requests, agreement: Agreement,
                 stop_at: int | None = None) -> None:
        self.step, self.max_steps, self.stop_at = step, max_steps, stop_at
        self.requests, self.agreement = requests, agreement
        self.reason: str | None = None  # what asked for the stop (kept at the last step too)

    def after_step(self, step: int) -> None:
        """Step ``step`` is done: stop_at, then this rank's signal as the ranks agree on it."""
        self.step = step
        requested = self.requests.seen(step)
        agreed = self.agreement.any(requested is not None)  # every step, whatever else decides
        if step == self.stop_at:
            self.reason = "stop_at"
        elif agreed:
            self.reason = requested or ANOTHER_RANK
        else:
            self.reason = None

    def at_log(self, reason: str | None) -> None:
        """A log step's own reason to stop (the reporter's ``stop_reason``: D's health), heard only
        where nothing stops the run at this step already."""
        if self.reason is None and not self.final:
            self.reason = reason

    def at_evaluation(self, reason: str | None) -> None:
        """An evaluation's own reason to stop (``train.early_stop``), heard only where nothing
        stops the run at this step already."""
        if self.reason is None and not self.final:
            self.reason = reason

    @property
    def final(self) -> bool:
        """The step is ``train.max_steps``."""
        return self.step >= self.max_steps

    @property
    def early(self) -> bool:
        """The run stops after this step, before ``train.max_steps``."""
        return self.reason is not None and not self.final

    @property
    def now(self) -> bool:
        """The loop leaves after this step (the run's end, or an early stop)."""
        return self.final or self.early

    @property
    def stopped_by(self) -> str | None:
        """Why the run ended before ``train.max_steps``; None where it finished."""
        return self.reason if self.early else None

    @property
    def outcome(self) -> Literal["finished", "stopped"]:
        """status.json's outcome of a run that returns."""
        return "stopped" if self.stopped_by else "finished"

    @property
    def exit_code(self) -> int:
        """A run that returns exits 0, stopped or finished: a stopped one resumes (--resume auto)."""
        return EXIT_OK

    def settle(self) -> None:
        """Before an evaluation forks its loader workers: no reduction left in flight."""
        self.agreement.settle()

    def close(self) -> None:
        """The loop has left: the last reduction collected."""
        self.agreement.close()
