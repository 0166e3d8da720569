"""``parallel.<role>: fsdp`` (FSDP2's fully_shard) through the command lines, on 2 gloo CPU ranks,
and the start checks that refuse it.

The tiny DINOv2 mean teacher with D (configs/dinov2_tiny.yaml shrunk as tests/integration/
test_dinov2_run.py shrinks it: 2 blocks, 42 px, 4 steps, a checkpoint at step 2) trains with G,
its teacher and D sharded, and is held to the same run under DDP (its losses at every step), to
itself resumed from step 2 in another run dir (bitwise), and to a single process that evaluates
its checkpoint; checkpoints cross between FSDP and DDP both ways.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from segadv.checkpoint import read_checkpoint
from segadv.cli import eval as eval_cli
from segadv.cli import train as train_cli
from segadv.config import load_config
from segadv.errors import UserError
from segadv.parallel import fsdp, parse_device_map
from segadv.parallel.distributed import DistEnv
from segadv.parallel.wrap import resolve_mode
from segadv.training.checks import check_build, check_fsdp_param_dtype

from conftest import TINY_OVERRIDES
from fsdp_worker import network as small_network
from helpers import assert_refused

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
COMMAND = ["--config", "dinov2_tiny", "method.name=mean_teacher", "loss.lambda_adv=0.001",
           "--device-map", "g:cpu,d:cpu,t:cpu"]
# An evaluation mid-run (step 2) and at the end, on 3 val images in batches of 1: rank 0 scores two
# batches, rank 1 one, so the sharded networks' evaluation forwards differ between the ranks.
SMALL = ["data.synthetic.image_size=42", "target_data.synthetic.image_size=42",
         "data.synthetic.train_size=8", "target_data.synthetic.train_size=8",
         "data.synthetic.val_size=3", "target_data.synthetic.val_size=3",
         "data.batch_size=2", "data.val_batch_size=1", "data.num_workers=0",
         "model.generator.depth=2", "model.generator.head_features=16",
         "model.generator.head_out_channels=[8,16,32,64]", "model.discriminator.ndf=8",
         "train.max_steps=4", "train.eval_every=2", "train.log_every=1", "checkpoint.every=2",
         "train.deterministic=true", "log.tensorboard=false"]
FSDP = ("parallel.generator=fsdp", "parallel.discriminator=fsdp")
NETWORKS = ("generator", "teacher", "discriminator")
LOSS_ATOL = 1e-3  # the bound on FSDP's logged losses against DDP's, at every step

needs_fsdp = pytest.mark.skipif(not fsdp.fsdp_available(),
                                reason=f"FSDP2 needs torch >= 2.6 (this is {torch.__version__})")


def torchrun(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [*TORCHRUN, "-m", "segadv.cli.train", *COMMAND, "--run-dir", str(run_dir), *SMALL, *extra]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def losses(run_dir: Path) -> dict[int, dict[str, float]]:
    """Every train/ scalar the run logged, by step."""
    by_step: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        scalars = {k: v for k, v in record.items() if k.startswith("train/loss")}
        if scalars:
            by_step.setdefault(record["step"], {}).update(scalars)
    return by_step


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The run under FSDP and under DDP; FSDP resumed from its own step 2, DDP from FSDP's, FSDP from
    DDP's, each in a run dir of its own. The FSDP run's stderr is kept (its placement table)."""
    root = tmp_path_factory.mktemp("fsdp_cli")
    dirs = {name: root / name for name in ("fsdp", "ddp", "fsdp_resumed", "ddp_from_fsdp", "fsdp_from_ddp")}
    out = {"stderr": torchrun(dirs["fsdp"], *FSDP).stderr}
    torchrun(dirs["ddp"])
    torchrun(dirs["fsdp_resumed"], *FSDP, "--resume", str(dirs["fsdp"] / "checkpoints" / "step_2.pt"))
    torchrun(dirs["ddp_from_fsdp"], "--resume", str(dirs["fsdp"] / "checkpoints" / "step_2.pt"))
    torchrun(dirs["fsdp_from_ddp"], *FSDP, "--resume", str(dirs["ddp"] / "checkpoints" / "step_2.pt"))
    return {**dirs, **out}


@needs_fsdp
def test_fsdp_writes_plain_checkpoints_with_ddps_keys_and_shows_per_rank_bytes(runs):
    fsdp_ckpt, ddp_ckpt = (read_checkpoint(runs[run] / "checkpoints" / "step_2.pt") for run in ("fsdp", "ddp"))
    for key in (*NETWORKS, "optim_generator", "optim_discriminator"):
        assert fsdp_ckpt[key].keys() == ddp_ckpt[key].keys(), key
    for net in NETWORKS:
        assert all(type(v) is torch.Tensor and v.device.type == "cpu" for v in fsdp_ckpt[net].values()), net
        assert {k: v.shape for k, v in fsdp_ckpt[net].items()} == {k: v.shape for k, v in ddp_ckpt[net].items()}
    for key in ("optim_generator", "optim_discriminator"):
        ours, theirs = fsdp_ckpt[key]["optimizer"]["state"], ddp_ckpt[key]["optimizer"]["state"]
        assert ours.keys() == theirs.keys() and ours  # integer parameter ids, as a single process
        assert all(type(t) is torch.Tensor and t.shape == theirs[i][name].shape
                   for i, entry in ours.items() for name, t in entry.items())
    table = runs["stderr"][runs["stderr"].index("placement:"):]
    rows = [line.split() for line in table.splitlines() if line.split()[1:2] == ["generator"]]
    assert [row[2] for row in rows] == ["FSDP", "FSDP"]
    weights = [float(row[5]) for row in rows]  # each rank's shards: together G's, each well under it
    full = sum(v.numel() * v.element_size() for v in fsdp_ckpt["generator"].values()) / 1024**2
    assert sum(weights) == pytest.approx(full, abs=0.2) and max(weights) < 0.8 * full


@needs_fsdp
def test_fsdp_logs_ddps_losses_at_every_step(runs):
    ours, theirs = losses(runs["fsdp"]), losses(runs["ddp"])
    assert sorted(ours) == sorted(theirs) == [1, 2, 3, 4]
    for step, scalars in theirs.items():
        assert ours[step].keys() == scalars.keys()
        assert {"train/loss_seg", "train/loss_adv", "train/loss_d", "train/loss_unsup"} <= scalars.keys()
        worst = max(abs(ours[step][k] - v) for k, v in scalars.items())
        assert worst <= LOSS_ATOL, f"step {step}: {ours[step]} against DDP's {scalars}"
    # And the networks they end with (the teacher's EMA ran over each rank's shards), within float32
    # summation order (reduce-scatter against all-reduce: measured 1.6e-7).
    a, b = (read_checkpoint(runs[run] / "checkpoints" / "last.pt") for run in ("fsdp", "ddp"))
    for key in NETWORKS:
        assert all(torch.allclose(a[key][k].float(), b[key][k].float(), rtol=0, atol=1e-5) for k in b[key]), key


@needs_fsdp
def test_an_fsdp_run_resumed_into_a_new_run_dir_ends_bitwise_where_it_ended(runs):
    ours, theirs = (read_checkpoint(runs[run] / "checkpoints" / "last.pt") for run in ("fsdp_resumed", "fsdp"))
    assert sorted(losses(runs["fsdp_resumed"])) == [3, 4]
    for key in NETWORKS:
        assert all(torch.equal(ours[key][k], theirs[key][k]) for k in theirs[key]), key
    for key in ("optim_generator", "optim_discriminator"):
        a, b = ours[key]["optimizer"]["state"], theirs[key]["optimizer"]["state"]
        assert all(torch.equal(a[i][name], b[i][name]) for i in b for name in b[i]), key


@needs_fsdp
def test_checkpoints_cross_between_fsdp_and_ddp(runs):
    """A resume from the other wrapper's checkpoint goes on as the uninterrupted run did: the same
    losses (within the FSDP-vs-DDP bound) and weights within float32 summation order."""
    for resumed, whole in (("ddp_from_fsdp", "ddp"), ("fsdp_from_ddp", "fsdp")):
        ours, theirs = losses(runs[resumed]), losses(runs[whole])
        assert sorted(ours) == [3, 4]
        assert all(abs(ours[s][k] - theirs[s][k]) <= LOSS_ATOL for s in ours for k in ours[s]), resumed
        a, b = (read_checkpoint(runs[run] / "checkpoints" / "last.pt") for run in (resumed, whole))
        for key in NETWORKS:
            assert all(torch.allclose(a[key][k].float(), b[key][k].float(), rtol=0, atol=1e-5) for k in b[key]), key


@needs_fsdp
def test_a_single_process_evaluates_the_fsdp_checkpoint_as_the_run_scored_it(runs, tmp_path, capsys, caplog,
                                                                            one_torch_thread):
    """segadv-eval (one process, no FSDP) scores the student and the teacher of the FSDP run's
    checkpoint as the run scored them at the same step (with its networks gathered), and the
    student's weights start a single-process run (init.generator.path, the strict loader)."""
    logged = {k: v for line in (runs["fsdp"] / "metrics.jsonl").read_text().splitlines()
              for k, v in json.loads(line).items() if k in ("val/mIoU", "val/mIoU_teacher")}  # the last: step 4's
    for network, key in (("student", "val/mIoU"), ("teacher", "val/mIoU_teacher")):
        capsys.readouterr()
        code = eval_cli.main(["--checkpoint", str(runs["fsdp"] / "checkpoints" / "last.pt"), "--device", "cpu",
                              "--network", network, "--json"])
        assert code == 0
        scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert scored["step"] == 4 and scored["mIoU"] == pytest.approx(logged[key], abs=1e-12), network
    assert train_cli.main([*COMMAND, "--run-dir", str(tmp_path / "init"), *SMALL, "train.max_steps=1",
                           "train.eval_every=1", "checkpoint.every=1",
                           f"init.generator.path={runs['fsdp'] / 'checkpoints' / 'last.pt'}"]) == 0
    assert "generator: loaded 92 tensors" in caplog.text


@needs_fsdp
def test_forwards_only_some_ranks_run_while_gathered_leave_the_next_steps_right(tmp_path):
    """Rank 0 alone evaluates inside ``fsdp.gathered`` (before the first step and between steps):
    no rank waits in a collective, and the steps after it are one process's steps on the whole
    batch from rank 0's initial weights (FSDP's backward prefetch follows the recorded forwards, so
    a record of rank 0's extra forwards would have the ranks gather different blocks)."""
    result = subprocess.run([*TORCHRUN, str(Path(__file__).parent / "fsdp_worker.py"), str(tmp_path)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0]["sharded"] and len(ranks[0]["evaluated"]) == 9 and len(ranks[1]["evaluated"]) == 1
    single = small_network()
    single.load_state_dict(ranks[0]["initial"])
    optimizer = torch.optim.SGD(single.parameters(), lr=0.1)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    for step in range(3):
        with torch.no_grad():
            expected, evaluated = single(x), ranks[0]["evaluated"][3 * step:3 * step + 3]
            assert all(torch.allclose(expected, out, atol=1e-6) for out in evaluated)
        single(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    for rank in ranks:
        assert all(torch.allclose(rank["final"][k], v, atol=1e-6) for k, v in single.state_dict().items())


# ----------------------------------------------------------------------------------- start checks


def test_fsdp_without_a_multi_process_launch_exits_2_naming_the_key(tmp_path, capsys, one_torch_thread):
    """One process: nothing to shard over (on a torch without fully_shard, the floor is named first)."""
    code = train_cli.main([*COMMAND, "--run-dir", str(tmp_path / "run"), *SMALL, "parallel.generator=fsdp"])
    assert_refused(capsys, code, "parallel.generator=fsdp",
            "multi-process launch" if fsdp.fsdp_available() else "needs torch >= 2.6")


def test_fsdp_param_dtype_without_fsdp_exits_2_naming_the_key(tmp_path, capsys, one_torch_thread):
    """amp.<role>.fsdp_param_dtype=amp sets FSDP's gather dtype: one process shards nothing."""
    code = train_cli.main([*COMMAND, "--run-dir", str(tmp_path / "run"), *SMALL, "amp.generator.enabled=true",
                           "amp.generator.fsdp_param_dtype=amp"])
    assert_refused(capsys, code, "amp.generator.fsdp_param_dtype=amp", "not sharded by FSDP (its wrapper here: none)")


def test_fsdp_param_dtype_with_amp_off_exits_2_naming_the_key(tmp_path, capsys, one_torch_thread):
    """No autocast dtype to gather in: refused by the config (enabled false) or at start (auto resolved off)."""
    code = train_cli.main([*COMMAND, "--run-dir", str(tmp_path / "run"), *SMALL, "amp.generator.fsdp_param_dtype=amp"])
    assert_refused(capsys, code, "amp.generator", "fsdp_param_dtype: amp", "enabled is false")
    cfg = load_config(None, [*TINY_OVERRIDES, "amp.generator.enabled=auto", "amp.generator.fsdp_param_dtype=amp"])
    with pytest.raises(UserError, match=re.escape("amp.generator.fsdp_param_dtype=amp gathers the generator's "
                                                  "parameters in its autocast dtype, but amp.generator.enabled=auto "
                                                  "resolved to off")):
        check_fsdp_param_dtype(cfg, "generator", "fsdp", enabled=False)
    # the teacher without an amp entry of its own takes G's: the key named is G's
    with pytest.raises(UserError, match=re.escape("amp.generator.fsdp_param_dtype=amp sets how FSDP gathers the "
                                                  "teacher's")):
        check_fsdp_param_dtype(cfg, "teacher", "none")


def test_fsdp_param_dtype_refuses_a_network_with_batch_norm():
    """FSDP casts the gathered weight, never BatchNorm's running statistics, which BatchNorm refuses."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Conv2d(4, 4, 1),
                              torch.nn.BatchNorm2d(4))
    with pytest.raises(UserError, match=re.escape("amp.generator.fsdp_param_dtype=amp: the generator has BatchNorm "
                                                  "layers (1 and 1 more)")):
        fsdp.check_gathers_in_amp(net, "amp.generator.fsdp_param_dtype", "generator")
    fsdp.check_gathers_in_amp(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)),
                              "amp.generator.fsdp_param_dtype", "generator")


@needs_fsdp
def test_fsdp_param_dtype_amp_is_a_bf16_gather_with_a_float32_reduce():
    from segadv.config.network_settings import NetworkAmpConfig

    policy = fsdp.mixed_precision(NetworkAmpConfig(enabled=True, dtype="bfloat16", fsdp_param_dtype="amp"))
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert fsdp.mixed_precision(NetworkAmpConfig(enabled=True, dtype="float16", fsdp_param_dtype="amp")).param_dtype \
        == torch.float16
    assert fsdp.mixed_precision(NetworkAmpConfig(enabled=True)) is None  # the default: float32 gathers


def test_fsdp_on_a_torch_without_fully_shard_is_refused_naming_the_floor(monkeypatch):
    monkeypatch.setattr(fsdp, "torch_version", lambda: (2, 5))
    with pytest.raises(UserError, match=r"parallel\.discriminator=fsdp needs torch >= 2\.6"):
        resolve_mode("fsdp", "discriminator", (torch.device("cpu"),), DistEnv(0, 0, 2, 2))


TWO_RANKS = DistEnv(rank=0, local_rank=0, world_size=2, local_world_size=2)


@pytest.mark.parametrize("overrides, device_map, named", [
    pytest.param(("parallel.generator=fsdp", "model.generator.arch=dinov2", "model.generator.depth=2",
                  "data.synthetic.image_size=42"),
                 "g:cpu/cpu,d:cpu", "parallel.generator=fsdp with the device map", id="split-g"),
    pytest.param(("parallel.generator=fsdp", "parallel.sync_bn=true"), "cpu",
                 "parallel.sync_bn needs the generator under DDP (a multi-process launch): FSDP shards", id="sync_bn"),
    pytest.param(("parallel.discriminator=ddp", "amp.discriminator.enabled=true", "amp.discriminator.fsdp_param_dtype=amp"),
                 "cpu", "amp.discriminator.fsdp_param_dtype=amp sets how FSDP gathers the discriminator's parameters, "
                 "but the discriminator is not sharded by FSDP (its wrapper here: ddp)", id="bf16-gathers-under-ddp"),
])
@needs_fsdp
def test_fsdp_start_checks_refuse_naming_the_key(overrides, device_map, named):
    dinov2 = "model.generator.arch=dinov2" in overrides  # the tiny G's DeepLab keys are not the DINOv2 row's
    cfg = load_config(None, [*(o for o in TINY_OVERRIDES if not (dinov2 and o.startswith("model.generator."))),
                             *overrides])
    with pytest.raises(UserError, match=re.escape(named)):
        check_build(cfg, parse_device_map(device_map), TWO_RANKS)


@needs_fsdp
def test_fsdp_takes_one_device_per_process():
    """A replica set (DataParallel's) under fsdp: one device a process, more processes instead."""
    with pytest.raises(UserError, match=r"parallel\.generator=fsdp takes one device per process"):
        resolve_mode("fsdp", "generator", (torch.device("cuda", 0), torch.device("cuda", 1)), TWO_RANKS)


@needs_fsdp
def test_the_teacher_is_sharded_with_its_student_and_never_by_auto():
    cfg = load_config(None, [*TINY_OVERRIDES, "method.name=mean_teacher", "parallel.generator=fsdp"])
    modes = {role.name: role.mode for role in check_build(cfg, parse_device_map("cpu"), TWO_RANKS).roles}
    assert modes["generator"] == modes["teacher"] == "fsdp"
    cfg = load_config(None, [*TINY_OVERRIDES, "method.name=mean_teacher"])
    modes = {role.name: role.mode for role in check_build(cfg, parse_device_map("cpu"), TWO_RANKS).roles}
    assert modes["generator"] == "ddp" and modes["teacher"] == "none"  # auto stays DDP
