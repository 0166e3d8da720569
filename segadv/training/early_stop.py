"""``train.early_stop``: a run ends when an evaluation score has stopped improving.

Lightning's ``EarlyStopping(monitor, patience, min_delta, mode)`` and mmengine's
``EarlyStoppingHook(monitor, patience, min_delta, rule)``, for segadv's evaluations: at each
evaluation the ``monitor`` score (``val/mIoU``, ``val/pixel_acc`` or a label-free ``proxy/*``
score, each in its own direction: that is ``mode`` / ``rule``) is compared with the best so far.
An improvement is a better score by at least ``min_delta`` (0: any better score; an equal one is
none, as for best.pt; a NaN never is); ``patience`` evaluations in a row without one stop the run
after that evaluation, with a checkpoint (segadv/training/stopping.py). The first evaluation
always sets the best.

The count is a checkpoint entry (``early_stop``: the score watched, the best, its step, the
evaluations since), so a resumed run goes on counting where its checkpoint left off, and a run
that stopped early stays stopped (:func:`stopped_early`) until a resume gives it more patience.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Mapping

from segadv.checkpoint.manager import better
from segadv.config.schema import EarlyStopConfig, best_score_by, higher_is_better
from segadv.errors import UserError

if TYPE_CHECKING:
    from segadv.config import Config
    from segadv.methods import Method

log = logging.getLogger("segadv.training.loop")  # the loop's lines, train.log's name for them

KEY = "train.early_stop"


class EarlyStop:
    """The count of evaluations without improvement, a Stateful (checkpoint entry ``early_stop``;
    None where ``train.early_stop.monitor`` is null)."""

    def __init__(self, settings: EarlyStopConfig) -> None:
        self.monitor, self.patience, self.min_delta = settings.monitor, settings.patience, settings.min_delta
        self.best: float | None = None  # the best monitor score so far
        self.best_step: int | None = None
        self.wait = 0  # evaluations since the best that did not improve on it

    @property
    def enabled(self) -> bool:
        return self.monitor is not None

    @property
    def exhausted(self) -> bool:
        """``patience`` evaluations in a row have not improved: the run stops (or has stopped)."""
        return self.enabled and self.wait >= self.patience

    def state_dict(self) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        return {"monitor": self.monitor, "best": self.best, "best_step": self.best_step, "wait": self.wait}

    def load_state_dict(self, state: Any) -> None:
        """The checkpoint's count, where it watched the same score; else the count starts over
        (said so)."""
        if not self.enabled:
            if isinstance(state, Mapping):
                log.info("%s: off in this run (the checkpoint watched %s)", KEY, state.get("monitor"))
            return
        if not self.restore(state):
            if isinstance(state, Mapping):
                log.warning("%s: the checkpoint watched %s, this run watches %s (%s.monitor): the count starts over",
                            KEY, state.get("monitor"), self.monitor, KEY)
            else:
                log.info("%s: watching %s from the step resumed at (the checkpoint's run did not watch one)",
                         KEY, self.monitor)
            return
        if self.best is not None:
            log.info("%s: %s best %.4f at step %d, %d of %d evaluations without improvement since", KEY,
                     self.monitor, self.best, self.best_step, self.wait, self.patience)

    def restore(self, state: Any) -> bool:
        """Take ``state``'s count where it is one of the same monitor; whether it was."""
        if not (isinstance(state, Mapping) and state.get("monitor") == self.monitor):
            return False
        best, best_step, wait = state.get("best"), state.get("best_step"), state.get("wait")
        if not (isinstance(wait, int) and wait >= 0 and (best is None or isinstance(best, (int, float)))
                and (best_step is None or isinstance(best_step, int))):
            return False
        self.best, self.best_step, self.wait = (None if best is None else float(best)), best_step, wait
        return True

    def score(self, metrics: Mapping[str, Any]) -> float:
        """The monitor's value among an evaluation's metrics (``mIoU``, ``pixel_acc``, ``proxies``);
        NaN where it is missing."""
        if self.monitor == "val/mIoU":
            value = metrics.get("mIoU")
        elif self.monitor == "val/pixel_acc":
            value = metrics.get("pixel_acc")
        else:
            value = (metrics.get("proxies") or {}).get(self.monitor)
        return math.nan if value is None else float(value)

    def improves(self, score: float) -> bool:
        if not better(score, self.best, higher_is_better(self.monitor)):
            return False
        return self.best is None or abs(score - self.best) >= self.min_delta

    def update(self, step: int, metrics: Mapping[str, Any]) -> str | None:
        """The evaluation at ``step`` counted (every rank: the metrics are all-reduced, so every
        rank counts alike); the reason to stop where it exhausts the patience, else None."""
        if not self.enabled:
            return None
        score = self.score(metrics)
        if self.improves(score):
            self.best, self.best_step, self.wait = score, step, 0
            return None
        self.wait += 1
        log.info("%s: %s %.4f at step %d does not improve on %.4f (step %s)%s: %d of %d", KEY, self.monitor, score,
                 step, math.nan if self.best is None else self.best, self.best_step, self._by(), self.wait,
                 self.patience)
        return self.reason() if self.exhausted else None

    def reason(self, best: Mapping[str, Any] | None = None) -> str:
        """Why the run stops, for the log, status.json's ``stopped_by`` and a resume. ``best``:
        best.pt's record (a checkpoint's ``best``), the one best the message gives. best.pt takes
        any better score of its own ``checkpoint.best_by`` while the count waits for an
        improvement by ``min_delta`` of its monitor, so the two may differ: then the monitor's
        own follows, said to be the count's."""
        evaluations = "1 evaluation" if self.wait == 1 else f"{self.wait} evaluations"
        head = f"{KEY}: {self.monitor} did not improve{self._by()} for {evaluations}"
        if best is None:  # no best.pt (no finite score yet, or a record without one)
            own = "no finite score" if self.best is None else f"best {self.best:.4f} at step {self.best_step}"
            return f"{head} ({own})"
        by, value = best_score_by(best), float(best.get("score", best["mIoU"]))
        if by == self.monitor and best["step"] == self.best_step:
            return f"{head} (best {value:.4f} at step {best['step']})"
        named = "" if by == self.monitor else f"{by} "
        own = (f"{self.monitor} has had no finite score" if self.best is None else
               f"the count's reference is {'' if by == self.monitor else f'{self.monitor} '}{self.best:.4f} at step "
               f"{self.best_step}, its last improvement{self._by()}")
        return f"{head} (best {named}{value:.4f} at step {best['step']}, in best.pt; {own})"

    def _by(self) -> str:
        return f" by {self.min_delta:g} or more" if self.min_delta else ""


def stopped_early(settings: EarlyStopConfig, state: Any, best: Mapping[str, Any] | None = None) -> str | None:
    """Why a checkpoint's run stopped early under ``settings`` (a resume's config), or None: it
    watched the same score and has had ``patience`` evaluations without improvement. ``best``:
    the checkpoint's best.pt record, the best the reason gives."""
    early = EarlyStop(settings)
    if not early.enabled or not early.restore(state) or not early.exhausted:
        return None
    return early.reason(best if isinstance(best, Mapping) and "mIoU" in best and "step" in best else None)


def check_monitor(cfg: "Config", method: "type[Method]") -> None:
    """``train.early_stop.monitor`` names a score this run's evaluations compute: the label-free
    scores only where the method reads unlabeled or target images, ``proxy/d_confidence`` only
    with a D (the same rule as checkpoint.best_by's)."""
    monitor = cfg.train.early_stop.monitor
    if monitor is None or monitor.startswith("val/"):
        return
    if not method.reads_unlabeled(cfg):
        raise UserError(f"{KEY}.monitor: {monitor} is a label-free score, computed by a run with unlabeled or target "
                        f"images; this {method.name} run has none (watch val/mIoU or val/pixel_acc)")
    if monitor == "proxy/d_confidence" and "discriminator" not in method.networks(cfg):
        raise UserError(f"{KEY}.monitor: proxy/d_confidence is D's score; this {method.name} run trains no D")
