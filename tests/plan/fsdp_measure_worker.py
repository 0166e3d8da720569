"""Run under torchrun by tests/plan/test_plan_fsdp_measured.py (not collected by pytest): one real
training step of G sharded by FSDP2 on gloo CPU ranks, and each rank's bytes of G's parameters,
gradients and optimizer state as its own tensors hold them.

    torchrun --standalone --nproc-per-node 2 tests/plan/fsdp_measure_worker.py CONFIG OUT_DIR [key=value ...]

G is built as segadv-train builds it (``generator_model``), sharded by ``shard_network`` (what
``parallel.generator=fsdp`` trains with), and stepped by the config's optimizer
(``build_optimizer``: AdamW with UniMatch V2's head groups for dinov2_tiny).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from segadv.config import load_config
from segadv.engine.optim import build_optimizer
from segadv.parallel.fsdp import shard_network
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


def main(config: str, out: str, *overrides: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = load_config(config, list(overrides))
    torch.manual_seed(cfg.train.seed)
    model = generator_model(cfg.model.generator, cfg.data.num_classes)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    units = shard_network(model, mesh)
    optimizer = build_optimizer(model, cfg.optim.generator)  # after sharding: its groups hold the DTensors
    size = cfg.data.synthetic.image_size
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(cfg.data.batch_size, 3, size, size, generator=generator)
    labels = torch.randint(0, cfg.data.num_classes, (cfg.data.batch_size, size, size), generator=generator)
    output = model(images)
    logits = output[0] if isinstance(output, (tuple, list)) else output
    logits = F.interpolate(logits, size=(size, size), mode="bilinear", align_corners=False)
    F.cross_entropy(logits, labels).backward()
    optimizer.step()
    params = [p for p in model.parameters()]
    figures = {
        "params_bytes": storage_bytes(params),
        "grads_bytes": storage_bytes([p.grad for p in params if p.grad is not None]),
        "optimizer_bytes": storage_bytes([t for s in optimizer.state.values() for t in s.values()
                                          if isinstance(t, torch.Tensor)]),
        "units": len(units),
        "sharded": all(isinstance(p, DTensor) for p in params),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(figures))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
