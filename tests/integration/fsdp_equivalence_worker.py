"""FSDP steps for tests/integration/test_equivalence.py, under torchrun (not collected by pytest).

    torchrun --standalone --nproc-per-node N tests/integration/fsdp_equivalence_worker.py CASE_DIR [CASE_DIR ...]

One launch runs several cases (starting N processes costs more than a case's step): each
CASE_DIR holds ``input.pt`` (the reference's initial weights and batch) and ``overrides.txt``
(the case's config overrides, one a line). For each, every rank builds the run with G and D
sharded (``parallel.*=fsdp``), loads the initial weights through segadv's strict loader (a full
state laid out as this rank's shards), takes one AdvSemiSeg step on its 1/N of the batch and saves
the networks' full states (gathered, as a checkpoint holds them), the adversarial gradient G's
update sent into D's input, whether any of G's or D's shards held a gradient after each
micro-batch but the last (FSDP's reduce-scatter writes them; none may run before the last),
the size of a checkpoint of the networks as the run dir's room check reads it off the shards, and
the dtypes of each network's weights as its modules' forwards see them (FSDP's gather dtype), of
its sharded parameters after the step and of its optimizer's state.
"""

import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # its folder and tests/ (conftest, helpers)
from helpers import FixedStream  # noqa: E402
from test_equivalence import (  # noqa: E402
    batch_statistics_frozen, capture_adversarial_gradient, freeze_batch_statistics, harness_config, no_dropout,
)

from segadv.checkpoint import NetworkWeights, load_weights  # noqa: E402
from segadv.checkpoint.state import expected_bytes  # noqa: E402
from segadv.parallel import distributed, parse_device_map  # noqa: E402
from segadv.parallel.fsdp import is_sharded  # noqa: E402
from segadv.training.build import build_training  # noqa: E402


def run_case(out: Path, env: distributed.DistEnv, device_map) -> None:
    overrides = (out / "overrides.txt").read_text().split()
    cfg = harness_config("parallel.generator=fsdp", "parallel.discriminator=fsdp", *overrides)
    data = torch.load(out / "input.pt", weights_only=True)
    with batch_statistics_frozen():  # G's BatchNorm frozen below: micro-batches of one sample train
        parts = build_training(cfg, device_map, env)
    assert is_sharded(parts.g.bare) and is_sharded(parts.d.bare), "parallel.*=fsdp did not shard the networks"
    load_weights(data["g"], parts.g.module, role="generator", name="the reference's G")
    load_weights(data["d"], parts.d.module, role="discriminator", name="the reference's D")
    no_dropout(parts.g.bare)
    freeze_batch_statistics(parts.g.bare)
    grads: list[torch.Tensor] = []
    capture_adversarial_gradient(parts.d.module, grads)
    scale = parts.g.opt.loss_scale()
    share = data["images"].shape[0] // env.world_size
    rows = slice(env.rank * share, (env.rank + 1) * share)

    gathered: dict[str, set[str]] = {"g": set(), "d": set()}  # the weights' dtype each forward sees

    def seen(net: str):
        def hook(module, args):
            gathered[net].add(str(module.weight.dtype).removeprefix("torch."))
        return hook

    for net, network in (("g", parts.g), ("d", parts.d)):
        for module in network.bare.modules():
            if isinstance(module._parameters.get("weight"), torch.Tensor):
                module.register_forward_pre_hook(seen(net))
    method, held = parts.step.method, []

    def watched(streams, step):  # after each micro-batch: does any shard hold a (reduced) gradient yet?
        losses = method(streams, step)
        held.append(any(p.grad is not None for net in (parts.g, parts.d) for p in net.bare.parameters()))
        return losses

    parts.step.method = watched
    parts.step({"labeled": FixedStream((data["images"][rows], data["labels"][rows]))}, step=0)
    weights = {"g": NetworkWeights("generator", parts.g.module), "d": NetworkWeights("discriminator", parts.d.module)}
    result = {**{key: state.state_dict() for key, state in weights.items()},
              "adv_grad": torch.cat(grads) / scale, "held": held[:-1],
              "expected_bytes": expected_bytes(weights),  # read off the shards, without a gather
              # the weights' dtypes in the forwards, the shards' after the step, the optimizers' state's
              "dtypes": {net: {"gathered": sorted(gathered[net]),
                               "sharded": sorted({f"{type(p).__name__}:{str(p.dtype).removeprefix('torch.')}"
                                                  for p in network.bare.parameters()}),
                               "optimizer": sorted({str(t.dtype).removeprefix("torch.")
                                                    for state in network.opt.optimizer.state.values()
                                                    for t in state.values()
                                                    if isinstance(t, torch.Tensor) and t.dim() > 0})}
                         for net, network in (("g", parts.g), ("d", parts.d))}}
    torch.save(result, out / f"rank{env.rank}.pt")


def main(cases: list[Path]) -> None:
    env = distributed.env_from()
    device_map = parse_device_map("cpu", local_rank=env.local_rank)
    distributed.init_process_group(env, device_map)
    for out in cases:
        run_case(out, env, device_map)
    distributed.destroy_process_group(barrier_first=True)


if __name__ == "__main__":
    main([Path(arg) for arg in sys.argv[1:]])
