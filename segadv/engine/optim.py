"""Optimizers and poly learning-rate schedules built from config."""

from __future__ import annotations

import logging

import torch
from torch import nn

from segadv.config.schema import OptimizerConfig
from segadv.errors import UserError
from segadv.models.base import Generator
from segadv.models.registry import GeneratorArch, generator_arch, resolve

log = logging.getLogger(__name__)


IMPLEMENTATIONS = {"auto": {}, "for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def parameter_groups(model: nn.Module, cfg: OptimizerConfig) -> list[dict]:
    """The trained parameters as the optimizer's groups. One group unless the head is set apart
    (``head_lr_mult``, ``head_weight_decay``): then ``backbone`` (the submodule G's arch row names,
    segadv/models/registry.py: a DeepLab's ``encoder``) at ``lr`` and ``weight_decay``, and ``head``
    (every other parameter: the classifier, a decoder, the aux head) at ``lr * head_lr_mult`` and
    ``head_weight_decay``, as the references' ``optim_parameters`` (the classifier at 10x, the same
    weight decay). One group otherwise, so the optimizer state of a run saved with one group still loads."""
    params = [p for p in model.parameters() if p.requires_grad]
    head_wd = cfg.weight_decay if cfg.head_weight_decay is None else cfg.head_weight_decay
    if cfg.head_lr_mult == 1.0 and head_wd == cfg.weight_decay and cfg.layer_decay == 1.0:
        return [{"params": params}]
    row = generator_arch(model.generator_arch) if isinstance(model, Generator) else None
    check_groups(cfg, row, type(model).__name__)
    backbone = model.get_submodule(row.backbone)
    in_backbone = {id(p) for p in backbone.parameters()}
    head = {"name": "head", "params": [p for p in params if id(p) not in in_backbone],
            "lr": cfg.lr * cfg.head_lr_mult, "weight_decay": head_wd}
    if cfg.layer_decay == 1.0:
        groups = [{"name": "backbone", "params": [p for p in params if id(p) in in_backbone]}, head]
    else:
        groups = [*layer_groups(model, backbone, row, cfg), head]
    return [group for group in groups if group["params"]]


def check_groups(cfg: OptimizerConfig, row: GeneratorArch | None, network: str = "G") -> None:
    """The groups ``cfg`` asks of G against its arch's row (None: a network built by no arch row,
    ``network`` its name): a head set apart needs the row's backbone, ``layer_decay`` its numbered
    encoder layers. Made at start (segadv/training/checks.py ``check_role``) and by
    :func:`parameter_groups`."""
    if cfg.head_lr_mult == 1.0 and cfg.head_weight_decay in (None, cfg.weight_decay) and cfg.layer_decay == 1.0:
        return
    if row is None or row.backbone is None:
        raise UserError(f"optim.*.head_lr_mult / head_weight_decay / layer_decay set a head apart from a backbone; "
                        f"{network} has none (arch {row.name if row is not None else None})")
    if cfg.layer_decay != 1.0 and row.encoder_layers is None:
        raise UserError(f"optim.generator.layer_decay={cfg.layer_decay}: arch {row.name} numbers no encoder layers; "
                        "leave it at 1.0")


def layer_groups(model: nn.Module, backbone: nn.Module, row, cfg: OptimizerConfig) -> list[dict]:
    """The backbone's trained parameters a group per layer its arch row numbers, layer k of L at
    ``lr * layer_decay ** (L - k)`` (BEiT's and DINOv2's fine-tuning rule)."""
    layer_of, last = resolve(row.encoder_layers)(model)
    by_layer: dict[int, list] = {}
    for name, p in backbone.named_parameters():
        if p.requires_grad:
            by_layer.setdefault(layer_of[name], []).append(p)
    return [{"name": f"backbone.layer{k}", "params": by_layer[k], "lr": cfg.lr * cfg.layer_decay ** (last - k)}
            for k in sorted(by_layer)]


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    params = parameter_groups(model, cfg)
    kernels = IMPLEMENTATIONS[cfg.implementation]
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **kernels)
    betas = (cfg.betas[0], cfg.betas[1])
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay, **kernels)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay, **kernels)
    raise KeyError(f"unknown optimizer {cfg.name!r}; valid: ['adam', 'adamw', 'sgd']")


class PolyLR(torch.optim.lr_scheduler.LRScheduler):
    """Iteration k (0-based, counting optimizer steps) trains at
    ``base_lr * (1 - max(k - lag, 0) / total_iters) ** power``, in closed form, per parameter group,
    times the warm-up's ramp ``min(1, (k + 1) / warmup)`` (the ramp counts k itself, unshifted).

    ``lag`` 0 is the lr set before each step from the iteration about to run (AdvSemiSeg,
    AdaptSegNet, ADVENT, s4GAN, mmseg's PolyLR); 1 is the lr set after each step from the iteration
    just run (UniMatch, UniMatch V2): iteration 0 at the base lr, iteration k at k - 1's value.

    The horizon, the base learning rates, the warm-up and the lag are the run's config, not its
    state: a run resumed with another ``train.max_steps`` / ``optim.*.poly_horizon`` or
    ``optim.*.lr`` (or ``train.lr_scaling``) follows them from the step it resumes at (torch's
    PolynomialLR would restore the old ones, and its chained form cannot change horizon midway), and
    says so in the log. A checkpoint written before the lag existed holds none: the config's holds.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, total_iters: int, power: float, warmup: int = 0,
                 lag: int = 0) -> None:
        self.total_iters = total_iters
        self.power = power
        self.warmup = warmup
        self.lag = lag
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        decayed = min(max(self.last_epoch - self.lag, 0), self.total_iters)
        progress = decayed / self.total_iters
        # Linear warm-up: step t < warmup at (t + 1) / warmup of the schedule's value.
        ramp = min(1.0, (self.last_epoch + 1) / self.warmup) if self.warmup else 1.0
        return [base_lr * (1.0 - progress) ** self.power * ramp for base_lr in self.base_lrs]

    def load_state_dict(self, state_dict: dict) -> None:
        saved_horizon = state_dict.get("total_iters", self.total_iters)
        horizon, base_lrs, warmup, lag = self.total_iters, list(self.base_lrs), self.warmup, self.lag
        super().load_state_dict(state_dict)
        saved_lrs = self.base_lrs
        self.total_iters, self.base_lrs, self.warmup, self.lag = horizon, base_lrs, warmup, lag
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr  # the optimizer's state brought the old horizon's value
        if saved_lrs != base_lrs:
            log.info("poly schedule: base lr %s in the checkpoint, %s now (optim.*.lr, train.lr_scaling); "
                     "lr at step %d: %.3g", _shown(saved_lrs), _shown(base_lrs), self.last_epoch, self._last_lr[0])
        if saved_horizon != horizon:
            log.info("poly schedule: horizon %d steps in the checkpoint, %d now (optim.*.poly_horizon or "
                     "train.max_steps); "
                     "lr at step %d: %.3g", saved_horizon, horizon, self.last_epoch, self._last_lr[0])


def _shown(lrs: list[float]) -> str:
    return ", ".join(f"{lr:.4g}" for lr in lrs)


def build_poly_scheduler(optimizer: torch.optim.Optimizer, max_steps: int, power: float, warmup: int = 0,
                         lag: int = 0) -> PolyLR:
    """lr = base_lr * (1 - max(step - lag, 0) / max_steps) ** power, ramped up over ``warmup`` linear
    steps, stepped once per training step (:class:`PolyLR`)."""
    return PolyLR(optimizer, total_iters=max_steps, power=power, warmup=warmup, lag=lag)


def poly_horizon(cfg: OptimizerConfig, max_steps: int, role: str) -> int:
    """The steps ``role``'s poly schedule decays over: ``optim.<role>.poly_horizon``, else
    ``train.max_steps``. A horizon short of max_steps would train its last steps at lr 0."""
    if cfg.poly_horizon is None:
        return max_steps
    if cfg.poly_horizon < max_steps:
        raise UserError(f"optim.{role}.poly_horizon: {cfg.poly_horizon} is short of train.max_steps {max_steps} "
                        "(the steps after it would train at lr 0); give at least max_steps, or null")
    return cfg.poly_horizon
