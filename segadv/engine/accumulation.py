"""Gradient accumulation (``train.accumulation_steps``): one optimizer step per network over K
micro-batches.

Each stream's batch is drawn whole, once per optimizer step, and cut into K equal micro-batches
on the host: the samples, their order and their augmentation are exactly those of the one batch,
so the streams' positions (and resume) count batches as without accumulation. The method runs
once per micro-batch, unchanged: each network's ``AmpOptimizer`` divides every loss by K and
steps (unscale, inf check, step, scale update, LR schedule) on the K-th ``step()`` call only
(segadv/engine/amp_optimizer.py). Every micro-batch but the last runs under each DDP wrapper's
``no_sync`` (an FSDP network's ``set_requires_gradient_sync(False)``): the gradients are all-reduced
(reduce-scattered) once, in the last micro-batch's backward.

G's update and D's commute over the micro-batches: neither network steps before the K-th, so D's
frozen view in G's loss and D's own update see the same parameters in every micro-batch, as in
the one-batch step (where D's update reads G's maps from before G's step).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Callable, Mapping, Sequence

import torch
from torch.nn.parallel import DistributedDataParallel

from segadv.engine.network import Network
from segadv.parallel.fsdp import no_gradient_sync


def split_batch(batch: Any, parts: int) -> list[Any]:
    """A loader's batch (a tensor, or a tuple / list of tensors with the batch first) cut into
    ``parts`` equal consecutive micro-batches (views: nothing is copied)."""
    if isinstance(batch, torch.Tensor):
        return list(batch.split(len(batch) // parts))
    return [type(batch)(items) for items in zip(*(split_batch(item, parts) for item in batch))]


class MicroBatchStream:
    """One stream as a micro-batch sees it: the stream's next batch, drawn at the first ``next()``
    of the optimizer step, handed out one K-th at a time."""

    def __init__(self, stream: Any, parts: int) -> None:
        self.stream = stream
        self.parts = parts
        self.pending: list[Any] = []
        self.drawn = False

    def next(self) -> Any:
        if not self.pending:
            if self.drawn:
                raise RuntimeError(f"stream {getattr(self.stream, 'name', '?')}: drawn more than once per micro-batch")
            self.pending = split_batch(self.stream.next(), self.parts)
            self.drawn = True
        return self.pending.pop(0)


class Accumulation:
    """The method over ``steps`` micro-batches per optimizer step; returns the losses averaged
    over the micro-batches (on their devices)."""

    def __init__(self, method: Callable[[Mapping[str, Any], int], dict[str, torch.Tensor]],
                 networks: Sequence[Network], steps: int) -> None:
        self.method = method
        self.networks = list(networks)
        self.steps = steps

    def __call__(self, streams: Mapping[str, Any], step: int) -> dict[str, torch.Tensor]:
        if self.steps == 1:
            return self.method(streams, step)
        views = {name: MicroBatchStream(stream, self.steps) for name, stream in streams.items()}
        totals: dict[str, torch.Tensor] = {}
        for index in range(self.steps):
            with ExitStack() as stack:
                if index < self.steps - 1:  # the gradients are all-reduced in the last one's backward
                    for net in self.networks:
                        if isinstance(net.module, DistributedDataParallel):
                            stack.enter_context(net.module.no_sync())
                    stack.enter_context(no_gradient_sync([net.module for net in self.networks if net.trained]))
                losses = self.method(views, step)
            for name, value in losses.items():
                totals[name] = value if name not in totals else totals[name] + value
        unfinished = [name for name, view in views.items() if view.pending]
        if unfinished:
            raise RuntimeError(f"streams {unfinished} were drawn on only some of the {self.steps} micro-batches")
        return {name: total / self.steps for name, total in totals.items()}
