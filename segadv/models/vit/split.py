"""A ViT + DPT generator's blocks split over devices (a pipeline of one micro-batch: each device
runs its blocks in turn, the memory of the encoder shared between them).

Stages in order: the embedding (patch embedding, class / register tokens, the position embedding
or the rotary embedding's periods: the encoder's own tensors and the submodules the model names in
``embedding_modules``) on the first device; the blocks in contiguous runs, run ``j`` on
``devices[j]``; the encoder's final norm and the DPT head on the last device. The model's forward
moves the tokens to each block's device with what the blocks take besides (DINOv3's rotary
embedding: each stage reads it on its own device) and the four intermediate features to the
head's (``Tensor.to``, which autograd carries back: each gradient returns to the device its
activation came from). Modules are moved, never
wrapped or renamed, so the state dict's keys are the unsplit model's and checkpoints stay strict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from segadv.errors import UserError
from segadv.models.stages import check_boundaries


@dataclass(frozen=True)
class Placement:
    """Where each stage of the model runs: the embedding, each block (by index), the head (with
    the final norm). Read by the forward; held as a plain attribute, never in the state dict."""

    embed: torch.device
    blocks: tuple[torch.device, ...]
    head: torch.device

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """The devices in pipeline order, each once."""
        return tuple(dict.fromkeys((self.embed, *self.blocks, self.head)))


def even_boundaries(num_blocks: int, num_devices: int) -> list[int]:
    """Where each device's run of blocks starts after the first's: ``num_blocks`` split into
    ``num_devices`` contiguous runs whose sizes differ by one at most, the larger runs first
    (the first device also holds the embedding and the last the head, which are light next to a
    block at a ViT's widths)."""
    base, extra = divmod(num_blocks, num_devices)
    starts, start = [], 0
    for j in range(num_devices - 1):
        start += base + (1 if j < extra else 0)
        starts.append(start)
    return starts


def split_blocks(model: nn.Module, devices: Sequence[torch.device | str],
                 boundaries: Sequence[int] | None = None) -> Placement:
    """Move ``model`` (a :class:`~segadv.models.vit.model.ViTDPT`) onto ``devices`` stage by stage
    and have its forward move the activations between them; returns the placement (also set as
    ``model.placement``). ``boundaries``: the index of the first block of each device after the
    first (evenly split when None). One device is the model on that device. Call it before the
    optimizer is built, as ``Module.to``: parameters keep their identity, their data moves."""
    devices = [torch.device(d) for d in devices]
    if not devices:
        raise UserError("split_blocks: no devices given")
    vit = model.encoder
    blocks = vit.blocks
    n = len(blocks)
    if len(devices) > n:
        raise UserError(f"{len(devices)} devices for an encoder of {n} blocks: each device needs a block at least")
    bounds = even_boundaries(n, len(devices)) if boundaries is None else list(check_boundaries(boundaries, n, len(devices)))
    # Each part straight to its own device (a part is never moved twice: segadv-plan's stand-in
    # tensors are placed once, from meta): the embedding to the first, the blocks below, the rest
    # of the encoder (its final norm) and the head to the last.
    embedding = model.embedding_modules
    move_embedding(vit, embedding, devices[0])
    for name, child in vit.named_children():
        if name != "blocks" and name not in embedding:
            child.to(devices[-1])
    for name, child in model.named_children():
        if child is not vit:
            child.to(devices[-1])
    edges = [0, *bounds, n]
    block_devices: list[torch.device] = []
    for device, start, end in zip(devices, edges, edges[1:]):
        for block in blocks[start:end]:
            block.to(device)
        block_devices += [device] * (end - start)
    placement = Placement(embed=devices[0], blocks=tuple(block_devices), head=devices[-1])
    model.placement = placement
    return placement


def move_embedding(vit: nn.Module, embedding: Sequence[str], device: torch.device) -> None:
    """The embedding stage onto ``device``: the encoder's own tensors (class, register and mask
    tokens, a position embedding), moved as ``Module.to`` moves a module's, and its submodules
    named in ``embedding``."""
    vit._apply(lambda t: t.to(device), recurse=False)
    for name in embedding:
        module = getattr(vit, name, None)
        if module is not None:
            module.to(device)
