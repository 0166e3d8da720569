"""segadv-train / segadv-eval from the command line: the run dir, its files, exit codes."""

import json
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from segadv import eval as eval_cli
from segadv import train as train_cli
from segadv.checkpoint import read_checkpoint

from conftest import TINY_OVERRIDES

TRAIN_TAGS = {
    "train/loss_seg", "train/loss_adv", "train/loss_d", "train/lr_g", "train/lr_d",
    "amp/scale_g", "amp/scale_d", "perf/data_time", "perf/step_time",
}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    argv = ["--run-dir", str(run_dir), "--device-map", "g:cpu,d:cpu", *TINY_OVERRIDES, "train.max_steps=5"]
    assert train_cli.main(argv) == 0
    return run_dir


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_dir_holds_config_checkpoints_and_metrics(trained_run):
    assert (trained_run / "config.yaml").is_file()
    names = sorted(p.name for p in (trained_run / "checkpoints").iterdir())
    assert names == ["best.json", "best.pt", "last.pt", "step_2.pt", "step_4.pt"]
    records = read_metrics(trained_run)
    assert all("step" in r for r in records)
    tags = set().union(*records)
    assert TRAIN_TAGS | {"val/mIoU", "val/pixel_acc"} <= tags
    assert max(r["step"] for r in records) == 5  # the final partial interval is logged too


def test_checkpoint_holds_unwrapped_weights_and_resolved_config(trained_run):
    ckpt = read_checkpoint(trained_run / "checkpoints" / "last.pt")
    assert ckpt["step"] == 5
    assert ckpt["config"]["train"]["max_steps"] == 5
    assert ckpt["config"]["model"]["generator"]["encoder"] == "mobilenet_v2"
    assert not any(k.startswith("module.") for k in ckpt["generator"])
    assert {"optimizer", "scheduler", "scaler"} <= set(ckpt["optim_generator"])


def test_tensorboard_events_are_readable(trained_run):
    events = EventAccumulator(str(trained_run / "tensorboard"))
    events.Reload()
    scalar_tags = set(events.Tags()["scalars"])
    assert TRAIN_TAGS | {"val/mIoU"} <= scalar_tags
    assert [e.step for e in events.Scalars("val/mIoU")] == [2, 4, 5]
    assert "val/input_gt_pred" in events.Tags()["images"]


def test_eval_cli_reproduces_the_final_val_metrics(trained_run, capsys):
    assert eval_cli.main(["--checkpoint", str(trained_run / "checkpoints" / "last.pt"), "--device", "cpu", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    final = [r for r in read_metrics(trained_run) if "val/mIoU" in r][-1]
    assert metrics["mIoU"] == pytest.approx(final["val/mIoU"], abs=1e-9)


def run_cli(*args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=300)


def test_missing_cuda_device_exits_2_without_traceback(tmp_path):
    result = run_cli("segadv.train", "--device-map", "g:1,d:0", "--run-dir", str(tmp_path / "r"),
                     env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2
    assert "cuda:1 requested for g, but no CUDA device is visible" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()  # nothing was written before the map was checked


@pytest.mark.parametrize(
    "args, message",
    [
        (["train.max_stpes=3"], "train.max_stpes: unknown key; did you mean 'train.max_steps'?"),
        (["data.batch_size=four"], "data.batch_size: expected int"),
        (["--config", "no/such.yaml"], "no/such.yaml"),
    ],
)
def test_config_errors_exit_2_without_traceback(tmp_path, args, message):
    result = run_cli("segadv.train", "--run-dir", str(tmp_path / "r"), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_eval_on_a_missing_checkpoint_exits_2(tmp_path):
    result = run_cli("segadv.eval", "--checkpoint", str(tmp_path / "missing.pt"))
    assert result.returncode == 2
    assert "checkpoint not found" in result.stderr and "Traceback" not in result.stderr


def test_images_g_cannot_take_exit_2_naming_the_size(tmp_path):
    # smp raises a bare RuntimeError from G's forward; the size comes from the user's transforms.
    result = run_cli("segadv.train", "--run-dir", str(tmp_path / "r"), *TINY_OVERRIDES,
                     "data.train_transforms=[{name: Resize, height: 56, width: 56}]")
    assert result.returncode == 2, result.stderr
    assert "images of 56x56 reach G, which needs height and width divisible by" in result.stderr
    assert "data.train_transforms" in result.stderr and "Traceback" not in result.stderr
