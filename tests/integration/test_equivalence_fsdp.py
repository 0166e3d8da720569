"""FSDP (``parallel.*=fsdp``) on 2 and 4 gloo ranks takes the plain loop's step: the harness and
its tolerances are test_equivalence.py's (read its docstring); kept in a file of its own so the
test runner's workers share the work (a file runs in one worker).

FSDP's reduce-scatter sums the ranks' gradients in another order than the reference's one batch,
as DDP's all-reduce does: ``FP32_SUMMED_ELSEWHERE_RTOL`` (``split_batch``), and the AMP cosine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from segadv.parallel.fsdp import fsdp_available
from test_equivalence import (BATCH, CHECKPOINTING, DINOV2, Case, Moved, Outcome, amp, assert_equivalent,
                              harness_config, initial_networks, make_batch, params, references)  # noqa: F401

HERE = Path(__file__).parent

# Each case with G and D sharded (parallel.*=fsdp) over N gloo ranks, each rank with 1/N of the
# batch: FSDP's reduce-scatter sums the ranks' gradients in another order than the reference's one
# batch, as DDP's all-reduce does, so FP32_SUMMED_ELSEWHERE_RTOL (split_batch), and the AMP cosine.
FSDP_CASES = {
    "fsdp-cpu": (),
    # Two micro-batches a rank: the first accumulates unreduced, the one reduce-scatter is in the second.
    "fsdp-accumulation": ("train.accumulation_steps=2",),
    "fsdp-checkpointing": (CHECKPOINTING,),
    # bf16 autocast in G, and a float16 D with its GradScaler over DTensor gradients.
    "fsdp-g-bf16-d-fp16": (*amp("generator", "bfloat16"), *amp("discriminator", "float16")),
    # The ViT G sharded per block (its checkpoint units: the blocks, the head), then the root.
    "fsdp-dinov2": DINOV2,
    # The ViT G and D under bf16 autocast with FSDP gathering their parameters in bf16 and reducing
    # in float32 (amp.<role>.fsdp_param_dtype=amp): the ops autocast keeps in float32 (the ViT's
    # LayerNorms) see bf16-rounded weights. A ViT: a BatchNorm G is refused the bf16 gathers.
    "fsdp-dinov2-bf16-gathers": (*DINOV2, *amp("generator", "bfloat16"), "amp.generator.fsdp_param_dtype=amp",
                                 *amp("discriminator", "bfloat16"), "amp.discriminator.fsdp_param_dtype=amp"),
}
FSDP_RANKS = {2: BATCH, 4: 2 * BATCH}  # ranks: the batch (two samples a rank: two micro-batches of one)
needs_fsdp = pytest.mark.skipif(not fsdp_available(), reason=f"FSDP2 needs torch >= 2.6 (this is {torch.__version__})")


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """Every FSDP case on ``ranks`` gloo ranks, in one torchrun launch per rank count (a launch
    costs more than a case's step), run once for the module: ``{ranks: (seconds, {case: ranks' results})}``."""
    runs = {}

    def get(ranks: int):
        if ranks not in runs:
            root = tmp_path_factory.mktemp(f"fsdp{ranks}")
            dirs = []
            for name, overrides in FSDP_CASES.items():
                cfg = harness_config(*overrides)
                init_g, init_d = initial_networks(cfg)
                images, labels = make_batch(cfg, FSDP_RANKS[ranks])
                (out := root / name).mkdir()
                torch.save({"g": init_g.state_dict(), "d": init_d.state_dict(), "images": images, "labels": labels},
                           out / "input.pt")
                (out / "overrides.txt").write_text("\n".join(overrides))
                dirs.append(out)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                   str(HERE / "fsdp_equivalence_worker.py"), *map(str, dirs)]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            assert result.returncode == 0, result.stderr[-4000:]
            runs[ranks] = {d.name: [torch.load(d / f"rank{r}.pt", weights_only=True) for r in range(ranks)]
                           for d in dirs}
        return runs[ranks]

    return get


@needs_fsdp
@pytest.mark.parametrize("ranks", sorted(FSDP_RANKS))
@pytest.mark.parametrize("name", list(FSDP_CASES))
def test_fsdp_step_matches_the_plain_loop(fsdp_runs, references, ranks, name):
    """G and D sharded over ``ranks`` gloo processes, each with 1/ranks of the batch, take the
    reference's step: the gathered (checkpoint) state of every rank is the same, and the updates
    and the adversarial gradient are the plain loop's within the case's tolerance. With
    accumulation no shard holds a gradient before the last micro-batch (no reduce-scatter ran)."""
    overrides = FSDP_CASES[name]
    results = fsdp_runs(ranks)[name]
    for net in ("g", "d"):  # every rank gathers the same full state
        assert all(torch.equal(results[0][net][k], r[net][k]) for r in results[1:] for k in results[0][net]), net
    assert not any(held for r in results for held in r["held"]), "a shard held a gradient before the last micro-batch"
    if "train.accumulation_steps=2" in overrides:
        assert all(len(r["held"]) == 1 for r in results)
    roles = {"g": "generator", "d": "discriminator"}
    for r in results:  # the forwards see the gather dtype; the shards and the optimizer state stay float32
        for net, role in roles.items():
            gather = "bfloat16" if f"amp.{role}.fsdp_param_dtype=amp" in overrides else "float32"
            assert r["dtypes"][net] == {"gathered": [gather], "sharded": ["DTensor:float32"],
                                        "optimizer": ["float32"]}, (net, r["dtypes"][net])
    gathered = sum(t.numel() * t.element_size() for net in ("g", "d") for t in results[0][net].values())
    assert all(r["expected_bytes"] == gathered for r in results)  # the room check's size, read off the shards
    cfg = harness_config(*overrides)
    init_g, init_d = initial_networks(cfg)
    # Each rank's adversarial loss is a mean over its 1/ranks: the full batch's gradient is 1/ranks of it.
    adv_grad = torch.cat([r["adv_grad"] for r in results]) / ranks
    got = Outcome(Moved(params(init_g), results[0]["g"]), Moved(params(init_d), results[0]["d"]), adv_grad)
    case = Case(name, "cpu", tuple(overrides), split_batch=True)
    print(f"{name} on {ranks} ranks: "
          f"{assert_equivalent(case, got, references(True, case.model_overrides, FSDP_RANKS[ranks]))}")
