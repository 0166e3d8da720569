"""Loss pieces for the adversarial step."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def one_hot_labels(labels: torch.Tensor, num_classes: int, valid: torch.Tensor) -> torch.Tensor:
    """(N,H,W) class ids -> (N,C,H,W) float one-hot, all-zero at ignored pixels."""
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    onehot = F.one_hot(safe, num_classes).permute(0, 3, 1, 2).to(torch.float32)
    return onehot * valid.unsqueeze(1)


def masked_bce_with_logits(logits: torch.Tensor, target: float, valid: torch.Tensor) -> torch.Tensor:
    """Mean per-pixel BCE of D's (N,1,H,W) logits against a constant target, over valid pixels."""
    logits = logits.squeeze(1).float()
    per_pixel = F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target), reduction="none")
    weights = valid.to(per_pixel.dtype)
    # clamp instead of branching on the count: no host sync on the hot path.
    return (per_pixel * weights).sum() / weights.sum().clamp_min(1.0)


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean CE over the pixels that are not ``ignore_index``; 0 (not NaN) when every pixel is.

    For pseudo labels, where a batch with no confident pixel is normal: F.cross_entropy's mean
    would be 0/0, and branching on the count would cost a host sync.
    """
    per_pixel = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="none")
    count = (labels != ignore_index).sum()
    return per_pixel.sum() / count.clamp_min(1).to(per_pixel.dtype)


def pseudo_labels(
    logits: torch.Tensor, confidence: torch.Tensor, threshold: float | torch.Tensor, ignore_index: int
) -> torch.Tensor:
    """G's argmax as labels, ``ignore_index`` where D's confidence (N,H,W) is below ``threshold``."""
    labels = logits.detach().argmax(dim=1)
    return torch.where(confidence < threshold, torch.full_like(labels, ignore_index), labels)
