"""What a non-finite loss does to a run (``train.on_nonfinite``), checked where the loop reads its
losses anyway: at log steps and before every save, never on the step itself.

A batch with nothing to average a loss over (no labelled or no confident pixel) is not one: that
loss is 0 there, counted in ``train/empty/<loss>`` (segadv/engine/losses.py), so what is checked
here is always a loss that had pixels to average.

stop (default): a NaN or infinite loss ends the run with :class:`segadv.errors.Diverged` (exit 3).
Where a network's loss is scaled for float16, an overflow its GradScaler skipped is normal: there
the weights decide, and the run stops only if they hold a NaN or an infinity. skip_step: each
network's update with non-finite gradients is skipped (segadv/engine/amp_optimizer.py); the skips
are counted, logged as ``train/skipped_steps/<network>`` and warned about. Either way, a state with
non-finite weights is never saved (the checkpoint manager refuses it).
"""

from __future__ import annotations

import logging
import math

import torch

from segadv.checkpoint import CheckpointManager
from segadv.engine.amp_optimizer import AmpOptimizer
from segadv.errors import Diverged
from segadv.monitor.meters import LossAverager
from segadv.parallel import distributed

log = logging.getLogger(__name__)


class NonFiniteGuard:
    def __init__(self, policy: str, checkpoints: CheckpointManager, device: torch.device) -> None:
        self.policy = policy
        self.optimizers = [state for state in checkpoints.states.values() if isinstance(state, AmpOptimizer)]
        self.checkpoints = checkpoints
        self.device = device  # where the ranks' losses are averaged (the generator's)
        self.checked_through = checkpoints.step  # losses of the steps up to here are checked
        self.skips_reported = {opt.name: 0 for opt in self.optimizers}

    def check(self, step: int, losses: dict[str, float]) -> None:
        """``losses``: each loss's mean over the steps since the last check, averaged over ranks
        (the same numbers on every rank, so every rank decides alike)."""
        first, self.checked_through = self.checked_through + 1, step
        bad = [f"train/{name} = {value}" for name, value in losses.items() if not math.isfinite(value)]
        if not bad:
            return
        where = f"step {step}" if first == step else f"steps {first}-{step}"
        what = f"{', '.join(bad)} in {where}"
        if self.policy == "skip_step":
            log.warning("%s: those updates were skipped (train.on_nonfinite: skip_step)", what)
            return
        if any(opt.scales_loss for opt in self.optimizers):
            self.checkpoints.finite_state(step, cause=f"{what}, and ")  # raises if the weights are not finite
            log.warning("%s: the float16 GradScaler skipped those steps and the weights are finite: going on", what)
            return
        raise Diverged(f"training diverged: {what} (train.on_nonfinite: stop); {self.checkpoints.resume_note()}. "
                       "Lower the learning rate or check the data; train.on_nonfinite: skip_step skips such "
                       "steps instead")

    def check_unlogged(self, step: int, losses: LossAverager) -> None:
        """Before a save: the losses since the last log, not yet read (a sync, at save time only)."""
        if losses.steps:
            self.check(step, distributed.mean_over_ranks(losses.means(), self.device))

    def skipped(self) -> dict[str, float]:
        """``train/skipped_steps/<network>`` at log time (a host read), warning when they grew."""
        counts = {opt.name: int(opt.skipped) for opt in self.optimizers if opt.skipped is not None}
        for name, count in counts.items():
            if count > self.skips_reported[name]:
                log.warning("%s: %d update(s) with non-finite gradients skipped so far (train.on_nonfinite: "
                            "skip_step)", name, count)
                self.skips_reported[name] = count
        return {f"train/skipped_steps/{name}": float(count) for name, count in counts.items()}
