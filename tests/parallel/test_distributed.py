"""DDP on CPU with gloo, DataParallel wrapping, multi-node over loopback, elastic restart."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from segadv.training.build import build_training
from segadv.checkpoint import read_checkpoint
from segadv.data import build_dataloaders
from segadv.engine.evaluate import evaluate
from segadv.parallel import parse_device_map, unwrap
from segadv.parallel.wrap import AutocastForward

from conftest import TINY_OVERRIDES
from helpers import TARGET_DATA, stream_positions
from ddp_worker import freeze_batch_statistics

HERE = Path(__file__).parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, timeout=300, **kwargs):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def worker(mode, out, *overrides):
    run([*TORCHRUN, "--standalone", "--nproc-per-node=2", str(HERE / "ddp_worker.py"), mode, str(out), *overrides])


@pytest.fixture(scope="module")
def shallow_ddp_run(tmp_path_factory):
    """Three DDP steps of a G whose encoder_depth leaves smp stages unused, then G as evaluated."""
    out = tmp_path_factory.mktemp("shallow")
    worker("train_then_eval", out, "model.generator.encoder_depth=3", "train.max_steps=3")
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


def test_ddp_trains_a_shallow_encoder(shallow_ddp_run):
    """smp keeps the stages below encoder_depth; DDP (find_unused_parameters=False) used to stop at
    step 2 on their missing gradients. They are dropped, and the ranks stay identical."""
    r0, r1 = shallow_ddp_run
    assert not any(k.startswith("encoder.features.14") for k in r0["g"])  # a dropped stage
    assert all(torch.equal(r0["g"][k], r1["g"][k]) for k in r0["g"] if "running" not in k and "num_batches" not in k)


def test_ddp_ranks_evaluate_rank0s_batchnorm_statistics(shallow_ddp_run):
    r0, r1 = shallow_ddp_run
    stats = [k for k in r0["g"] if "running_mean" in k or "running_var" in k]
    assert stats and all(torch.equal(r0["g"][k], r1["g"][k]) for k in stats)


def test_ddp_keeps_both_networks_identical_across_ranks(tmp_path):
    worker("train", tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for net in ("g", "d"):
        assert r0[net].keys() == r1[net].keys()
        params = [k for k in r0[net] if "running" not in k and "num_batches" not in k]
        assert all(torch.equal(r0[net][k], r1[net][k]) for k in params), net


def test_one_ddp_step_on_2x_b_equals_one_step_on_2b(tmp_path, tiny_cfg):
    from segadv.config import load_config

    cfg = load_config(None, [*TINY_OVERRIDES, "data.batch_size=2", "loss.lambda_adv=0.1"])
    gen = torch.Generator().manual_seed(5)
    size = cfg.data.synthetic.image_size
    batch = {"images": torch.randn(4, 3, size, size, generator=gen),
             "labels": torch.randint(0, cfg.data.num_classes, (4, size, size), generator=gen)}
    torch.save(batch, tmp_path / "batch.pt")
    worker("equivalence", tmp_path)

    torch.manual_seed(0)
    single = build_training(cfg, parse_device_map("cpu"))
    freeze_batch_statistics(unwrap(single.g.module))
    single.method.iteration(batch["images"], batch["labels"], step=0)
    ddp = torch.load(tmp_path / "ddp_step.pt", weights_only=True)
    for net, module in (("g", single.g.module), ("d", single.d.module)):
        ref = unwrap(module).state_dict()
        worst = max((ddp[net][k].float() - ref[k].float()).abs().max().item() for k in ref)
        assert worst < 1e-5, (net, worst)


MEAN_TEACHER_SETTINGS = [
    # French et al.'s teacher: eval-mode BatchNorm whose running statistics the EMA averages from
    # each rank's own (locally updated) G buffers.
    # No D (the worker's loss.lambda_adv=0.1 is the other methods').
    pytest.param(("method.name=mean_teacher", "method.mean_teacher.teacher_batchnorm=running", "loss.lambda_adv=0"),
                 id="semi-running"),
    # DACS's: the teacher in train mode, its statistics moved by its own forward on each rank's
    # target batch; adaptation with D on top (a third network, under DDP).
    pytest.param(("method.name=mean_teacher", "method.mean_teacher.teacher_batchnorm=batch",
                  "loss.lambda_adv=0.001", TARGET_DATA), id="adaptation-batch-d"),
]


@pytest.mark.parametrize("overrides", MEAN_TEACHER_SETTINGS)
def test_ddp_ranks_hold_the_same_teacher_the_ema_of_rank0s_student(tmp_path, overrides):
    """Three mean_teacher steps under DDP (gloo, 2 CPU processes, each rank its own random
    batches): every teacher tensor, parameters and buffers, is bitwise equal across ranks, and
    equal to the EMA of G that rank 0 computes itself after each step (parameters, and with running
    statistics G's floating buffers; the same operations, so exactly)."""
    worker("mean_teacher", tmp_path, *overrides)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    teacher = r0["teacher"]
    assert teacher.keys() == r1["teacher"].keys() and teacher.keys() == r0["g"].keys()
    unequal = [k for k in teacher if not torch.equal(teacher[k], r1["teacher"][k])]
    assert not unequal, f"teacher tensors differ across ranks: {unequal}"
    # The ranks did see different batches: G's BatchNorm statistics, updated locally in the last
    # forward, differ, so equal teacher buffers are the method's doing, not the data's.
    stats = [k for k in r0["g"] if k.endswith("running_mean")]
    assert stats and any(not torch.equal(r0["g"][k], r1["g"][k]) for k in stats)
    ema = r0["ema"]
    running = "method.mean_teacher.teacher_batchnorm=running" in overrides
    params = {k for k in teacher if "running" not in k and "num_batches" not in k}
    assert set(ema) == params | ({k for k in teacher if "running" in k} if running else set())
    off = {k: (teacher[k] - ema[k]).abs().max().item() for k in ema if not torch.equal(teacher[k], ema[k])}
    assert not off, f"teacher differs from rank 0's EMA of G: {off}"
    # And the teacher moved away from G's start (three steps with decay 0, 1/2, 2/3): it is not a copy.
    assert any(not torch.equal(teacher[k], r0["g"][k]) for k in ema)


def test_distributed_eval_equals_single_process_eval(tmp_path):
    from segadv.config import load_config

    worker("eval", tmp_path)
    cfg = load_config(None, [*TINY_OVERRIDES, "data.batch_size=2", "loss.lambda_adv=0.1"])
    torch.manual_seed(0)
    parts = build_training(cfg, parse_device_map("cpu"))
    _, val_loader = build_dataloaders(cfg.data, seed=0, pin_memory=False)
    single = evaluate(unwrap(parts.g.module), val_loader, torch.device("cpu"), cfg.data.num_classes).metrics
    distributed = json.loads((tmp_path / "eval.json").read_text())
    assert distributed["mIoU"] == pytest.approx(single["mIoU"], abs=1e-12)
    assert distributed["pixel_acc"] == pytest.approx(single["pixel_acc"], abs=1e-12)


def train_cli(run_dir, *extra):
    return [sys.executable, "-m", "segadv.cli.train", "--run-dir", str(run_dir), "--device-map", "cpu",
            *TINY_OVERRIDES, "checkpoint.every=3", "train.eval_every=3", *extra]


def test_cli_ddp_run_writes_one_checkpoint_set_and_one_event_file(tmp_path):
    run_dir = tmp_path / "ddp"
    result = run(train_cli(run_dir, "train.max_steps=6", "--nproc-per-node", "2"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.json", "best.pt", "last.pt", "step_3.pt",
                                                                          "step_6.pt"]
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "train/loss_seg" in line]
    assert steps == sorted(set(steps))
    assert "DistributedDataParallel" in result.stderr  # the placement table
    ckpt = read_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert isinstance(ckpt["rng"], list) and len(ckpt["rng"]) == 2
    assert not any(k.startswith("module.") for k in ckpt["generator"])


def test_cli_ddp_smoke_run_shares_one_throwaway_run_dir_and_keeps_nothing(tmp_path, monkeypatch):
    """train.smoke under DDP: rank 0 makes the throwaway dir and names it to rank 1, both read the
    checkpoint back, and rank 0 removes it once both have."""
    throwaway = tmp_path / "tmp"
    throwaway.mkdir()
    monkeypatch.setenv("TMPDIR", str(throwaway))
    result = run(train_cli(tmp_path / "run", "train.smoke=true", "--nproc-per-node", "2"))
    assert "nothing kept" in result.stderr and "DistributedDataParallel" in result.stderr
    assert f"removed the throwaway run dir {throwaway / 'segadv-smoke-'}" in result.stderr
    assert not (tmp_path / "run").exists() and not list(throwaway.glob("segadv-smoke-*"))  # torchrun's own may stay


def test_cli_ddp_ranks_stop_together_when_d_leaves_its_band(tmp_path):
    """train.on_discriminator_collapse=stop under DDP (gloo, 2 ranks): D at 100 times its learning
    rate wins outright within a few log steps; every rank decides from the same rank-averaged
    losses, so both stop at that step (no rank waits in a collective for the other), one
    checkpoint, one warning (rank 0's), outcome stopped."""
    run_dir = tmp_path / "ddp-health"
    result = run(train_cli(run_dir, "train.max_steps=12", "train.log_every=1", "checkpoint.every=100",
                           "train.eval_every=100", "optim.discriminator.lr=0.01", "log.d_wins_steps=3",
                           "train.on_discriminator_collapse=stop", "--nproc-per-node", "2"))
    status = json.loads((run_dir / "status.json").read_text())
    assert status["outcome"] == "stopped" and status["stopped_by"].startswith("D wins outright on loss_d")
    assert status["step"] < 12 and read_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == status["step"]
    assert [e["step"] for e in status["discriminator_health"]] == [status["step"]]
    assert (run_dir / "train.log").read_text().count("WARNING segadv.monitor.diagnostics: D wins outright") == 1
    assert result.stderr.count("D wins outright: loss_d below") == 1


def test_cli_ddp_advsemiseg_shards_and_checkpoints_its_three_streams(tmp_path):
    """AdvSemiSeg under DDP (gloo, 2 ranks): 8 labeled and 8 unlabeled samples, 4 per rank, 2
    batches per rank and epoch; 5 iterations cycle every stream."""
    run_dir = tmp_path / "ddp-semi"
    run(train_cli(run_dir, "train.max_steps=5", "checkpoint.every=5", "method.name=advsemiseg",
                  "data.labeled_fraction=0.5", "method.advsemiseg.semi_start=2", "--nproc-per-node", "2"))
    ckpt = read_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert stream_positions(ckpt) == {name: 5 for name in ("labeled", "unlabeled", "gt")}
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if "train/loss_semi" in line][-1]
    assert last["train/loss_semi"] > 0 and 0 <= last["train/semi_pixel_ratio"] <= 1


def test_cli_ddp_mean_teacher_draws_its_mixed_batch_once_per_evaluation(tmp_path):
    """The mean teacher under DDP (gloo, 2 ranks): rank 0 alone draws the ``train/mixed_batch``
    panel (its own shard's mixed images, 2 rows), into the run's one event file, at each evaluation;
    every rank keeps its views without a collective, so neither waits for the other."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "ddp-mt"
    run(train_cli(run_dir, "train.max_steps=3", "method.name=mean_teacher", "data.labeled_fraction=0.5",
                  "--nproc-per-node", "2"))
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    [panel] = events.Images("train/mixed_batch")
    assert panel.step == 3 and panel.width == 3 * (64 + 2) + 2  # three columns of data.synthetic.image_size
    assert panel.height > 2 * (64 + 2) + 2  # two rows, the titles and the legend


def test_cli_ddp_multi_level_adaptation_wraps_each_of_three_networks(tmp_path):
    """AdaptSegNet multi-level under DDP (gloo, 2 ranks): G, D and D_aux each in their own DDP;
    source and target streams sharded and checkpointed; best.pt written once."""
    from helpers import TARGET_DATA

    run_dir = tmp_path / "ddp-uda"
    result = run(train_cli(run_dir, "train.max_steps=3", TARGET_DATA, "method.name=adaptsegnet",
                           "model.generator.aux_head=true", "--nproc-per-node", "2"))
    table = [line for line in result.stderr.splitlines() if "DistributedDataParallel" in line]
    assert sorted(line.split()[1] for line in table) == ["discriminator"] * 2 + ["discriminator_aux"] * 2 + \
        ["generator"] * 2  # one row per rank and network
    ckpt = read_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert stream_positions(ckpt) == {"source": 3, "target": 3}
    assert "discriminator_aux" in ckpt and not any(k.startswith("module.") for k in ckpt["discriminator_aux"])
    assert json.loads((run_dir / "checkpoints" / "best.json").read_text())["step"] == 3


def test_ddp_without_a_multi_process_launch_is_a_user_error(tmp_path):
    result = subprocess.run(train_cli(tmp_path / "x", "parallel.generator=ddp"), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "parallel.generator=ddp needs a multi-process launch" in result.stderr


def test_dataparallel_wrapping_keys_and_autocast_inside_replicas(tiny_cfg):
    tiny_cfg.parallel.generator = "dp"
    tiny_cfg.parallel.discriminator = "dp"
    tiny_cfg.amp.generator.enabled = True  # bfloat16 on CPU
    torch.manual_seed(0)
    parts = build_training(tiny_cfg, parse_device_map("cpu"))
    assert isinstance(parts.g.module, nn.DataParallel) and isinstance(parts.d.module, nn.DataParallel)
    assert isinstance(parts.g.module.module, AutocastForward)
    # Keys stay bare: the unwrapped module is what checkpoints hold.
    assert not any(k.startswith("module.") for k in unwrap(parts.g.module).state_dict())
    # Autocast is thread-local: a replica thread with no autocast block of its own still runs
    # G under its autocast, because it lives inside the forward.
    out = {}
    size = tiny_cfg.data.synthetic.image_size
    thread = threading.Thread(target=lambda: out.setdefault("y", parts.g.module(torch.randn(2, 3, size, size))))
    thread.start()
    thread.join()
    assert out["y"].dtype == torch.bfloat16
    labels = torch.randint(0, tiny_cfg.data.num_classes, (2, size, size))
    losses = parts.method.iteration(torch.randn(2, 3, size, size), labels, step=0)
    assert all(torch.isfinite(v) for v in losses.as_dict().values())


def test_two_nodes_over_loopback(tmp_path):
    port = free_port()
    run_dir = tmp_path / "multinode"
    procs = [
        subprocess.Popen([*TORCHRUN, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                          f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=segadv-test", "-m", "segadv.cli.train",
                          *train_cli(run_dir, "train.max_steps=4")[3:]],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    ckpt = read_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert ckpt["step"] == 4 and len(ckpt["rng"]) == 2  # two ranks, one per "node"


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def test_elastic_restart_resumes_after_a_killed_worker(tmp_path):
    run_dir = tmp_path / "elastic"
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node=2", "--max-restarts=1", "-m", "segadv.cli.train",
           *train_cli(run_dir, "train.max_steps=40", "checkpoint.every=2", "train.eval_every=100",
                      "train.log_every=1", "--resume", "auto")[3:]]
    log_path = tmp_path / "torchrun.log"  # a file, not a pipe: an unread pipe fills and blocks the workers
    log_file = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 240
    while not (run_dir / "checkpoints" / "step_4.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "no checkpoint before the kill"
        time.sleep(0.2)
    workers = children(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    proc.wait(timeout=300)
    log_file.close()
    err = log_path.read_text(errors="replace")
    assert proc.returncode == 0, err[-3000:]
    assert "resumed from" in err  # the restarted workers continued from the last checkpoint
    assert read_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == 40


@pytest.mark.cuda2
def test_dataparallel_replicas_run_each_under_their_networks_autocast(tiny_cfg):
    tiny_cfg.parallel.generator = "dp"
    tiny_cfg.amp.generator.enabled = True
    tiny_cfg.amp.generator.dtype = "float16"
    tiny_cfg.data.batch_size = 4
    torch.manual_seed(0)
    parts = build_training(tiny_cfg, parse_device_map("g:0+1,d:0"))
    dtypes = {}
    unwrap(parts.g.module).register_forward_hook(lambda m, a, out: dtypes.setdefault(out.device, out.dtype) and None)
    size = tiny_cfg.data.synthetic.image_size
    labels = torch.randint(0, tiny_cfg.data.num_classes, (4, size, size))
    losses = parts.method.iteration(torch.randn(4, 3, size, size), labels, step=0)
    assert dtypes == {torch.device("cuda", 0): torch.float16, torch.device("cuda", 1): torch.float16}
    assert all(torch.isfinite(v) for v in losses.as_dict().values())
    assert {p.device for p in unwrap(parts.g.module).parameters()} == {torch.device("cuda", 0)}


@pytest.mark.cuda2
def test_ddp_over_nccl_two_gpus(tmp_path):
    run_dir = tmp_path / "nccl"
    cmd = [sys.executable, "-m", "segadv.cli.train", "--run-dir", str(run_dir), "--device-map", "g:0,d:0",
           *TINY_OVERRIDES, "train.max_steps=4", "--nproc-per-node", "2"]
    result = run(cmd)
    assert "backend nccl" in result.stderr
    assert read_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == 4


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_ddp_unimatch_keeps_every_network_identical_across_ranks(tmp_path, variant):
    """Three unimatch steps with D on top under DDP (gloo, 2 CPU processes, each rank its own random
    batches): G's feature-scaling forwards (V1's perturbed copy, V2's complementary dropout) and
    each forward's own backward keep G and D bitwise equal across ranks, and V2's teacher, the EMA
    of G's parameters and buffers, takes rank 0's buffers where each rank's G has its own."""
    worker("unimatch", tmp_path, "method.name=unimatch", f"method.unimatch.variant={variant}",
           "method.unimatch.confidence=0.2", "loss.lambda_adv=0.01")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert set(r0) == {"generator", "discriminator"} | ({"teacher"} if variant == "v2" else set())
    for role in ("generator", "discriminator"):
        params = [k for k in r0[role] if "running" not in k and "num_batches" not in k]
        assert params and all(torch.equal(r0[role][k], r1[role][k]) for k in params), role
    stats = [k for k in r0["generator"] if k.endswith("running_mean")]
    assert stats and any(not torch.equal(r0["generator"][k], r1["generator"][k]) for k in stats)  # own batches
    if variant == "v2":
        assert all(torch.equal(r0["teacher"][k], r1["teacher"][k]) for k in r0["teacher"])


def test_ddp_trains_the_head_on_a_frozen_encoder(tmp_path):
    """model.generator.freeze_encoder under DDP (gloo, 2 ranks): the encoder's parameters take no
    gradient, which DDP (find_unused_parameters=False) skips; its BatchNorm stays in eval mode, so
    even its running statistics, which each rank's own batches would move apart, stay equal."""
    worker("train", tmp_path, "model.generator.freeze_encoder=true")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    encoder = [k for k in r0["g"] if k.startswith("encoder.")]
    assert any("running_mean" in k for k in encoder)
    assert all(torch.equal(r0["g"][k], r1["g"][k]) for k in encoder)
    head = [k for k in r0["g"] if not k.startswith("encoder.") and "running" not in k and "num_batches" not in k]
    assert head and all(torch.equal(r0["g"][k], r1["g"][k]) for k in head)
