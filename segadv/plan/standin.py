"""The stand-in device: a Python-registered PrivateUse1 backend that takes a CUDA device's place.

Under ``FakeTensorMode`` no kernel runs and no memory is allocated, but the autograd engine and
autocast still treat the tensors as living on an accelerator: ``standin:1`` walks the branches
``cuda:1`` walks, on any CPU machine. ``torch.utils.backend_registration``'s Python backend is
private and experimental (torch 2.10 on): it is reached through segadv/plan/torch_surfaces.py,
whose probe refuses a torch that lacks or changed it before anything is registered.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from segadv.parallel.device_map import MAX_CUDA_INDEX
from segadv.plan import torch_surfaces

NAME = "standin"
# Every index a device map can name (0 to MAX_CUDA_INDEX) is a stand-in device.
DEVICE_COUNT = MAX_CUDA_INDEX + 1


class StandInEvent:
    """A CUDA event's stand-in: records nothing, has taken no time."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: object = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "StandInEvent") -> float:
        return 0.0


class CudaFacade:
    """``torch.standin``: what torch asks of a backend module (autocast, the autograd engine), and
    the part of ``torch.cuda`` segadv's own CUDA paths call, so they run in the dry run: the
    current device (``activate()`` sets it; a bare ``Tensor.cuda`` call resolves to it), streams and
    events (PhaseTimer), the generators' states (the checkpoint's RNG capture). Nothing is
    computed: events take no time, a generator's state is a placeholder, no values are drawn."""

    def __init__(self) -> None:
        self.current = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return DEVICE_COUNT

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    def set_device(self, device: torch.device | int) -> None:
        self.current = device if isinstance(device, int) else torch.device(device).index or 0

    def current_device(self) -> int:
        return self.current

    def synchronize(self, device: object = None) -> None:
        pass

    def current_stream(self, device: object = None) -> object:
        return None

    Event = StandInEvent

    def get_rng_state(self, device: object = None) -> torch.Tensor:
        return torch.zeros(16, dtype=torch.uint8)

    def set_rng_state(self, state: torch.Tensor, device: object = None) -> None:
        pass


FACADE = CudaFacade()


def available() -> bool:
    """Whether this torch can register the stand-in (and cast under autocast as CUDA does)."""
    try:
        torch_surfaces.require(*torch_surfaces.PLAN)
    except torch_surfaces.UnsupportedTorch:
        return False
    return True


def register() -> str:
    """Register the stand-in backend (once per process) and CUDA's autocast policy for it; returns
    the device type the plan uses. Refuses (``UnsupportedTorch``, exit 2) a torch without them."""
    torch_surfaces.require(*torch_surfaces.PLAN)
    return _register()


@functools.cache
def _register() -> str:
    from segadv.plan.autocast_policy import register_cuda_policy

    torch_surfaces.setup_python_backend(NAME, FACADE)
    register_cuda_policy("AutocastPrivateUse1", torch_surfaces.autocast_header())
    return NAME


def standin_for(device: torch.device, device_type: str) -> torch.device:
    """``cuda:N`` -> ``<device_type>:N``; any other device stays itself."""
    if device.type != "cuda":
        return device
    return torch.device(device_type, 0 if device.index is None else device.index)


class CudaAsStandIn(TorchFunctionMode):
    """CUDA devices named in the code resolve as real CUDA resolves them, onto their stand-ins:
    ``Tensor.cuda``, ``to("cuda")`` and a ``device`` of "cuda" onto the current device (the map's first
    CUDA device, which ``activate()`` makes current: G's when G is on one), ``cuda:N`` onto
    ``<device_type>:N``. Without this such a call would reach the CUDA runtime and crash the plan
    ("CUDA driver version is insufficient"); with it the tensor lands where a GPU would put it,
    and the placement check judges that."""

    def __init__(self, device_type: str, current: int) -> None:
        """``current``: the current device where ``device_type`` has no facade; on the stand-in it
        is the facade's, which ``activate()`` set."""
        super().__init__()
        self.device_type = device_type
        self.fallback = current

    @property
    def current(self) -> int:
        return FACADE.current_device() if self.device_type == NAME else self.fallback

    def _swap(self, value: Any) -> Any:
        if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
            value = torch.device(value)
        if isinstance(value, torch.device) and value.type == "cuda":
            return torch.device(self.device_type, self.current if value.index is None else value.index)
        return value

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            tensor, *rest = args
            device = rest[0] if rest else kwargs.get("device")
            index = self.current if device is None else torch.device("cuda", device).index \
                if isinstance(device, int) else torch.device(device).index
            return tensor.to(torch.device(self.device_type, self.current if index is None else index),
                             non_blocking=kwargs.get("non_blocking", False))
        args, kwargs = tree_map(self._swap, (args, kwargs))
        return func(*args, **kwargs)
