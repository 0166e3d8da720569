"""``F.scaled_dot_product_attention`` on a stand-in, planned as the CUDA kernel a GPU would run.

On CUDA, SDPA dispatches to the flash or the memory-efficient kernel, which never store the
(B, heads, N, N) attention matrix: they keep the output (B, heads, N, d) and the row-wise
logsumexp (B, heads, N, fp32) for the backward. On the stand-in (a PrivateUse1 backend under fake
tensors) torch has no fused kernel to choose and decomposes SDPA into the math path,
softmax(QK^T)V, whose attention matrix (and its softmax output saved for the backward) the plan
would count: a DINOv2-B mean teacher at 518 px planned 59% above its measured peak on an H200.

``CudaAttention`` routes each SDPA call on a stand-in to the ATen op CUDA would run
(``aten._scaled_dot_product_flash_attention`` / ``_efficient_attention``), whose fake kernels
make the same outputs and whose autograd formulas save the same tensors as on the GPU; what CUDA
would run as math (a head size or dtype no fused kernel takes, or the fused kernels switched off
with ``torch.nn.attention.sdpa_kernel``) stays the math path. A network that spells attention out
(``model.generator.attention: math``) never calls SDPA and is planned as it runs.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import Counter, defaultdict
from typing import Any, Iterable, Iterator

import torch
import torch.nn.functional as F

KERNELS = ("flash", "efficient", "math")
_SIGNATURE = inspect.signature(lambda query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                               enable_gqa=False: None)
HALF = (torch.float16, torch.bfloat16)


def cuda_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
                enable_gqa: bool) -> str:
    """The SDPA kernel CUDA picks on an Ampere-or-newer GPU (sdp_utils.cpp's order: flash, then
    memory-efficient, then math), for the checks that decide it in a plan: flash takes fp16/bf16,
    no mask, a head size that is a multiple of 8 up to 256; memory-efficient takes fp32 too, a mask,
    a head size aligned to 16 bytes; the switches of ``torch.nn.attention.sdpa_kernel`` are
    honoured. (cuDNN's kernel, where a torch prefers it, keeps the same output and statistics as
    flash: the same bytes.)"""
    backends = torch.backends.cuda
    head, dtype = query.shape[-1], query.dtype
    same = key.dtype == dtype and value.dtype == dtype and value.shape[-1] == head
    plain = same and query.dim() == 4 and not enable_gqa and not query.is_nested
    if plain and backends.flash_sdp_enabled() and dtype in HALF and attn_mask is None and head % 8 == 0 and head <= 256:
        return "flash"
    alignment = 16 // query.element_size()
    if plain and backends.mem_efficient_sdp_enabled() and dtype in (torch.float32, *HALF) and head % alignment == 0:
        return "efficient"
    return "math"


class CudaAttention:
    """SDPA on ``device_type`` (the stand-in) run as the kernel CUDA picks (``cuda_kernel``), the
    inputs cast first as CUDA's autocast casts SDPA (lower precision). Counts the kernels per
    network (``network``, which the plan's forward hooks set) for the plan's note.

    Entered, it replaces ``torch.nn.functional.scaled_dot_product_attention`` for the process (the
    networks look it up at each call), not a thread's function mode: activation checkpointing
    recomputes a block inside the backward, on autograd's thread, and must run the same kernel as
    the forward did (a recompute that saved other tensors aborts the backward)."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.kernels: dict[str, Counter[str]] = defaultdict(Counter)
        self._networks: list[str] = []
        self._original: Any = None

    def __enter__(self) -> CudaAttention:
        self._original = F.scaled_dot_product_attention
        original = self._original

        def routed(*args: Any, **kwargs: Any) -> Any:
            return self.__torch_function__(original, (), args, kwargs)

        F.scaled_dot_product_attention = routed
        return self

    def __exit__(self, *exc: Any) -> None:
        F.scaled_dot_product_attention = self._original

    @contextlib.contextmanager
    def watching(self, modules: Iterable[tuple[str, torch.nn.Module]]) -> Iterator[None]:
        """Attribute each SDPA call to the named module whose forward is running."""
        def enter(name: str) -> Any:
            def hook(*_: Any) -> None:
                self._networks.append(name)
            return hook

        def leave(*_: Any) -> None:  # a hook's return value would replace the output: None
            self._networks.pop()

        handles = []
        for name, module in modules:
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave, always_call=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        call = _SIGNATURE.bind(*args, **kwargs)
        call.apply_defaults()
        a = call.arguments
        query, key, value = a["query"], a["key"], a["value"]
        if query.device.type != self.device_type:
            return func(*args, **kwargs)
        if torch.is_autocast_enabled(self.device_type) and query.is_floating_point():
            dtype = torch.get_autocast_dtype(self.device_type)
            query, key, value = (t.to(dtype) for t in (query, key, value))
        kernel = cuda_kernel(query, key, value, a["attn_mask"], a["enable_gqa"])
        if self._networks:  # a network's forward (a checkpoint's recompute in the backward is not counted)
            self.kernels[self._networks[-1]][kernel] += 1
        if kernel == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, a["dropout_p"], a["is_causal"], False, scale=a["scale"])[0]
        if kernel == "efficient":
            # CUDA keeps the logsumexp only where a backward will need it (sdp::should_compute_logsumexp)
            needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, a["attn_mask"], needs_grad, a["dropout_p"], a["is_causal"], scale=a["scale"])[0]
        return func(*args, **kwargs)

    def note(self) -> str | None:
        """One line: the kernel assumed for each network's attention, or None where none ran SDPA."""
        if not self.kernels:
            return None
        parts = []
        for network, counts in self.kernels.items():
            kinds = " and ".join(f"{k} ({'the N x N matrix stored' if k == 'math' else 'no N x N matrix'})"
                                 for k in KERNELS if counts[k])
            parts.append(f"{network}: {kinds}")
        return ("attention (scaled_dot_product_attention) planned as CUDA's kernel on an Ampere-or-newer GPU: "
                + "; ".join(parts))
