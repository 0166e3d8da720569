"""The placement report: where each network, its parameters, optimizer state and scaler live."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from segadv.parallel.fsdp import is_sharded, local_bytes
from segadv.parallel.pipeline import is_split, stage_devices
from segadv.parallel.placement import unwrap

MiB = 1024**2
# Optimizer state per parameter element, in parameter-sized tensors (estimate before step 1).
STATE_FACTOR = {torch.optim.SGD: 1, torch.optim.Adam: 2, torch.optim.AdamW: 2}


def network_row(rank: int, role: str, wrapped: nn.Module, devices, opt) -> dict[str, object]:
    bare = unwrap(wrapped)
    params = list(bare.parameters())
    numel = sum(p.numel() for p in params)
    # This rank's bytes: under FSDP its shards of the parameters, gradients and optimizer state
    # (the params column still counts the whole network).
    param_bytes = sum(local_bytes(p) for p in params)
    buffer_bytes = sum(b.numel() * b.element_size() for b in bare.buffers())
    state_tensors = [t for s in opt.optimizer.state.values() for t in s.values() if torch.is_tensor(t)] if opt else []
    if opt is None:  # not trained (the teacher): no gradients, no optimizer state, no scaler
        state_bytes, state_devices = 0, ["-"]
    elif state_tensors:
        state_bytes = sum(local_bytes(t) for t in state_tensors)
        state_devices = sorted({str(t.device) for t in state_tensors if t.dim() > 0})
    else:
        state_bytes = param_bytes * STATE_FACTOR.get(type(opt.optimizer), 2)
        state_devices = sorted({str(p.device) for p in params})  # created beside the parameters
    wrapper = type(wrapped).__name__ if wrapped is not bare else ("FSDP" if is_sharded(bare) else "none")
    return {
        "rank": rank,
        "network": role,
        "wrapper": wrapper,
        "devices": "/".join(map(str, stage_devices(bare))) if is_split(bare) else "+".join(str(d) for d in devices),
        "params": f"{numel:,}",
        "weights MiB": f"{(param_bytes + buffer_bytes) / MiB:.1f}",
        "grads MiB": f"{param_bytes / MiB if opt is not None else 0:.1f}",
        "optimizer MiB": f"{state_bytes / MiB:.1f} on {','.join(state_devices)}",
        "scaler": f"{'on' if opt.scales_loss else 'off'} ({opt.device.type})" if opt is not None else "none",
    }


def placement_table(rows: list[dict[str, object]]) -> str:
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    line = "  ".join(c.ljust(widths[c]) for c in columns)
    body = ["  ".join(str(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join([line, "  ".join("-" * widths[c] for c in columns), *body])


def gather_rows(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Every rank's rows, on every rank (one small all_gather_object at start-up)."""
    if not (dist.is_available() and dist.is_initialized()):
        return rows
    gathered: list[list[dict[str, object]]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, rows)
    return [row for rank_rows in gathered for row in rank_rows]
