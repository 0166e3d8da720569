"""torch.compile per network (compile.*): bounded recompiles, exact resume, plain files, clear
refusals, the planner's view.

The compiled step's equivalence with the plain float32 loop (inductor; aot_eager under AMP,
checkpointing and accumulation) is tests/integration/test_equivalence.py's ``*compile*`` cases;
compiled checkpointing's statistics, tests/parallel/test_activation_checkpoint.py's. Here the
backend is aot_eager where the test is about dynamo's guards and segadv's wiring, not inductor's
kernels: the same graph capture, guards and AOTAutograd partition, seconds instead of a minute of
C++ compilation per graph.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import TINY_OVERRIDES, needs_planner_torch
from helpers import per_step_losses, resume_cfg
from segadv.training import loop as train_module
from segadv.checkpoint import load_weights, read_checkpoint
from segadv.config import load_config
from segadv.errors import UserError
from segadv.models import build_generator
from segadv.parallel.compile import check_compile, graphs_compiled
from segadv.training.loop import train

COMPILE_AOT = ("compile.generator=true", "compile.discriminator=true", "compile.backend=aot_eager")


# AdvSemiSeg: three streams, the panel and the diagnostic images at every evaluation, and the
# self-training term switched on at step 4, after the first evaluation (the supervised method's
# step is its labeled part).
ADVSEMISEG = ("method.name=advsemiseg", "data.labeled_fraction=0.5", "method.advsemiseg.semi_start=4",
              "log.diagnostic_images=4")


def test_no_step_recompiles_after_the_first_evaluation(tiny_cfg, monkeypatch):
    """Each network compiles on its first steps, G again for evaluation (eval mode, no_grad, the
    val batch size, the panel's): from the end of the first evaluation to the end of the run, not
    one graph more, through three more evaluations."""
    cfg = load_config(None, [*TINY_OVERRIDES, *COMPILE_AOT, *ADVSEMISEG, "train.max_steps=8", "train.eval_every=2",
                             "checkpoint.every=100", "log.tensorboard=false"])
    cfg.run_dir, cfg.device_map = tiny_cfg.run_dir, "cpu"
    after_evaluation = []
    evaluate_all = train_module.evaluate_all

    def counted(*args, **kwargs):
        metrics = evaluate_all(*args, **kwargs)
        after_evaluation.append(graphs_compiled())
        return metrics

    monkeypatch.setattr(train_module, "evaluate_all", counted)
    torch._dynamo.reset()
    before = graphs_compiled()
    result = train(cfg)
    assert result.step == 8 and len(after_evaluation) == 4
    assert after_evaluation[0] - before >= 3, "G (train and eval) and D must each have compiled"
    assert after_evaluation == [after_evaluation[0]] * 4, f"graphs compiled after each evaluation: {after_evaluation}"
    assert graphs_compiled() == after_evaluation[0]


def test_a_compiled_run_resumes_bitwise_and_writes_the_plain_weights(tmp_path):
    """Compiled from step 0 vs compiled, stopped at 4, resumed (compiled afresh) to 6: the same
    losses bitwise; every file holds the bare networks' keys, which load strictly into a fresh G."""
    full = train(resume_cfg(tmp_path, "full", *COMPILE_AOT))
    first = train(resume_cfg(tmp_path, "split", *COMPILE_AOT), stop_at=4)
    assert (first.step, first.stopped_by) == (4, "stop_at")
    second = train(resume_cfg(tmp_path, "split", *COMPILE_AOT), resume="auto")
    assert per_step_losses(second.run_dir) == per_step_losses(full.run_dir)

    cfg = resume_cfg(tmp_path, "check")
    for path in sorted((second.run_dir / "checkpoints").glob("*.pt")):
        ckpt = read_checkpoint(path)
        for role in ("generator", "discriminator"):
            assert not [k for k in ckpt[role] if "_orig_mod" in k or k.startswith("module.")], (path, role)
        fresh = build_generator(cfg.model.generator, cfg.data.num_classes)
        load_weights(path, fresh, role="generator")  # strict
        assert all(torch.equal(fresh.state_dict()[k], v) for k, v in ckpt["generator"].items())


def test_no_cpp_compiler_is_exit_2_naming_the_setting(tmp_path):
    """Inductor on the CPU without a C++ compiler: a short message naming compile.generator before
    anything is built, not inductor's traceback at the first step."""
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "segadv.cli.train", "--run-dir", str(tmp_path / "run"), "--device-map", "cpu",
           *TINY_OVERRIDES, "compile.generator=true"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "compile.generator=true" in result.stderr and "C++ compiler" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_dataparallel_replica_set_is_refused_naming_the_setting():
    """DataParallel's replicas would all run the first device's compiled forward: segadv-train
    refuses it before building (segadv-plan plans no replica set)."""
    cfg = load_config(None, ["compile.generator=true"])
    devices = (torch.device("cuda", 0), torch.device("cuda", 1))
    with pytest.raises(UserError, match=r"compile\.generator=true with a DataParallel replica set"):
        check_compile(cfg.compile, "generator", devices, "dp")
    check_compile(cfg.compile.model_copy(update={"backend": "aot_eager"}), "generator", devices[:1], "dp")


@needs_planner_torch
def test_the_plan_of_a_compiled_run_is_the_eager_plan_with_a_note():
    from segadv.plan.dry_run import dry_run

    overrides = [*TINY_OVERRIDES, "device_map=g:1,d:0"]
    eager = dry_run(load_config(None, overrides))
    compiled = dry_run(load_config(None, [*overrides, "compile.generator=true", "compile.discriminator=true"]))
    assert any("planned eager" in note and "compile.generator" in note for note in compiled.notes)
    assert not any("compile" in note for note in eager.notes)
    assert {k: r.peak_bytes for k, r in compiled.devices.items()} == {k: r.peak_bytes for k, r in eager.devices.items()}
