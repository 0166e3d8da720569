"""Loss pieces for the adversarial step.

Every loss averaged over a selection of pixels (the labelled ones, the confident ones, a class, a
mixed region) is defined when the selection is empty: 0, still connected to the network's output
(so its backward runs, and DDP and accumulation see the same graph on every rank and micro-batch)
with zero gradient. An empty selection is normal, not a divergence: a crop of Cityscapes' void or
of a VOC border, a batch whose pseudo labels no pixel is confident of. Each iteration reports
which of its losses averaged over nothing as ``empty/<loss>`` (:func:`empty_selection`), so the
divergence guard (segadv/engine/nonfinite.py) only ever sees a non-finite value of a loss that
had pixels to average. No function here reads a tensor on the host: the count is clamped rather
than branched on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from segadv.monitor.meters import EMPTY_PREFIX

__all__ = ["EMPTY_PREFIX", "empty_selection", "masked_bce_with_logits", "masked_cross_entropy", "masked_mean",
           "one_hot_labels", "pseudo_labels"]


def one_hot_labels(labels: torch.Tensor, num_classes: int, valid: torch.Tensor) -> torch.Tensor:
    """(N,H,W) class ids -> (N,C,H,W) float one-hot, all-zero at ignored pixels."""
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    onehot = F.one_hot(safe, num_classes).permute(0, 3, 1, 2).to(torch.float32)
    return onehot * valid.unsqueeze(1)


def masked_mean(per_pixel: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """The mean of ``per_pixel`` over the ``selected`` pixels (a bool mask, or 0/1 weights, of its
    shape); 0 with zero gradient when none is selected."""
    weights = selected.to(per_pixel.dtype)
    return (per_pixel * weights).sum() / weights.sum().clamp_min(1.0)


def masked_bce_with_logits(logits: torch.Tensor, target: float, valid: torch.Tensor) -> torch.Tensor:
    """Mean per-pixel BCE of D's (N,1,H,W) logits against a constant target, over the (N,H,W)
    ``valid`` pixels; 0 when none is."""
    logits = logits.squeeze(1).float()
    per_pixel = F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target), reduction="none")
    return masked_mean(per_pixel, valid)


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean CE over the pixels that are not ``ignore_index``; 0 (not NaN) when every pixel is.

    Every CE against labels with an ignore value goes through here: ``F.cross_entropy``'s mean
    would be 0/0 on a batch with no labelled pixel (an all-void crop, pseudo labels with no
    confident pixel), and the divergence guard would stop the run for it.
    """
    per_pixel = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="none")
    count = (labels != ignore_index).sum()
    return per_pixel.sum() / count.clamp_min(1).to(per_pixel.dtype)


def empty_selection(*selections: torch.Tensor) -> torch.Tensor:
    """1.0 where any of ``selections`` (one per term of a loss: bool masks, or weights whose zeros
    select nothing) selects no pixel, else 0.0: a float32 0-dim tensor on the first one's device,
    an iteration's ``empty/<loss>`` (no host sync)."""
    empty = [~s.detach().bool().any() for s in selections]
    flags = empty[0] if len(empty) == 1 else torch.stack([e.to(empty[0].device) for e in empty]).any()
    return flags.float()


def pseudo_labels(
    logits: torch.Tensor, confidence: torch.Tensor, threshold: float | torch.Tensor, ignore_index: int
) -> torch.Tensor:
    """G's argmax as labels, ``ignore_index`` where D's confidence (N,H,W) is below ``threshold``."""
    labels = logits.detach().argmax(dim=1)
    return torch.where(confidence < threshold, torch.full_like(labels, ignore_index), labels)
