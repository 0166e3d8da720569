"""What D's side of the game looks like: D's accuracy on real and fake maps, its confidence on
unlabeled pixels (for a histogram), and a warning when D wins outright, the failure users of
AdvSemiSeg's reference report (D's loss near zero; G's adversarial terms then teach little and
self-training's confidence mask empties)."""

from __future__ import annotations

import logging
from typing import Mapping, Optional

import torch

from segadv.config.schema import LogConfig

log = logging.getLogger(__name__)


def d_accuracy(logits: torch.Tensor, target: float, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Fraction of D's (N,1,H,W) logits on ``target``'s side of 0 (target 1: > 0, target 0: < 0)
    over the (N,H,W) ``valid`` pixels (None: all). A 0-dim float32 tensor on the logits' device,
    no host sync; 0 when no pixel is valid (like the masked losses, the count is clamped to 1)."""
    logits = logits.squeeze(1).detach()
    correct = logits > 0 if target > 0.5 else logits < 0
    if valid is None:
        return correct.float().mean()
    weights = valid.float()
    return (correct.float() * weights).sum() / weights.sum().clamp_min(1.0)


def d_confidence(logits: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """D's confidence sigmoid(logits) at the (N,H,W) ``valid`` pixels of (N,1,H,W) logits (None:
    every pixel), flat float32, for ``MetricWriter.histogram``. Selecting by a mask syncs with
    the device: call it at log time, not every step."""
    confidence = torch.sigmoid(logits.squeeze(1).detach().float())
    return confidence.flatten() if valid is None else confidence[valid]


def auroc(scores: torch.Tensor, positives: torch.Tensor) -> float:
    """The area under the ROC curve of ``scores`` for the boolean ``positives``: the probability
    that a random positive scores above a random negative, ties counting half (the Mann-Whitney U
    over n_pos * n_neg). NaN when either class is empty."""
    scores, positives = scores.flatten().double(), positives.flatten().bool()
    n_pos = int(positives.sum())
    n_neg = positives.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = scores.argsort()
    _, inverse, counts = torch.unique_consecutive(scores[order], return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = ((ends - counts + 1 + ends) / 2)[inverse]  # 1-based, tied scores share their mean rank
    rank_sum = ranks[positives[order]].sum().item()
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def confidence_quality(preds: torch.Tensor, confidence: torch.Tensor, passes: torch.Tensor, truth: torch.Tensor,
                       ignore_index: int) -> dict[str, float]:
    """Does D know which pixels G got right? Over the labeled pixels of (N,H,W) maps: the AUROC of
    D's ``confidence`` for "G's argmax ``preds`` equals ``truth``", the precision of the pixels
    that ``passes`` the method's mask (the share of them G got right) and that share of pixels.
    The truth is read for this diagnostic only, never by training."""
    labeled = truth != ignore_index
    correct = (preds == truth)[labeled]
    passing = passes[labeled]
    return {
        "d_confidence_auroc": auroc(confidence[labeled], correct),
        "d_mask_precision": correct[passing].float().mean().item() if passing.any() else float("nan"),
        "d_mask_pass": passing.float().mean().item(),
        "g_pixel_acc": correct.float().mean().item(),
    }


class DWinsDetector:
    """Warns once, with the numbers, when ``loss_d`` (its value at each log step) has been below
    ``bound`` at ``steps`` consecutive log steps. Its count starts over on a resumed run."""

    def __init__(self, bound: float, steps: int, name: str = "loss_d") -> None:
        self.bound, self.steps, self.name = bound, steps, name
        self._streak: list[tuple[int, float]] = []
        self.warned = False

    @classmethod
    def from_config(cls, cfg: LogConfig, name: str = "loss_d") -> Optional["DWinsDetector"]:
        """``log.d_wins_loss`` and ``log.d_wins_steps``; None when ``log.d_wins_loss`` is None."""
        return None if cfg.d_wins_loss is None else cls(cfg.d_wins_loss, cfg.d_wins_steps, name)

    def update(self, step: int, loss_d: float) -> bool:
        """Takes one log step's value; True when this call warned."""
        if self.warned:
            return False
        if not loss_d < self.bound:  # NaN too: not a win
            self._streak.clear()
            return False
        self._streak.append((step, loss_d))
        if len(self._streak) < self.steps:
            return False
        self.warned = True
        values = [value for _, value in self._streak]
        log.warning(
            "D wins outright: %s below %g at %d consecutive log steps (steps %d-%d; min %.4f, now %.4f): D "
            "tells G's maps from real ones almost surely, so G's adversarial terms carry little signal and "
            "a confidence-masked self-training loss passes few pixels (log.d_wins_loss, log.d_wins_steps).",
            self.name, self.bound, self.steps, self._streak[0][0], step, min(values), loss_d)
        return True


class DWinsWatch:
    """One :class:`DWinsDetector` per D loss, fed the averaged losses of each log step. A loss the
    run does not log (``loss_d_aux`` with one D, any with MinEnt) is skipped."""

    def __init__(self, cfg: LogConfig, names: tuple[str, ...]) -> None:
        detectors = (DWinsDetector.from_config(cfg, name) for name in names)
        self.detectors = [detector for detector in detectors if detector is not None]

    def update(self, step: int, losses: Mapping[str, float]) -> None:
        for detector in self.detectors:
            if detector.name in losses:
                detector.update(step, losses[detector.name])
