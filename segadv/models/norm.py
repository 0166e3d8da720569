"""How G's BatchNorm trains (``model.generator.norm``).

- ``train``: BatchNorm as torch trains it: batch statistics in training mode, the running
  statistics updated, weight and bias learned.
- ``frozen_affine``: the adversarial references' DeepLab-v2: weight and bias fixed
  (``requires_grad`` False, so no optimizer holds them and no weight decay moves them), the
  statistics still those of each batch and the running ones updated.
- ``frozen``: weight, bias and statistics fixed: every BatchNorm normalises with its running
  statistics while G trains (mmsegmentation's ``norm_eval``), so nothing of a batch's statistics
  reaches G, and a batch of one trains.

``frozen`` swaps each BatchNorm's class for a subclass whose ``train`` keeps it in eval mode, so
it holds through every ``train()`` call, on G or on any module inside it (the methods call
``g.module.train()`` each step; evaluation calls ``eval()`` then ``train()``), under DataParallel
(replicas copy the module's class and flags) and DDP (its ``train`` reaches the module's), in an
activation checkpoint's recompute (it runs the modules in their own mode) and under
``torch.compile`` (the mode is a module attribute it guards on). The parameter names and the
state dict are unchanged.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

NORMS = ("train", "frozen_affine", "frozen")
_EVAL_MODE: dict[type, type] = {}


class EvalModeNorm:
    """Mixed in before a BatchNorm's own class: ``train(mode)`` always leaves it in eval mode."""

    def train(self, mode: bool = True):  # noqa: ARG002 - the mode asked for is overridden by design
        return super().train(False)  # type: ignore[misc]


def batch_norms(model: nn.Module) -> list[_BatchNorm]:
    return [m for m in model.modules() if isinstance(m, _BatchNorm)]


def in_eval_mode(norm: _BatchNorm) -> _BatchNorm:
    """``norm`` with its class swapped for one that stays in eval mode."""
    cls = type(norm)
    if not issubclass(cls, EvalModeNorm):
        if cls not in _EVAL_MODE:
            _EVAL_MODE[cls] = type(f"EvalMode{cls.__name__}", (EvalModeNorm, cls), {})
        norm.__class__ = _EVAL_MODE[cls]
    norm.eval()
    return norm


def apply_norm(model: nn.Module, norm: str) -> int:
    """Set every BatchNorm of ``model`` to ``norm`` (one of :data:`NORMS`), in place; returns how
    many there are."""
    if norm not in NORMS:
        raise KeyError(f"unknown norm setting {norm!r}; valid: {list(NORMS)}")
    norms = batch_norms(model)
    if norm == "train":
        return len(norms)
    for m in norms:
        for p in m.parameters(recurse=False):
            p.requires_grad_(False)
        if norm == "frozen":
            in_eval_mode(m)
    return len(norms)


def sync_batch_norms(module: nn.Module) -> nn.Module:
    """``module`` with its BatchNorm layers as ``SyncBatchNorm`` (``parallel.sync_bn``), except those
    held in eval mode (a frozen encoder's, ``model.generator.freeze_encoder``): their statistics are
    fixed, nothing to synchronise, and torch's conversion would hand them back in a class that
    trains. In place where ``module`` is not itself a BatchNorm; returns the module to use."""
    if isinstance(module, EvalModeNorm):
        return module
    if isinstance(module, _BatchNorm):
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for name, child in list(module.named_children()):
        converted = sync_batch_norms(child)
        if converted is not child:
            module.add_module(name, converted)
    return module

