"""One DDP step for tests/integration/test_equivalence.py, under torchrun (not collected by pytest).

    torchrun --standalone --nproc-per-node 2 tests/integration/equivalence_worker.py OUT_DIR DEVICE_MAP [key=value ...]

Each rank loads the reference's initial weights and takes its half of the batch; it saves its
networks and the adversarial gradient G's update sent into D's input. An input with target images
runs the domain-adaptation method instead (and saves D_aux and its gradient too); one with
unlabeled images the mean teacher, MT_STEPS iterations (and saves the teacher; D only where the
config builds one); one with a second unlabeled batch UniMatch, STEPS iterations (and saves its
views' draws and pseudo labels, V2's teacher).
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # its folder and tests/ (conftest, helpers)
from helpers import FixedStream  # noqa: E402
from test_equivalence import (  # noqa: E402
    MT_STEPS, batch_statistics_frozen, capture_adversarial_gradient, freeze_batch_statistics, harness_config,
    no_dropout, record_pseudo_labels,
)

from segadv.training.build import build_training, start_copies  # noqa: E402
from segadv.parallel import distributed, parse_device_map, unwrap  # noqa: E402


def join(device_map_spec: str, env: distributed.DistEnv):
    """segadv's own launch path; with fewer GPUs than ranks, both ranks share cuda:0 over gloo
    (nccl refuses two ranks on one GPU)."""
    if device_map_spec != "cpu" and torch.cuda.device_count() < env.world_size:
        device_map = parse_device_map("g:cuda:0,d:cuda:0")
        dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
        return device_map
    device_map = parse_device_map(device_map_spec, local_rank=env.local_rank)
    distributed.init_process_group(env, device_map)
    return device_map


def main(out: Path, device_map_spec: str, overrides: list[str]) -> None:
    # float32 on CUDA compared as float32, as the parent's no_tf32 fixture does (it does not reach this process).
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    env = distributed.env_from()
    device_map = join(device_map_spec, env)
    cfg = harness_config(*overrides)
    data = torch.load(out / "input.pt", weights_only=True)
    with batch_statistics_frozen():  # G's BatchNorm frozen below: micro-batches of one sample train
        parts = build_training(cfg, device_map, env)
    unwrap(parts.g.module).load_state_dict(data["g"])
    if "d" in data:  # the mean teacher builds no D with loss.lambda_adv 0
        unwrap(parts.d.module).load_state_dict(data["d"])
    teacher = parts.network("teacher")
    if teacher is not None:
        start_copies(parts)  # the teacher starts as G, after G's initial weights (as the loop)
        no_dropout(teacher.bare)
    no_dropout(parts.g.module)
    freeze_batch_statistics(unwrap(parts.g.module))
    grads: list[torch.Tensor] = []
    if parts.d is not None:
        capture_adversarial_gradient(parts.d.module, grads)
    grads_aux: list[torch.Tensor] = []
    if "d_aux" in data:
        unwrap(parts.d_aux.module).load_state_dict(data["d_aux"])
        capture_adversarial_gradient(parts.d_aux.module, grads_aux)
    scale = parts.g.opt.loss_scale()
    half = data["images"].shape[0] // env.world_size
    rows = slice(env.rank * half, (env.rank + 1) * half)
    if "images_mix" in data:  # UniMatch (test_equivalence_unimatch.py): its streams, each rank's half
        import pytest
        from test_equivalence_unimatch import STEPS, STRONG_VIEWS, record_pseudo_labels as unimatch_labels
        from unimatch_reference import Draws

        streams = {"labeled": FixedStream((data["images"][rows], data["labels"][rows])),
                   "unlabeled": FixedStream(data["images_u"][rows]),
                   "unlabeled_mix": FixedStream(data["images_mix"][rows]),
                   "gt": FixedStream((data["images"][rows], data["labels_gt"][rows]))}
        streams = {spec.name: streams[spec.name] for spec in type(parts.method).data_streams(cfg)}
        with pytest.MonkeyPatch.context() as patch:
            draws, pseudo_labels = Draws(patch), unimatch_labels(patch)
            for step in range(STEPS):
                parts.step(streams, step=step)
        variant = cfg.method.unimatch.variant
        draws = [vars(d) for d in draws.iterations(STRONG_VIEWS[variant])]
    elif "images_u" in data:  # the mean teacher: its streams, each rank's half of every batch
        labeled, unlabeled = ("source", "target") if cfg.target_data is not None else ("labeled", "unlabeled")
        streams = {labeled: FixedStream((data["images"][rows], data["labels"][rows])),
                   unlabeled: FixedStream(data["images_u"][rows]),
                   "gt": FixedStream((data["images"][rows], data["labels_gt"][rows]))}
        pseudo_labels = record_pseudo_labels(parts.method)
        for step in range(MT_STEPS):
            parts.step(streams, step=step)
    elif "target" in data:
        parts.step({"source": FixedStream((data["images"][rows], data["labels"][rows])),
                      "target": FixedStream(data["target"][rows])}, step=0)
    else:
        parts.step({"labeled": FixedStream((data["images"][rows], data["labels"][rows]))}, step=0)
    saved = {"g": unwrap(parts.g.module)}
    if parts.d is not None:
        saved["d"] = unwrap(parts.d.module)
    if "d_aux" in data:
        saved["d_aux"] = unwrap(parts.d_aux.module)
    if teacher is not None:
        saved["teacher"] = teacher.bare
    result = {name: {k: v.cpu() for k, v in net.state_dict().items()} for name, net in saved.items()}
    if "images_mix" in data:
        result["pseudo_labels"], result["draws"] = pseudo_labels, draws
    elif teacher is not None:
        result["pseudo_labels"] = pseudo_labels  # one per step
    if grads:  # one per micro-batch (train.accumulation_steps), one per step for the mean teacher
        result["adv_grad"] = torch.cat(grads) / scale
    if grads_aux:
        result["adv_grad_aux"] = torch.cat(grads_aux) / scale
    torch.save(result, out / f"rank{env.rank}.pt")
    distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
