"""Placement: the one place where networks meet devices.

Models stay pure ``nn.Module``s; this module moves them to the devices of the map and makes the
generator's device the current CUDA device so nothing is created on an implicit ``cuda:0``.
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple, Sequence

import torch
from torch import nn

from segadv.config import roles
from segadv.parallel.device_map import DeviceMap, format_stages, shown
from segadv.parallel.pipeline import split_network, stage_devices

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


class Placing(NamedTuple):
    """One network to place: its role, the network, its device where the map does not split it,
    and (for messages) the config key that chose its class, e.g. ``model.generator.arch=deeplabv3plus``."""

    role: str
    network: nn.Module
    device: torch.device
    chosen_by: str = ""


class Misplaced(RuntimeError):
    """A network that placed a parameter or buffer on a device the map does not give its role: a
    bug in the network's ``split`` (segadv-plan reports it as a placement finding)."""


def place_networks(
    networks: Sequence[tuple], device_map: DeviceMap, channels_last: bool = False,
) -> None:
    """Each network (a :class:`Placing` or its ``(role, network, device)``) onto its device, or
    over its role's pipeline stages by its own ``split`` where the map gives it several (``g:0/1``);
    the map's first accelerator made current. Afterwards every parameter and buffer must be on a
    device of its role's stages (:class:`Misplaced` otherwise). ``channels_last``: 4-D weights in
    NHWC order, so convolutions take and give NHWC activations (faster convolutions on recent GPUs
    and oneDNN CPUs; inputs convert on the way in)."""
    activate(device_map)
    memory_format = torch.channels_last if channels_last else torch.preserve_format
    placing = [Placing(*entry) for entry in networks]
    for role, network, device, chosen_by in placing:
        stages = device_map.stages_of(role)
        if len(stages) > 1:
            short = roles.role(role).short
            network.to(memory_format=memory_format)  # where it is built; the split's moves keep the format
            split_network(network, stages, f"device map {device_map}: {short}:{format_stages(stages)} splits the {role}",
                          chosen_by)
        else:
            network.to(device, memory_format=memory_format)
        check_placed(role, network, stages)
    log.info("placement: %s", ", ".join(placed_line(role, network, device) for role, network, device, _ in placing))


def placed_line(role: str, network: nn.Module, device: torch.device) -> str:
    """``generator on cuda:1 (1,234 params)``; a split network's stages each with its device's
    parameters: ``generator on cuda:0/cuda:1 (cuda:0 1,000 params, cuda:1 234 params)`` (stages
    sharing a device are counted together)."""
    stages = stage_devices(network)
    if len(stages) < 2:
        return f"{role} on {shown(device)} ({count_parameters(network):,} params)"
    per_device: dict[torch.device, int] = {}
    for p in network.parameters():
        per_device[p.device] = per_device.get(p.device, 0) + p.numel()
    counts = ", ".join(f"{shown(d)} {per_device.get(d, 0):,} params" for d in dict.fromkeys(stages))
    return f"{role} on {'/'.join(shown(d) for d in stages)} ({counts})"


def check_placed(role: str, network: nn.Module, stages: Sequence[Sequence[torch.device]]) -> None:
    """Every parameter and buffer of ``network`` on a device of its role's ``stages``."""
    allowed = {d for stage in stages for d in stage}
    for name, tensor in [*network.named_parameters(), *network.named_buffers()]:
        if tensor.device not in allowed:
            raise Misplaced(f"the {role}'s {name} is on {shown(tensor.device)}, which the device map does not give "
                            f"it ({', '.join(shown(d) for d in allowed)})")


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
