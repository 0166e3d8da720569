"""Placement: the one place where networks meet devices.

Models stay pure ``nn.Module``s; this module moves them to the devices of the map and makes the
generator's device the current CUDA device so nothing is created on an implicit ``cuda:0``.
"""

from __future__ import annotations

import functools
import logging
from typing import Sequence

import torch
from torch import nn

from segadv.parallel.device_map import DeviceMap, shown

log = logging.getLogger(__name__)


def is_accelerator(device: torch.device) -> bool:
    """CUDA, or segadv-plan's stand-in for it: a device with a current index, streams, events and
    an RNG of its own, reached through its device module (``torch.cuda``, the stand-in's facade)."""
    return device.type not in ("cpu", "meta")


def device_module(device: torch.device):
    """``torch.cuda`` for a CUDA device; the stand-in's facade for segadv-plan's stand-in (looked
    up once per device type: PhaseTimer asks for it in every phase of the step)."""
    return _device_module(device.type)


@functools.cache
def _device_module(device_type: str):
    return torch.get_device_module(device_type)


def activate(device_map: DeviceMap) -> None:
    """Make the map's first CUDA device current (G's when G is on one), so CUDA work without an
    explicit device stays mapped."""
    accelerators = [d for d in device_map.devices if is_accelerator(d)]
    if accelerators:
        device_module(accelerators[0]).set_device(accelerators[0])


def place_networks(
    networks: Sequence[tuple[str, nn.Module, torch.device]], device_map: DeviceMap, channels_last: bool = False,
) -> None:
    """Each ``(role, network, device)`` onto its device, the map's first accelerator made current.
    ``channels_last``: 4-D weights in NHWC order, so convolutions take and give NHWC activations
    (faster convolutions on recent GPUs and oneDNN CPUs; inputs convert on the way in)."""
    activate(device_map)
    memory_format = torch.channels_last if channels_last else torch.preserve_format
    for _, network, device in networks:
        network.to(device, memory_format=memory_format)
    log.info("placement: %s", ", ".join(f"{role} on {shown(device)} ({count_parameters(network):,} params)"
                                        for role, network, device in networks))


def unwrap(module: nn.Module) -> nn.Module:
    """The bare network behind DataParallel / DistributedDataParallel / torch.compile wrappers
    (and segadv's own AutocastForward)."""
    from segadv.parallel.wrap import AutocastForward

    while True:
        if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel, AutocastForward)):
            module = module.module
        elif hasattr(module, "_orig_mod"):
            module = module._orig_mod
        else:
            return module


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move ``tensor`` to ``device``, asynchronously only where the consumer is ordered after the copy.

    A copy *to* an accelerator (CUDA, or segadv-plan's stand-in for one) is enqueued on that
    device's current stream, before any kernel that reads it, so it may return early. A copy to the CPU is read by the host at once: a
    non-blocking CUDA->CPU copy returns before the data has arrived, and the reader would see a
    half-copied tensor. So it blocks.
    """
    return tensor.to(device, non_blocking=device.type != "cpu")


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def devices_of(module: nn.Module) -> set[torch.device]:
    return {t.device for t in [*module.parameters(), *module.buffers()]}


def for_inference(module: nn.Module) -> nn.Module:
    """The module to evaluate: DDP's forward is a collective (buffer broadcast), so ranks with
    uneven val shards would hang in it; evaluate its bare module. DataParallel stays (no
    collectives, and it still spreads the batch)."""
    if isinstance(module, nn.parallel.DistributedDataParallel):
        return unwrap(module)
    return module
