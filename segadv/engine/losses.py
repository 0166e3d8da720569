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
