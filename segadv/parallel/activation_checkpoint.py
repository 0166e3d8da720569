"""Activation checkpointing of G (``model.generator.activation_checkpointing``): the encoder's
stages and the decoder keep only their inputs for the backward and run their forward again there
(``torch.utils.checkpoint``, non-reentrant).

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

import re
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from segadv.errors import UserError

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


def checkpoint_units(generator: nn.Module) -> list[str]:
    """The names of G's modules to checkpoint: the encoder's stages that hold weights (a ResNet's
    ``layer1``-``layer4``; a MobileNet's or other ``features`` encoder's blocks) and the decoder
    where it has weights (DeepLab-v2's classifier, a few convolutions to the classes, keeps no
    more than its input)."""
    encoder = generator.encoder
    names = [name for name, _ in encoder.named_children() if re.fullmatch(r"layer\d", name)]
    if not names and isinstance(getattr(encoder, "features", None), nn.Sequential):
        names = [f"features.{name}" for name, _ in encoder.features.named_children()]
    if not names:
        raise UserError(f"model.generator.activation_checkpointing: segadv does not know the stages of the "
                        f"{type(encoder).__name__} encoder (it checkpoints ResNet layers and `features` blocks)")
    def has_weights(name: str) -> bool:  # not a dropped stage, nor DeepLab-v2's decoder (its last stage as it is)
        return any(True for _ in generator.get_submodule(name).parameters())

    return [name for name in [f"encoder.{name}" for name in names] + ["decoder"] if has_weights(name)]


def apply_activation_checkpointing(generator: nn.Module) -> list[str]:
    """Checkpoint G's encoder stages and decoder in place; returns their names."""
    units = checkpoint_units(generator)
    for name in units:
        checkpointed(generator.get_submodule(name))
    return units
