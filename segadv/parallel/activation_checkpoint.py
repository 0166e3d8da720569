"""Activation checkpointing of G (``model.generator.activation_checkpointing``): its arch's blocks
(a DeepLab's encoder stages and decoder, a ViT's blocks and head: the network names them,
segadv/models/base.py ``checkpoint_units``) keep only
their inputs for the backward and run their forward again there (``torch.utils.checkpoint``,
non-reentrant).

Applied to the built G in place, without changing its parameter names: each checkpointed module's
class becomes a subclass whose forward runs under the checkpoint, so state dicts, optimizers,
the strict loader, DataParallel's replicas and DDP see the same module tree.

The trap: the recomputed forward runs in training mode, where BatchNorm would update its running
statistics (and ``num_batches_tracked``) a second time. During the recompute every BatchNorm of
the module normalises with the batch's statistics, as the first forward did, and updates copies
of its running statistics that are thrown away after. Dropout draws the
same masks again (the RNG state is preserved, torch's default). Under ``compile.generator`` the
checkpoint is traced into the graph and the recompute is the partitioner's, which recomputes the
region's outputs and never its buffer updates.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from segadv.models.base import Generator

_CHECKPOINTED: dict[type, type] = {}


STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


@contextmanager
def running_statistics_untouched(module: nn.Module) -> Iterator[None]:
    """The recompute's BatchNorm updates copies of its running statistics, thrown away after:
    the same ops on the same tensors' values as the first forward (the checkpoint checks that
    the recompute saves what the forward saved), with the module's own statistics left as the
    first forward left them."""
    kept = [(m, {name: getattr(m, name) for name in STATISTICS if getattr(m, name, None) is not None})
            for m in module.modules() if isinstance(m, _BatchNorm)]
    for m, buffers in kept:
        for name, buffer in buffers.items():
            setattr(m, name, buffer.clone())
    try:
        yield
    finally:
        for m, buffers in kept:
            for name, buffer in buffers.items():
                setattr(m, name, buffer)


class CheckpointedForward:
    """Mixed in before a module's own class: its forward under a non-reentrant checkpoint whenever
    gradients are recorded (evaluation, under no_grad, runs it plainly)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        forward = super().forward  # type: ignore[misc]
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if torch.compiler.is_compiling():
            # Traced by torch.compile (compile.generator): the region becomes a graph whose backward
            # recomputes the region's outputs alone; the running statistics' updates are the
            # forward's mutations and are never recomputed, so no context is needed (nor allowed:
            # dynamo traces no context_fn but selective checkpointing's).
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False,
                          context_fn=lambda: (nullcontext(), running_statistics_untouched(self)), **kwargs)


def checkpointed(module: nn.Module) -> nn.Module:
    """``module`` with its forward under a checkpoint (its class swapped, nothing else changed)."""
    cls = type(module)
    if issubclass(cls, CheckpointedForward):
        return module
    if cls not in _CHECKPOINTED:
        _CHECKPOINTED[cls] = type(f"Checkpointed{cls.__name__}", (CheckpointedForward, cls), {})
    module.__class__ = _CHECKPOINTED[cls]
    return module


def apply_activation_checkpointing(generator: Generator) -> list[str]:
    """Checkpoint G's blocks (its ``checkpoint_units()``) in place; returns their names."""
    units = generator.checkpoint_units()
    for name in units:
        checkpointed(generator.get_submodule(name))
    return units
