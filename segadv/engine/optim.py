"""Optimizers and poly learning-rate schedules built from config."""

from __future__ import annotations

import torch
from torch import nn

from segadv.config.schema import OptimizerConfig


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    betas = (cfg.betas[0], cfg.betas[1])
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)
    raise KeyError(f"unknown optimizer {cfg.name!r}; valid: ['adam', 'adamw', 'sgd']")


def build_poly_scheduler(
    optimizer: torch.optim.Optimizer, max_steps: int, power: float
) -> torch.optim.lr_scheduler.LRScheduler:
    """lr = base_lr * (1 - step / max_steps) ** power, stepped once per training step."""
    return torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=max_steps, power=power)
