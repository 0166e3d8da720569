"""The device map: which device(s) each network lives on, e.g. ``g:1,d:0`` or ``g:1+2,d:0``.

Grammar: comma-separated ``ROLE:DEVICES`` entries. ROLE is a role's short or full name
(segadv/config/roles.py): ``g``/``generator``, ``d``/``discriminator``, ``d_aux``/``discriminator_aux``
(the auxiliary output's D of multi-level domain adaptation). DEVICES is one device (``cpu``, ``cuda``, ``cuda:N`` or a bare
CUDA index ``N``) or a DataParallel replica set of CUDA devices joined by ``+`` (``1+2`` =
``cuda:1+cuda:2``): the network is replicated on each and its outputs are gathered on the first.
``/`` splits a network into pipeline stages (``g:0/1``: G's first blocks on cuda:0, the rest on
cuda:1; ``g:cpu/cpu`` on the host), each stage one device, all of one type; the network must be
able to split itself (segadv/parallel/pipeline.py). A replica set inside a stage (``0+1/2+3``) is
refused. Its input enters on the first stage, its output comes out on the last:
``devices_of(role)`` is the last stage's, ``stages_of(role)`` all of them.
Of g and d, one left out shares the other's devices (the last stage of a split one); another role
left out shares the stages of the role it falls back to (d_aux: d's; the teacher is split as G
is); a bare DEVICES (``cpu``, ``cuda:1``) puts every network there.
An empty map means every network on ``cuda:0`` when CUDA is available, else ``cpu``.

Under a multi-process launch (torchrun) CUDA indices are relative to the process: local rank r
adds ``r * B`` to every index of every stage, where B = (highest index in the map) + 1. With ``g:0,d:1`` and two
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
# What a device's text starts with: ``cuda:1`` alone is a bare device, ``student:1`` a role's entry.
DEVICE_TYPES = ("cpu", "cuda")

Stage = tuple[torch.device, ...]  # one pipeline stage: a device, or a DataParallel replica set
Stages = tuple[Stage, ...]  # a role's stages, in the order its input flows through them


@dataclass(frozen=True)
class DeviceMap:
    """Each role's pipeline stages by role name (segadv/config/roles.py), as the map names them.
    A role that is not split has one stage."""

    named: Mapping[str, Stages]  # the roles the map names, by role name
    # What a role takes that is not named and falls back to no other role (the first of g and d
    # named, its last stage where it is split, or the bare device): G and D share it when one of
    # them is left out.
    default: Stages

    @property
    def generator(self) -> torch.device:
        """Where G's outputs come out (its last stage): its losses, labels and hand-over to D."""
        return self.devices_of("generator")[0]

    def stages_of(self, role: str) -> Stages:
        """``role``'s pipeline stages: as named, else those of the role it falls back to (the teacher
        is split as G is), else the default."""
        spec = roles.role(role)
        if spec.name in self.named:
            return self.named[spec.name]
        return self.stages_of(spec.falls_back_to) if spec.falls_back_to is not None else self.default

    def devices_of(self, role: str) -> Stage:
        """``role``'s output devices: its last stage's (its only one where it is not split), where its
        output is gathered and its losses and labels live; a replica set's first is the gathering one."""
        return self.stages_of(role)[-1]

    def input_device(self, role: str) -> torch.device:
        """Where ``role``'s input enters: its first stage's (first) device."""
        return self.stages_of(role)[0][0]

    def is_split(self, role: str) -> bool:
        return len(self.stages_of(role)) > 1

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """Every distinct device of the map, generator's first (its stages in order)."""
        every = [d for stages in (self.stages_of("generator"), self.default, *self.named.values())
                 for stage in stages for d in stage]
        return tuple(dict.fromkeys(every))

    def with_devices(self, swap: Callable[[torch.device], torch.device]) -> DeviceMap:
        """The same map with every device replaced by ``swap(device)``."""
        def each(stages: Stages) -> Stages:
            return tuple(tuple(map(swap, stage)) for stage in stages)

        return DeviceMap({role: each(stages) for role, stages in self.named.items()}, each(self.default))

    def __str__(self) -> str:
        return ",".join(f"{spec.short}:{format_stages(self.stages_of(spec.name))}" for spec in roles.ROLES.values()
                        if spec.name in self.named or spec.falls_back_to is None)


def format_stages(stages: Stages) -> str:
    """Stages as the map writes them: ``/`` between stages, ``+`` within a replica set."""
    return "/".join("+".join(shown(d) for d in stage) for stage in stages)


def parse_device_map(
    spec: str | None, *, cuda_device_count: int | None = None, local_rank: int = 0
) -> DeviceMap:
    """Parse and validate a device map against the devices this process can see."""
    visible = torch.cuda.device_count() if cuda_device_count is None else cuda_device_count
    if spec is None or not spec.strip():
        device = torch.device("cuda", local_rank) if visible > 0 else torch.device("cpu")
        if device.type == "cuda" and local_rank >= visible:
            raise UserError(f"local rank {local_rank} needs cuda:{local_rank}, but only {visible} CUDA devices are visible")
        return DeviceMap({}, ((device,),))
    if _is_bare(spec):  # a bare device (set): every network there
        if "/" in spec:
            raise UserError(f"device map {spec!r}: stages (/) split one network; name it (e.g. g:{spec.strip()},d:1)")
        devices = _parse_devices(spec.strip(), "g and d", spec)
        return DeviceMap({}, _offset_and_check(spec, {"g and d": (devices,)}, local_rank, visible)["g and d"])
    chosen: dict[str, Stages] = {}
    for entry in spec.split(","):
        entry = entry.strip()
        role_name, sep, device_text = entry.partition(":")
        if not sep or not role_name or not device_text:
            raise UserError(f"device map {spec!r}: entry {entry!r} is not ROLE:DEVICE (e.g. g:1,d:0)")
        role = roles.find_role(role_name.strip().lower())
        if role is None:
            known = ", ".join(f"{r.short} ({r.name})" for r in roles.ROLES.values())
            raise UserError(f"device map {spec!r}: unknown role {role_name.strip()!r}; roles are {known}")
        if role.name in chosen:
            raise UserError(f"device map {spec!r}: role {role_name!r} is given twice")
        chosen[role.name] = _parse_stages(device_text.strip(), role_name.strip(), spec)
    placed = _offset_and_check(spec, chosen, local_rank, visible)
    # G and D, each the other's fallback: the first of them named is the default; where it is
    # split, its last stage (the other reads or feeds its output there).
    default = next((placed[r.name][-1:] for r in roles.ROLES.values() if r.falls_back_to is None and r.name in placed),
                   None)
    if default is None:
        raise UserError(f"device map {spec!r}: names only {', '.join(roles.role(r).short for r in placed)}; give g or "
                        "d as well (e.g. g:0,d:1,d_aux:1)")
    return DeviceMap(placed, default)


def _is_bare(spec: str) -> bool:
    """A map of one entry that is devices, not ``ROLE:DEVICES``: ``cpu``, ``1``, ``cuda:1``, ``1+2``,
    and ``gpu`` (refused as an unknown device). An entry whose text before its first colon is not a
    device type names a role: ``student:cpu`` is an unknown role, not an unknown device."""
    if "," in spec:
        return False
    head, sep, _ = spec.partition(":")
    return not sep or head.strip().lower() in DEVICE_TYPES


def _parse_stages(text: str, role: str, spec: str) -> Stages:
    """``DEVICES[/DEVICES...]``: a role's pipeline stages, each one device (or, unsplit, a replica set)."""
    parts = [p.strip() for p in text.split("/")]
    if any(not p for p in parts):
        raise UserError(f"device map {spec!r}: {role}:{text} has an empty stage (write g:0/1)")
    stages = tuple(_parse_devices(p, role, spec) for p in parts)
    if len(stages) == 1:
        return stages
    if any(len(stage) > 1 for stage in stages):
        raise UserError(f"device map {spec!r}: {role}:{text} puts a DataParallel replica set inside a pipeline stage, "
                        "which segadv does not support: split a network over stages (g:0/1) or replicate it "
                        "(g:0+1), not both; for more throughput launch processes (torchrun) with a split each")
    types = sorted({stage[0].type for stage in stages})
    if len(types) > 1:
        raise UserError(f"device map {spec!r}: {role}:{text} mixes {' and '.join(types)} stages; a network runs one "
                        "device type (its autocast and GradScaler are per network): put every stage on CUDA, or "
                        "every stage on the CPU")
    return stages


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


def _offset_and_check(spec: str, chosen: dict[str, Stages], local_rank: int, visible: int) -> dict[str, Stages]:
    """``chosen``'s stages (by role name, or by what a bare device is for) shifted by the local
    rank, every stage's devices checked against the visible devices."""
    cuda_indices = [d.index for stages in chosen.values() for stage in stages for d in stage if d.type == "cuda"]
    block = max(cuda_indices, default=-1) + 1
    return {role: tuple(_offset_stage(spec, role, stage, local_rank, block, visible) for stage in stages)
            for role, stages in chosen.items()}


def _offset_stage(spec: str, role: str, devices: Stage, local_rank: int, block: int, visible: int) -> Stage:
    label = roles.role(role).short if role in roles.ROLES else role
    shifted = [d.index + local_rank * block for d in devices if d.type == "cuda"]
    if any(i > MAX_CUDA_INDEX for i in shifted):
        raise UserError(f"device map {spec!r}: local rank {local_rank} shifts {label} to CUDA index "
                        f"{max(shifted)}, beyond {MAX_CUDA_INDEX}")
    moved = tuple(torch.device("cuda", d.index + local_rank * block) if d.type == "cuda" else d for d in devices)
    for original, device in zip(devices, moved):
        if device.type == "cuda" and device.index >= visible:
            seen = f"only {visible} CUDA device{'s are' if visible != 1 else ' is'} visible" if visible else (
                "no CUDA device is visible"
            )
            where = f" (cuda:{original.index} shifted by local rank {local_rank})" if local_rank else ""
            raise UserError(f"device map {spec!r}: {device} requested for {label}{where}, but {seen}")
    return moved


def shown(device: torch.device) -> str:
    """A device as the user names it: segadv-plan's stand-in for cuda:N (a PrivateUse1 device, or
    ``meta:N`` where torch has no Python backend) shows as cuda:N."""
    stand_in = device.type == "meta" or device.type == torch._C._get_privateuse1_backend_name()
    if stand_in and device.index is not None:
        return f"cuda:{device.index}"
    return str(device)
