"""Run under torchrun by tests/plan/test_plan_world_size.py (not collected by pytest): two real
training steps of G on gloo CPU ranks, sharded by FSDP2 or wrapped in DDP, and each rank's bytes:
G's parameters, gradients and optimizer state as its own tensors hold them after the first step,
and the most live at once over the build, the wrapping and both steps (the CPU allocator's events,
torch.profiler).

    torchrun --standalone --nproc-per-node 2 tests/plan/fsdp_measure_worker.py fsdp|ddp CONFIG OUT_DIR [key=value ...]

G is built as segadv-train builds it (``generator_model``), sharded by ``shard_network`` (what
``parallel.generator=fsdp`` trains with) or wrapped in DDP as ``wrap_network`` wraps it (torch's
defaults), and stepped by the config's optimizer (``build_optimizer``: AdamW with UniMatch V2's
head groups for dinov2_tiny) on a cross-entropy loss, as the supervised method trains it.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, record_function

from segadv.config import load_config
from segadv.engine.optim import build_optimizer
from segadv.parallel.fsdp import shard_network
from segadv.plan import torch_surfaces
from segadv.training.role import generator_model


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor's local shard's): what the
    rank's allocator holds for them, padding included, views of one buffer counted once."""
    seen = {}
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


STEPS = "planned_iterations"


def peak_from(prof, marker: str) -> int:
    """The most live at once from ``marker``'s start on: the CPU allocator's events summed in order
    from the first (the build's included, so every free has its allocation), the maximum taken
    from the marker on. The build's own transients are not the iterations' (segadv-plan plans the
    build on ``meta``)."""
    start = min(e.start_ns() for e in prof.profiler.kineto_results.events() if e.name() == marker)
    live = peak = 0
    for at, nbytes in sorted(torch_surfaces.cpu_memory_events(prof)):
        live += nbytes
        if at >= start:
            peak = max(peak, live)
    return peak


def main(mode: str, config: str, out: str, *overrides: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = load_config(config, list(overrides))
    size = cfg.data.synthetic.image_size
    generator = torch.Generator().manual_seed(rank)
    units = []

    def step() -> None:
        images = torch.randn(cfg.data.batch_size, 3, size, size, generator=generator)
        labels = torch.randint(0, cfg.data.num_classes, (cfg.data.batch_size, size, size), generator=generator)
        output = trained(images)
        logits = output[0] if isinstance(output, (tuple, list)) else output
        logits = F.interpolate(logits, size=(size, size), mode="bilinear", align_corners=False)
        F.cross_entropy(logits, labels).backward()
        optimizer.step()

    torch_surfaces.quiet_kineto()
    # From before the build: the profiler reports a free only of what it saw allocated (FSDP frees
    # the unsharded parameters it replaces).
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.manual_seed(cfg.train.seed)
        model = generator_model(cfg.model.generator, cfg.data.num_classes)
        if mode == "fsdp":
            units = shard_network(model, init_device_mesh("cpu", (dist.get_world_size(),)))
            trained = model
        else:
            trained = DistributedDataParallel(model, find_unused_parameters=False)
        optimizer = build_optimizer(model, cfg.optim.generator)  # after sharding: its groups hold the DTensors
        with record_function(STEPS):  # the peak is taken from here on
            step()
        params = list(model.parameters())
        figures = {
            "params_bytes": storage_bytes(params),
            "grads_bytes": storage_bytes([p.grad for p in params if p.grad is not None]),
            "optimizer_bytes": storage_bytes([t for s in optimizer.state.values() for t in s.values()
                                              if isinstance(t, torch.Tensor)]),
            "units": len(units),
            "sharded": all(isinstance(p, DTensor) for p in params),
        }
        optimizer.zero_grad(set_to_none=True)
        step()  # the second: AdamW's state held, and DDP's buckets rebuilt in the gradients' order
    figures["peak_bytes"] = peak_from(prof, STEPS)
    Path(out, f"{mode}{rank}.json").write_text(json.dumps(figures))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
