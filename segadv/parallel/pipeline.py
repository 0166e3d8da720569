"""Pipeline stages: one network's blocks over several devices, as the device map's ``/`` asks
(``g:0/1``: G's first blocks on cuda:0, the rest on cuda:1).

A network that can be split says so by having the two members of :class:`Splittable`
(segadv/models/base.py); placement
(segadv/parallel/placement.py) calls ``split`` instead of ``.to(device)`` for a role the map
splits, and refuses a split of a network without them. Nothing here knows an architecture.

The protocol, exactly:

``split(stage_devices: Sequence[torch.device], boundaries: Sequence[int] | None = None) -> None``
    Place the network's own parameters and buffers over ``stage_devices`` (two or more, in the
    order the input flows through them; the same device may repeat, as ``g:cpu/cpu`` does in
    tests): what runs before its first block (a stem, a patch embedding) on the first stage, what
    runs after its last (a norm, a decoder, a head, an aux head) on the last, its blocks in order
    between them. ``boundaries``: the index of the first block of each stage after the first
    (``len(stage_devices) - 1`` increasing indices, each stage at least one block; check them
    with :func:`check_boundaries`); None lets the network choose (:func:`balanced_boundaries`
    splits by parameter count). Called once, on the freshly built network, before any wrapper,
    optimizer or checkpoint load. It moves modules, never renames or rewraps them: the
    ``state_dict`` keys stay those of the unsplit network, so checkpoints stay strict and load
    either way. ``memory_format`` and dtype are as ``Module.to(device)`` leaves them
    (placement converts channels_last afterwards, in place).

``pipeline_devices -> tuple[torch.device, ...]``
    Each stage's device, in order, after ``split``; ``()`` before (the network is then on one
    device as ``Module.to`` put it). ``pipeline_devices[0]`` is where the input enters,
    ``pipeline_devices[-1]`` where the output comes out.

And its forward:

- takes its input on any device and moves it to the first stage (the loop's inputs come to the
  role's output device, where its labels and losses live: one device-to-device copy of the
  images, small beside the activations), hands the activation to each next stage with
  :func:`hand_over` (``Tensor.to``: autograd carries the gradient back), and returns every
  output (the aux head's too) on the last stage;
- never creates a tensor on a device of its own choosing: only the stages' devices;
- keeps its keyword arguments (``return_aux``) and its output's shape and type unchanged.

The stages run one after another (no micro-batch interleaving): the split buys memory, not
speed. Under DDP each process holds its own split network (DDP with ``device_ids=None``), under
DataParallel it is refused (segadv/parallel/wrap.py).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from segadv.errors import UserError
from segadv.models.base import Splittable
from segadv.models.stages import balanced_boundaries, check_boundaries

__all__ = ["Splittable", "balanced_boundaries", "can_split", "check_boundaries", "hand_over", "is_split",
           "split_network", "stage_devices"]


def can_split(module: nn.Module) -> bool:
    return isinstance(module, Splittable)


def stage_devices(module: nn.Module) -> tuple[torch.device, ...]:
    """The devices of a split network's stages, in order; ``()`` for a network not split."""
    return tuple(module.pipeline_devices) if can_split(module) else ()


def is_split(module: nn.Module) -> bool:
    return len(stage_devices(module)) > 1


def hand_over(activation: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An activation onto the next stage's device, inside the forward; autograd brings its
    gradient back. Non-blocking between accelerators (the copy is ordered on the target's
    stream before the next stage's kernels), blocking to the host."""
    if activation.device == device:
        return activation
    return activation.to(device, non_blocking=device.type != "cpu")


def split_network(network: nn.Module, stages: Sequence[Sequence[torch.device]], where: str, chosen_by: str = "") -> None:
    """Place ``network`` over ``stages`` (the device map's, one device each) by its own ``split``;
    a network without one is a user error: ``where`` names the map and the role's entry (``device
    map g:0/1,d:1: g:0/1 splits the generator``), ``chosen_by`` the config key that chose the
    network (``model.generator.arch=deeplabv3plus``)."""
    if not can_split(network):
        key = f" ({chosen_by})" if chosen_by else ""
        raise UserError(f"{where} into {len(stages)} stages, but its network {type(network).__name__}{key} cannot be "
                        "split (it has no split(stage_devices, boundaries)); give it one device")
    network.split([stage[0] for stage in stages])
