"""Resume: exact continuation, crash safety (SIGKILL, SIGTERM), retention, corrupt fallback."""

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from segadv.checkpoint import CheckpointManager, read_checkpoint
from segadv.errors import UserError
from segadv.training.lock import RunDirLock
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from helpers import LOSSES, per_step_losses, records, resume_cfg, stream_positions


@pytest.mark.parametrize("workers, accumulation", [(0, 1), (2, 1), (0, 2)])
def test_stopped_and_resumed_run_equals_uninterrupted_run(tmp_path, workers, accumulation):
    """2N steps in one go vs N steps, stop, resume for N more: identical per-step losses (bitwise).
    With train.accumulation_steps, a stop and a checkpoint fall between optimizer steps."""
    extra = [f"data.num_workers={workers}"]
    if accumulation > 1:  # two micro-batches of 2 (one sample could not train the ASPP pooling's BatchNorm)
        extra += ["data.batch_size=4", f"train.accumulation_steps={accumulation}"]
    full = train(resume_cfg(tmp_path, "full", *extra))
    assert full.step == 6 and full.stopped_by is None

    first = train(resume_cfg(tmp_path, "split", *extra), stop_at=4)  # mid-epoch: 8 batches/epoch
    assert (first.step, first.stopped_by) == (4, "stop_at")
    second = train(resume_cfg(tmp_path, "split", *extra), resume="auto")
    assert second.step == 6

    expected, got = per_step_losses(full.run_dir), per_step_losses(second.run_dir)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]  # appended, no step twice
    assert got == expected  # bitwise: JSON floats round-trip exactly
    assert [r["step"] for r in records(second.run_dir) if "train/loss_seg" in r].count(4) == 1


@pytest.mark.cuda
def test_stopped_and_resumed_run_on_cuda_equals_uninterrupted_run(tmp_path):
    """The same on a GPU (train.deterministic): the CUDA RNG state, the device-resident optimizer
    state and the stream positions restored exactly; every step's losses bitwise equal."""
    def on_cuda(name):
        cfg = resume_cfg(tmp_path, name)
        cfg.device_map = "g:cuda:0,d:cuda:0"
        return cfg

    full = train(on_cuda("full"))
    first = train(on_cuda("split"), stop_at=4)
    assert (first.step, first.stopped_by) == (4, "stop_at")
    second = train(on_cuda("split"), resume="auto")
    assert second.step == 6
    assert per_step_losses(second.run_dir) == per_step_losses(full.run_dir)


SEMI_LOSSES = (*LOSSES, "train/loss_semi", "train/loss_semi_adv", "train/semi_pixel_ratio")


@pytest.mark.parametrize("workers", [0, 2])
def test_advsemiseg_resumes_each_of_its_three_streams_exactly(tmp_path, workers):
    """AdvSemiSeg draws labeled, unlabeled (from step 2 on only) and gt batches, each stream with
    its own epoch length; 7 steps in one go equal 5 + resume + 2, bitwise."""
    extra = [f"data.num_workers={workers}", "train.max_steps=7", "method.name=advsemiseg",
             "data.labeled_fraction=0.5", "method.advsemiseg.unlabeled_batch_size=3",
             "method.advsemiseg.semi_start_adv=2", "method.advsemiseg.semi_start=3",
             "method.advsemiseg.mask_threshold=0.5"]
    full = train(resume_cfg(tmp_path, "full", *extra))
    first = train(resume_cfg(tmp_path, "split", *extra), stop_at=5)  # mid-epoch in every stream
    ckpt = read_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")
    assert stream_positions(ckpt) == {"labeled": 5, "unlabeled": 3, "gt": 5}
    second = train(resume_cfg(tmp_path, "split", *extra), resume="auto")
    assert (full.step, first.step, second.step) == (7, 5, 7)
    expected, got = per_step_losses(full.run_dir, SEMI_LOSSES), per_step_losses(second.run_dir, SEMI_LOSSES)
    assert sorted(got) == list(range(1, 8))
    assert got == expected
    assert expected[7][3] != 0  # the self-training term was on


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path, caplog):
    with caplog.at_level("INFO"):
        result = train(resume_cfg(tmp_path, "fresh", "train.max_steps=2"), resume="auto")
    assert result.step == 2 and "starting fresh" in caplog.text


def test_retention_keeps_newest_and_last(tmp_path):
    cfg = resume_cfg(tmp_path, "keep", "train.max_steps=5", "checkpoint.every=1", "checkpoint.keep_last=2")
    train(cfg)
    names = sorted(p.name for p in (tmp_path / "keep" / "checkpoints").iterdir())
    assert names == ["best.json", "best.pt", "last.pt", "step_4.pt", "step_5.pt"]  # best: the final evaluation


def test_corrupt_newest_checkpoints_fall_back_to_previous(tmp_path, caplog):
    cfg = resume_cfg(tmp_path, "corrupt", "train.max_steps=4", "checkpoint.every=2")
    train(cfg)
    ckpt_dir = tmp_path / "corrupt" / "checkpoints"
    for name in ("last.pt", "step_4.pt"):
        data = (ckpt_dir / name).read_bytes()
        (ckpt_dir / name).write_bytes(data[: len(data) // 3])  # as a crash mid-write would (without atomicity)
    with caplog.at_level("WARNING"):
        path, ckpt = CheckpointManager(tmp_path / "corrupt", every=2).newest_loadable()
    assert path.name == "step_2.pt" and ckpt["step"] == 2
    assert "last.pt is truncated or corrupt" in caplog.text and "step_4.pt" in caplog.text


# ------------------------------------------------------------------------- real processes


def cli(run_dir, *extra):
    return [sys.executable, "-m", "segadv.cli.train", "--run-dir", str(run_dir), "--device-map", "cpu",
            *TINY_OVERRIDES, "log.tensorboard=false", *extra]


def wait_for_step(run_dir, step, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"the run ended early with exit code {proc.returncode}"
        path = run_dir / "metrics.jsonl"
        if path.is_file() and any(r.get("step", 0) >= step for r in records(run_dir)):
            return
        time.sleep(0.2)
    raise TimeoutError(f"step {step} not reached")


def test_sigterm_saves_and_exits_0_then_resume_finishes(tmp_path):
    run_dir = tmp_path / "term"
    log_path = tmp_path / "term.log"  # a file, not a pipe: an unread pipe fills and blocks the run
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cli(run_dir, "train.max_steps=400", "train.log_every=1", "checkpoint.every=1000"),
                                stdout=log_file, stderr=subprocess.STDOUT, text=True)
        wait_for_step(run_dir, 2, proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    err = log_path.read_text()
    assert proc.returncode == 0, err[-2000:]
    assert "resume with: segadv-train --run-dir" in err
    stopped = read_checkpoint(run_dir / "checkpoints" / "last.pt")["step"]
    assert 2 <= stopped < 400
    status = json.loads((run_dir / "status.json").read_text())  # exit 0, but not finished
    assert (status["outcome"], status["stopped_by"], status["step"], status["exit_code"]) == (
        "stopped", "SIGTERM", stopped, 0)

    done = subprocess.run(cli(run_dir, f"train.max_steps={stopped + 2}", "--resume", "auto"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resumed from {run_dir / 'checkpoints'}" in done.stderr
    assert read_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == stopped + 2
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["outcome"], status["start_step"], status["step"]) == ("finished", stopped, stopped + 2)


def test_sigkill_at_random_moments_never_loses_the_run(tmp_path):
    run_dir = tmp_path / "kill"
    rng = random.Random(0)
    args = cli(run_dir, "train.max_steps=12", "checkpoint.every=2", "train.log_every=1", "train.eval_every=100",
               "--resume", "auto")
    for _ in range(3):
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(4.0, 8.0))  # somewhere in start-up, a step or a checkpoint write
        proc.kill()
        proc.wait()
        found = CheckpointManager(run_dir, every=2).newest_loadable()
        if found is not None:  # killed after the first save: it must load
            assert found[1]["step"] % 2 == 0 or found[0].name == "last.pt"
        leftovers = [p.name for p in (run_dir / "checkpoints").glob(".*tmp*")] if (run_dir / "checkpoints").exists() else []
        for name in leftovers:  # a temp file a kill left behind is never mistaken for a checkpoint
            assert not name.endswith(".pt")
    final = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]
    assert read_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == 12
    steps = [r["step"] for r in records(run_dir) if "train/loss_seg" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 12  # no step logged twice


# ------------------------------------------------------------------------- a changed config


def lrs(run_dir):
    return {r["step"]: r["train/lr_g"] for r in records(run_dir) if "train/lr_g" in r}


def test_resume_with_a_longer_horizon_follows_the_new_poly_schedule(tmp_path, caplog):
    """The schedule used to come back with the old horizon: the extra steps trained at LR 0."""
    train(resume_cfg(tmp_path, "grow", "train.max_steps=4", "checkpoint.every=2"))
    with caplog.at_level("INFO"):
        result = train(resume_cfg(tmp_path, "grow", "train.max_steps=8", "checkpoint.every=2"), resume="auto")
    assert result.step == 8 and "horizon 4 steps in the checkpoint, 8 now" in caplog.text
    cfg = resume_cfg(tmp_path, "grow", "train.max_steps=8")
    base, power = cfg.optim.generator.lr, cfg.optim.generator.poly_power
    logged = lrs(tmp_path / "grow")
    # Logged at step s: the LR step s used, base * (1 - (s - 1)/8) ** power (step 1 at the base LR).
    for step in (5, 6, 7, 8):
        assert logged[step] > 0
        assert logged[step] == pytest.approx(base * (1 - (step - 1) / 8) ** power, rel=1e-9)


def test_auto_resume_after_a_rewind_never_picks_the_abandoned_future(tmp_path):
    def cfg():
        return resume_cfg(tmp_path, "rewind", "train.max_steps=8", "checkpoint.every=2", "checkpoint.keep_last=3")

    ckpt_dir = tmp_path / "rewind" / "checkpoints"
    train(cfg(), stop_at=6)
    rewound = train(cfg(), resume=str(ckpt_dir / "step_2.pt"), stop_at=4)  # rewind to 2: 4 and 6 abandoned
    assert rewound.step == 4
    assert sorted(p.name for p in ckpt_dir.glob("*.pt")) == ["last.pt", "step_2.pt", "step_4.pt"]
    (first_archive,) = (ckpt_dir / "abandoned").iterdir()
    assert sorted(p.name for p in first_archive.iterdir()) == ["last.pt", "step_4.pt", "step_6.pt"]

    train(cfg(), resume="auto")  # on to 8: step_4, step_6, step_8 kept
    rewound = train(cfg(), resume=str(ckpt_dir / "step_4.pt"), stop_at=6)  # rewind to 4, preempted at 6
    assert rewound.step == 6 and not (ckpt_dir / "step_8.pt").exists()
    assert not (ckpt_dir / "best.pt").exists()  # written at step 8: abandoned with it
    resumed = train(cfg(), resume="auto", stop_at=7)
    assert resumed.step == 7  # not 8
    assert read_checkpoint(ckpt_dir / "last.pt")["step"] == 7
    assert sorted(p.name for p in ckpt_dir.glob("step_*.pt")) == ["step_4.pt", "step_6.pt"]
    assert len(list((ckpt_dir / "abandoned").iterdir())) == 2  # nothing deleted


@pytest.mark.parametrize("net", ["generator", "discriminator"])
def test_float16_switched_on_or_off_at_resume_starts_the_scaler_fresh(tmp_path, caplog, net):
    fp16 = [f"amp.{net}.enabled=true", f"amp.{net}.dtype=float16"]
    train(resume_cfg(tmp_path, "on", "train.max_steps=2", "checkpoint.every=2"))
    with caplog.at_level("INFO"):
        assert train(resume_cfg(tmp_path, "on", "train.max_steps=4", *fp16), resume="auto").step == 4
    assert "was off in the checkpoint: the GradScaler starts fresh" in caplog.text

    train(resume_cfg(tmp_path, "off", "train.max_steps=2", "checkpoint.every=2", *fp16))
    caplog.clear()
    with caplog.at_level("INFO"):
        assert train(resume_cfg(tmp_path, "off", "train.max_steps=4"), resume="auto").step == 4
    assert "loss scaling is off now" in caplog.text


@pytest.mark.parametrize("change,message", [
    ("data.batch_size=4", r"data.batch_size differs from the checkpoint's \(2 then, 4 now\).* resume with data.batch_size=2"),
    ("train.seed=7", r"train.seed differs from the checkpoint's \(0 then, 7 now\).* resume with train.seed=0"),
])
def test_a_changed_data_order_at_resume_is_refused_naming_the_key(tmp_path, change, message):
    """A stream's position is a count of batches in an epoch order drawn from the seed: at another
    batch size or seed it points elsewhere in the data, so the resume is refused before anything
    is written."""
    first = train(resume_cfg(tmp_path, "bs", "train.max_steps=2"))
    before = (first.run_dir / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(UserError, match=message):
        train(resume_cfg(tmp_path, "bs", "train.max_steps=4", change), resume="auto")
    assert (first.run_dir / "checkpoints" / "last.pt").read_bytes() == before


def test_a_run_dir_in_use_is_refused_naming_its_holder_and_free_again_after(tmp_path):
    cfg = resume_cfg(tmp_path, "busy", "train.max_steps=1")
    with RunDirLock(Path(cfg.run_dir)):
        with pytest.raises(UserError, match=rf"run dir .*busy is in use by pid {os.getpid()} on host "
                                            rf"{re.escape(socket.gethostname())} since"):
            train(cfg)
    assert not (Path(cfg.run_dir) / "metrics.jsonl").exists()
    assert train(cfg).step == 1  # the holder has let go


def test_a_finished_run_whose_last_pt_is_corrupt_ends_naming_the_step_file_it_fell_back_to(tmp_path, caplog):
    """issue 40: the run-end line named last.pt (final) after a fallback from a corrupt last.pt;
    now it names the step file, and nothing is moved or trained."""
    cfg = resume_cfg(tmp_path, "fallback", "train.max_steps=4", "checkpoint.every=2")
    train(cfg)
    ckpt_dir = tmp_path / "fallback" / "checkpoints"
    data = (ckpt_dir / "last.pt").read_bytes()
    (ckpt_dir / "last.pt").write_bytes(data[: len(data) // 3])
    with caplog.at_level("INFO"):
        result = train(cfg, resume="auto")
    assert result.step == 4 and result.val_metrics["mIoU"] == result.best["mIoU"]  # its final evaluation: the best
    assert f"(checkpoint: {ckpt_dir / 'step_4.pt'})" in caplog.text and "nothing to train" in caplog.text
    assert not (ckpt_dir / "abandoned").exists() and (ckpt_dir / "last.pt").read_bytes() == data[: len(data) // 3]
