"""One network's optimisation state: optimizer, LR schedule, autocast and its own GradScaler.

Each network gets its own (as mmengine's AmpOptimWrapper does per optimizer): an fp16 overflow in
D skips only D's step and only halves D's scale.

A network's loss is scaled whenever its backward passes through float16, its own or another
network's: G's adversarial term flows back through D, so an fp16 D needs G's loss scaled even when
G itself runs in float32 or bfloat16 (``loss_scaling``, decided in ``build.py``).
"""

from __future__ import annotations

import logging
import warnings
from contextlib import AbstractContextManager
from typing import Any

import torch

from segadv.config.schema import NetworkAmpConfig


log = logging.getLogger(__name__)

# When GradScaler skips an optimizer step on overflow the schedule still advances, as it should;
# torch warns about that order on the first step only. It is expected here, not a bug.
warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")


def uses_float16(amp: NetworkAmpConfig) -> bool:
    return amp.enabled and amp.dtype == "float16"


class AmpOptimizer:
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        device: torch.device,
        amp: NetworkAmpConfig,
        loss_scaling: bool | None = None,
        name: str = "network",
    ) -> None:
        self.name = name  # for log lines
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.autocast_dtype = getattr(torch, amp.dtype)
        self.autocast_enabled = amp.enabled
        # Loss scaling only matters for float16; bfloat16 has float32's exponent range.
        if loss_scaling is None:
            loss_scaling = uses_float16(amp)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=amp.init_scale, enabled=loss_scaling)

    def autocast(self) -> AbstractContextManager:
        """Autocast for this network's own device type and dtype."""
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_enabled)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self) -> None:
        """Optimizer step (skipped on inf/nan gradients), scale update, gradients cleared, LR step."""
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def loss_scale(self) -> float:
        """The current loss scale (1.0 when scaling is off). Syncs with the device: log time only."""
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        saved_scaler = state["scaler"]  # {} when saved with loss scaling off
        if self.scaler.is_enabled() and not saved_scaler:
            log.info("%s: loss scaling is on now but was off in the checkpoint: the GradScaler starts "
                     "fresh (scale %g)", self.name, self.scaler.get_scale())
        elif saved_scaler and not self.scaler.is_enabled():
            log.info("%s: loss scaling is off now; the checkpoint's scale (%g) is not used",
                     self.name, saved_scaler.get("scale", float("nan")))
        else:
            self.scaler.load_state_dict(saved_scaler)
