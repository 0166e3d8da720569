"""The planner's private torch surfaces, each behind one adapter with a probe.

segadv-plan needs four things that torch has no public API for (docs/planning.md "Torch's private
surfaces"): a device type registered from Python (the stand-in), the argument parsing of
``Tensor.to``, the profiler's raw memory events, and CUDA's autocast op lists. Each is reached here
and nowhere else, and each has a probe that runs it on the running torch. ``require`` runs the
probes a plan needs before anything is built: a torch release that changed one makes segadv-plan
exit 2 with "segadv-plan does not support torch X.Y: <surface> changed" instead of a traceback
halfway through a dry run. Training, evaluation and export use none of them.
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from segadv.errors import UserError
from segadv.versions import TORCH_NEEDED, require_torch, torch_version

# The first torch whose Python backend registration (the stand-in devices) exists.
PLANNER_TORCH = TORCH_NEEDED["segadv-plan"][0]


class UnsupportedTorch(UserError):
    """The running torch lacks, or has changed, a surface segadv-plan stands on."""


# --- the stand-in device: torch.utils.backend_registration's Python backend ---------------------

BACKEND = "torch.utils.backend_registration._setup_privateuseone_for_python_backend"


def setup_python_backend(name: str, backend_module: Any) -> None:
    """Register the PrivateUse1 dispatch key as a Python backend named ``name`` whose device module
    (``torch.<name>``) is ``backend_module``."""
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(rename=name, backend_module=backend_module)


def _probe_backend() -> None:
    from torch.utils import backend_registration

    params = inspect.signature(backend_registration._setup_privateuseone_for_python_backend).parameters
    missing = {"rename", "backend_module"} - set(params)
    if missing:
        raise TypeError(f"no parameter {', '.join(sorted(missing))}")


# --- Tensor.to's argument parsing --------------------------------------------------------------

PARSE_TO = "torch._C._nn._parse_to"


def parse_to(*args: Any, **kwargs: Any) -> tuple[torch.device | None, torch.dtype | None, torch.memory_format | None]:
    """What ``tensor.to(*args, **kwargs)`` asks for: (device, dtype, memory_format), each None where
    not given, parsed by torch's own parser (every overload of ``Tensor.to``)."""
    device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    return device, dtype, memory_format


def _probe_parse_to() -> None:
    got = parse_to("meta", torch.float16, memory_format=torch.channels_last)
    expected = (torch.device("meta"), torch.float16, torch.channels_last)
    if got != expected:
        raise ValueError(f"parsed {got}, expected {expected}")


# --- the profiler's memory events --------------------------------------------------------------

KINETO = "torch.profiler.profile().profiler.kineto_results"


def cpu_memory_events(prof: Any) -> Iterator[tuple[int, int]]:
    """(start in ns, bytes: + allocated, - freed) of each CPU allocator event a finished
    ``torch.profiler.profile(profile_memory=True)`` recorded. The public ``events()`` aggregates
    them per op and loses their order, which a peak needs."""
    for event in prof.profiler.kineto_results.events():
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU:
            yield event.start_ns(), event.nbytes()


def quiet_kineto() -> None:
    """kineto (the profiler's C++ side) logs to stderr on its own: "profiler_start" /
    "profiler_stop" lines, and on a machine without CUDA "ERROR ... gpuGetDeviceCount failed" from
    probing the GPUs it was not asked to trace. Only its memory events are read here, so its log
    is off unless the user set a level; it reads KINETO_LOG_LEVEL when a profiler first starts."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def _probe_kineto() -> None:
    quiet_kineto()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        block = torch.empty(1 << 16, dtype=torch.uint8)
        del block
    sizes = [nbytes for _, nbytes in cpu_memory_events(prof)]
    if 1 << 16 not in sizes or -(1 << 16) not in sizes:
        raise ValueError(f"a 64 KiB allocation and its free not among the events ({sizes[:8]})")


# --- CUDA's autocast op lists and autocast's dispatch keys --------------------------------------

AUTOCAST_HEADER = "include/ATen/autocast_mode.h"


def autocast_header() -> Path:
    """The installed torch's ATen/autocast_mode.h, whose macros list CUDA's autocast policy."""
    return Path(torch.__file__).parent / AUTOCAST_HEADER


def _probe_autocast() -> None:
    from segadv.plan.autocast_policy import read_policy

    policy = read_policy(autocast_header())
    if ("conv2d", "") not in policy["lower_precision_fp"] or not policy["fp32"]:
        raise ValueError("conv2d is not among the lower-precision ops, or no fp32 list")
    for name in ("_ExcludeDispatchKeyGuard", "DispatchKeySet", "_get_privateuse1_backend_name"):
        getattr(torch._C, name)
    torch._C.DispatchKey.AutocastPrivateUse1  # noqa: B018 - the stand-in's autocast key


@dataclass(frozen=True)
class Surface:
    """One private surface: what it is called (in the message), the probe that runs it."""

    name: str
    probe: Callable[[], None]


SURFACES = {
    "backend": Surface(BACKEND, _probe_backend),
    "parse_to": Surface(PARSE_TO, _probe_parse_to),
    "kineto": Surface(KINETO, _probe_kineto),
    "autocast": Surface(f"{AUTOCAST_HEADER} (CUDA's autocast lists) and autocast's dispatch keys", _probe_autocast),
}
# What a dry run needs; --measure also reads the profiler's events.
PLAN = ("backend", "parse_to", "autocast")
MEASURE = ("kineto",)


@functools.cache
def _works(key: str) -> Exception | None:
    try:
        SURFACES[key].probe()
    except Exception as err:  # any failure of a private surface is the same finding: it changed
        return err
    return None


def works(key: str) -> bool:
    """Whether the surface works on the running torch (probed once per process)."""
    return _works(key) is None


def require(*keys: str) -> None:
    """Refuse (exit 2) on a torch older than the planner needs, or one where a surface changed."""
    try:
        require_torch("segadv-plan", "training, evaluation and export run on this torch (docs/dependencies.md)")
    except UserError as err:
        raise UnsupportedTorch(str(err)) from None
    running = torch_version()
    for key in keys:
        err = _works(key)
        if err is not None:
            raise UnsupportedTorch(f"segadv-plan does not support torch {running[0]}.{running[1]}: "
                                   f"{SURFACES[key].name} changed ({type(err).__name__}: {err})")
