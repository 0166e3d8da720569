"""CUDA's autocast policy, registered for another autocast dispatch key (the stand-in device's).

Without it, autocast on a Python backend has no kernels. The op lists are the installed torch's
own (``include/ATen/autocast_mode.h``: lower precision, fp32, fp32 with ``dtype=float32`` set,
promote), read at registration, so the stand-in casts exactly as CUDA does in this torch. Not
reproduced: the cast cache for weights (the copies are saved for backward anyway) and the ops
whose redispatch signature differs (``norm``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves, tree_map


LISTS = {
    "lower_precision_fp": "AT_FORALL_LOWER_PRECISION_FP",
    "fp32": "AT_FORALL_FP32",
    "fp32_set_opt_dtype": "AT_FORALL_FP32_SET_OPT_DTYPE",
    "promote": "AT_FORALL_PROMOTE",
}
_ENTRY = re.compile(r"_\(\s*(\w+)\s*(?:,\s*(\w+)\s*)?\)")

_registered: dict[str, tuple[torch.library.Library, torch.library.Library]] = {}


def read_policy(header: Path) -> dict[str, list[tuple[str, str]]]:
    """``{policy: [(op, overload), ...]}`` from the header (the installed torch's is
    ``torch_surfaces.autocast_header()``; overload ``""``: the default one)."""
    text = header.read_text()
    policy = {}
    for name, macro in LISTS.items():
        match = re.search(rf"#define {macro}\(_\)(.*?)(?:\n\s*\n|\n#)", text, re.S)
        if match is None:
            raise RuntimeError(f"{header}: no {macro} list")
        policy[name] = [(op, overload or "") for op, overload in _ENTRY.findall(match.group(1))]
    return policy


def _eligible(x: Any, device_type: str) -> bool:
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == device_type
            and x.dtype != torch.float64)


def _kernel(op: torch._ops.OpOverload, policy: str, key: torch._C.DispatchKey) -> Callable[..., Any]:
    """CUDA's ``WrapFunction`` for ``policy`` (aten/src/ATen/autocast_mode.h)."""
    excluded = torch._C.DispatchKeySet(key)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        device_type = torch._C._get_privateuse1_backend_name()
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            if policy == "fp32_set_opt_dtype":
                first = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if first is not None and _eligible(first, device_type) and kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
            else:
                if policy == "lower_precision_fp":
                    target = torch.get_autocast_dtype(device_type)
                elif policy == "fp32":
                    target = torch.float32
                else:  # promote: the widest floating type among the eligible arguments
                    target = _widest([a.dtype for a in tree_leaves((args, kwargs)) if _eligible(a, device_type)])
                if target is not None:
                    def cast(a: Any) -> Any:
                        return a.to(target) if _eligible(a, device_type) and a.dtype != target else a

                    args, kwargs = tree_map(cast, args), tree_map(cast, kwargs)
            return op(*args, **kwargs)

    return kernel


def _widest(dtypes: list[torch.dtype]) -> torch.dtype | None:
    if not dtypes:
        return None
    widest = dtypes[0]
    for dtype in dtypes[1:]:
        widest = torch.promote_types(widest, dtype)
    return widest


def register_cuda_policy(dispatch_key: str, header: Path) -> None:
    """Register CUDA's policy, as ``header`` (torch's ATen/autocast_mode.h) lists it, for
    ``dispatch_key`` (e.g. ``AutocastPrivateUse1``), once."""
    if dispatch_key in _registered:
        return
    key = getattr(torch._C.DispatchKey, dispatch_key)
    # Every other op passes through the key, as for the built-in autocast keys.
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, dispatch_key)
    lib = torch.library.Library("aten", "IMPL")
    for policy, ops in read_policy(header).items():
        for name, overload in ops:
            packet = getattr(torch.ops.aten, name, None)
            op = None if packet is None else getattr(packet, overload or "default", None)
            if op is None:  # listed for an op this build lacks
                continue
            lib.impl(op, _kernel(op, policy, key), dispatch_key)
    _registered[dispatch_key] = (fallthrough, lib)
