"""The device map: which device each network lives on, e.g. ``g:1,d:0``.

Grammar: comma-separated ``ROLE:DEVICE`` entries. ROLE is ``g``/``generator`` or
``d``/``discriminator``; DEVICE is ``cpu``, ``cuda``, ``cuda:N`` or a bare CUDA index ``N``.
A role left out shares the other role's device. An empty map means both on ``cuda:0`` when CUDA
is available, else ``cpu``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from segadv.errors import UserError

ROLES = {"g": "generator", "generator": "generator", "d": "discriminator", "discriminator": "discriminator"}


@dataclass(frozen=True)
class DeviceMap:
    generator: torch.device
    discriminator: torch.device

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """The distinct devices named, generator's first."""
        return tuple(dict.fromkeys([self.generator, self.discriminator]))

    def __str__(self) -> str:
        return f"g:{self.generator},d:{self.discriminator}"


def default_device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def parse_device_map(spec: str | None, *, cuda_device_count: int | None = None) -> DeviceMap:
    """Parse and validate a device map against the devices this process can see."""
    visible = torch.cuda.device_count() if cuda_device_count is None else cuda_device_count
    if spec is None or not spec.strip():
        device = torch.device("cuda", 0) if visible > 0 else torch.device("cpu")
        return DeviceMap(device, device)
    chosen: dict[str, torch.device] = {}
    for entry in spec.split(","):
        entry = entry.strip()
        role_name, sep, device_text = entry.partition(":")
        if not sep or not role_name or not device_text:
            raise UserError(f"device map {spec!r}: entry {entry!r} is not ROLE:DEVICE (e.g. g:1,d:0)")
        role = ROLES.get(role_name.strip().lower())
        if role is None:
            raise UserError(
                f"device map {spec!r}: unknown role {role_name!r}; roles are g (generator) and d (discriminator)"
            )
        if role in chosen:
            raise UserError(f"device map {spec!r}: role {role_name!r} is given twice")
        chosen[role] = _parse_device(device_text.strip(), role_name, spec, visible)
    generator = chosen.get("generator", chosen.get("discriminator"))
    discriminator = chosen.get("discriminator", generator)
    return DeviceMap(generator, discriminator)


def _parse_device(text: str, role: str, spec: str, visible: int) -> torch.device:
    lowered = text.lower()
    if lowered == "cpu":
        return torch.device("cpu")
    if lowered == "cuda":
        index_text = "0"
    elif lowered.startswith("cuda:"):
        index_text = lowered[len("cuda:"):]
    else:
        index_text = lowered
    if not index_text.isdigit():
        raise UserError(f"device map {spec!r}: unknown device {text!r} for {role}; use cpu, cuda:N or N")
    index = int(index_text)
    if index >= visible:
        seen = f"only {visible} CUDA device{'s are' if visible != 1 else ' is'} visible" if visible else (
            "no CUDA device is visible"
        )
        raise UserError(f"device map {spec!r}: cuda:{index} requested for {role}, but {seen}")
    return torch.device("cuda", index)
