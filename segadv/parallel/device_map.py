"""The device map: which device(s) each network lives on, e.g. ``g:1,d:0`` or ``g:1+2,d:0``.

Grammar: comma-separated ``ROLE:DEVICES`` entries. ROLE is a role's short or full name
(segadv/config/roles.py): ``g``/``generator``, ``d``/``discriminator``, ``d_aux``/``discriminator_aux``
(the auxiliary output's D of multi-level domain adaptation). DEVICES is one device (``cpu``, ``cuda``, ``cuda:N`` or a bare
CUDA index ``N``) or a DataParallel replica set of CUDA devices joined by ``+`` (``1+2`` =
``cuda:1+cuda:2``): the network is replicated on each and its outputs are gathered on the first.
Of g and d, one left out shares the other's devices; another role left out shares the devices of
the role it falls back to (d_aux: d's); a bare DEVICES
(``cpu``, ``cuda:1``) puts every network there.
An empty map means every network on ``cuda:0`` when CUDA is available, else ``cpu``.

Under a multi-process launch (torchrun) CUDA indices are relative to the process: local rank r
adds ``r * B`` to every index, where B = (highest index in the map) + 1. With ``g:0,d:1`` and two
processes per node, local rank 0 uses cuda:0/cuda:1 and local rank 1 cuda:2/cuda:3.

Indices are ASCII digits from 0 to ``MAX_CUDA_INDEX`` (127), after the local rank's shift too:
torch keeps a device index in 8 bits, and ``torch.device("cuda", 256)`` would silently be cuda:0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from segadv.config import roles
from segadv.errors import UserError

# torch's DeviceIndex is an int8: a larger index wraps (256 -> 0) or is refused as negative.
MAX_CUDA_INDEX = 127


@dataclass(frozen=True)
class DeviceMap:
    """Each role's devices by role name (segadv/config/roles.py), as the map names them."""

    named: Mapping[str, tuple[torch.device, ...]]  # the roles the map names, by role name
    # What a role takes that is not named and falls back to no other role (the first of g and d
    # named, or the bare device): G and D share it when one of them is left out.
    default: tuple[torch.device, ...]

    @property
    def generator(self) -> torch.device:
        """Where G's parameters live and its outputs are gathered."""
        return self.devices_of("generator")[0]

    def devices_of(self, role: str) -> tuple[torch.device, ...]:
        """``role``'s devices: as named, else those of the role it falls back to, else the default."""
        spec = roles.role(role)
        if spec.name in self.named:
            return self.named[spec.name]
        return self.devices_of(spec.falls_back_to) if spec.falls_back_to is not None else self.default

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """Every distinct device of the map, generator's first."""
        return tuple(dict.fromkeys([*self.devices_of("generator"), *self.default,
                                    *(d for devices in self.named.values() for d in devices)]))

    def with_devices(self, swap: Callable[[torch.device], torch.device]) -> DeviceMap:
        """The same map with every device replaced by ``swap(device)``."""
        return DeviceMap({role: tuple(map(swap, devices)) for role, devices in self.named.items()},
                         tuple(map(swap, self.default)))

    def __str__(self) -> str:
        def fmt(devices: tuple[torch.device, ...]) -> str:
            return "+".join(shown(d) for d in devices)

        return ",".join(f"{spec.short}:{fmt(self.devices_of(spec.name))}" for spec in roles.ROLES.values()
                        if spec.name in self.named or spec.falls_back_to is None)


def parse_device_map(
    spec: str | None, *, cuda_device_count: int | None = None, local_rank: int = 0
) -> DeviceMap:
    """Parse and validate a device map against the devices this process can see."""
    visible = torch.cuda.device_count() if cuda_device_count is None else cuda_device_count
    if spec is None or not spec.strip():
        device = torch.device("cuda", local_rank) if visible > 0 else torch.device("cpu")
        if device.type == "cuda" and local_rank >= visible:
            raise UserError(f"local rank {local_rank} needs cuda:{local_rank}, but only {visible} CUDA devices are visible")
        return DeviceMap({}, (device,))
    head = spec.split(",")[0].partition(":")[0].strip().lower()
    if "," not in spec and roles.find_role(head) is None:  # a bare device (set): every network there
        devices = _parse_devices(spec.strip(), "g and d", spec)
        return DeviceMap({}, _offset_and_check(spec, {"g and d": devices}, local_rank, visible)["g and d"])
    chosen: dict[str, tuple[torch.device, ...]] = {}
    for entry in spec.split(","):
        entry = entry.strip()
        role_name, sep, device_text = entry.partition(":")
        if not sep or not role_name or not device_text:
            raise UserError(f"device map {spec!r}: entry {entry!r} is not ROLE:DEVICE (e.g. g:1,d:0)")
        role = roles.find_role(role_name.strip().lower())
        if role is None:
            known = ", ".join(f"{r.short} ({r.name})" for r in roles.ROLES.values())
            raise UserError(f"device map {spec!r}: unknown role {role_name!r}; roles are {known}")
        if role.name in chosen:
            raise UserError(f"device map {spec!r}: role {role_name!r} is given twice")
        chosen[role.name] = _parse_devices(device_text.strip(), role_name, spec)
    placed = _offset_and_check(spec, chosen, local_rank, visible)
    # G and D, each the other's fallback: the first of them named is the default.
    default = next((placed[r.name] for r in roles.ROLES.values() if r.falls_back_to is None and r.name in placed), None)
    if default is None:
        raise UserError(f"device map {spec!r}: names only {', '.join(roles.role(r).short for r in placed)}; give g or "
                        "d as well (e.g. g:0,d:1,d_aux:1)")
    return DeviceMap(placed, default)


def _parse_devices(text: str, role: str, spec: str) -> tuple[torch.device, ...]:
    parts = [p.strip() for p in text.split("+")]
    devices = tuple(_parse_device(p, role, spec) for p in parts)
    if len(devices) > 1:
        if any(d.type != "cuda" for d in devices):
            raise UserError(f"device map {spec!r}: a replica set ({text}) must list CUDA devices only")
        if len(set(devices)) != len(devices):
            raise UserError(f"device map {spec!r}: replica set {text!r} names a device twice")
    return devices


def _parse_device(text: str, role: str, spec: str) -> torch.device:
    lowered = text.lower()
    if lowered == "cpu":
        return torch.device("cpu")
    if lowered == "cuda":
        index_text = "0"
    elif lowered.startswith("cuda:"):
        index_text = lowered[len("cuda:"):]
    else:
        index_text = lowered
    if not (index_text.isascii() and index_text.isdigit()):
        raise UserError(f"device map {spec!r}: unknown device {text!r} for {role}; use cpu, cuda:N, N or N+M")
    index = int(index_text)
    if index > MAX_CUDA_INDEX:
        raise UserError(f"device map {spec!r}: CUDA index {index} for {role} is out of range (0 to {MAX_CUDA_INDEX})")
    return torch.device("cuda", index)


def _offset_and_check(
    spec: str, chosen: dict[str, tuple[torch.device, ...]], local_rank: int, visible: int
) -> dict[str, tuple[torch.device, ...]]:
    """``chosen``'s devices (by role name, or by what a bare device is for) shifted by the local
    rank, each checked against the visible devices."""
    cuda_indices = [d.index for devices in chosen.values() for d in devices if d.type == "cuda"]
    block = max(cuda_indices, default=-1) + 1
    placed = {}
    for role, devices in chosen.items():
        label = roles.role(role).short if role in roles.ROLES else role
        shifted = [d.index + local_rank * block for d in devices if d.type == "cuda"]
        if any(i > MAX_CUDA_INDEX for i in shifted):
            raise UserError(f"device map {spec!r}: local rank {local_rank} shifts {label} to CUDA index "
                            f"{max(shifted)}, beyond {MAX_CUDA_INDEX}")
        moved = tuple(
            torch.device("cuda", d.index + local_rank * block) if d.type == "cuda" else d for d in devices
        )
        for original, device in zip(devices, moved):
            if device.type == "cuda" and device.index >= visible:
                seen = f"only {visible} CUDA device{'s are' if visible != 1 else ' is'} visible" if visible else (
                    "no CUDA device is visible"
                )
                where = f" (cuda:{original.index} shifted by local rank {local_rank})" if local_rank else ""
                raise UserError(f"device map {spec!r}: {device} requested for {label}{where}, but {seen}")
        placed[role] = moved
    return placed


def shown(device: torch.device) -> str:
    """A device as the user names it: segadv-plan's stand-in for cuda:N (a PrivateUse1 device, or
    ``meta:N`` where torch has no Python backend) shows as cuda:N."""
    stand_in = device.type == "meta" or device.type == torch._C._get_privateuse1_backend_name()
    if stand_in and device.index is not None:
        return f"cuda:{device.index}"
    return str(device)
