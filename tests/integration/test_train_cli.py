"""segadv-train / segadv-eval from the command line: the run dir, its files, exit codes."""

import json
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from segadv.cli import eval as eval_cli
from segadv.cli import train as train_cli
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
    result = run_cli("segadv.cli.train", "--device-map", "g:1,d:0", "--run-dir", str(tmp_path / "r"),
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
    result = run_cli("segadv.cli.train", "--run-dir", str(tmp_path / "r"), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_eval_on_a_missing_checkpoint_exits_2(tmp_path):
    result = run_cli("segadv.cli.eval", "--checkpoint", str(tmp_path / "missing.pt"))
    assert result.returncode == 2
    assert "checkpoint not found" in result.stderr and "Traceback" not in result.stderr


def test_images_g_cannot_take_exit_2_naming_the_size(tmp_path):
    # smp's forward would raise a bare RuntimeError at the first step; the start says it first,
    # from the config: the size, the key it comes from and the stride G needs.
    result = run_cli("segadv.cli.train", "--run-dir", str(tmp_path / "r"), *TINY_OVERRIDES,
                     "data.train_transforms=[{name: Resize, height: 56, width: 56}]")
    assert result.returncode == 2, result.stderr
    assert ("data.train_transforms' Resize to 56x56: 56x56 is not a multiple of the encoder's stride 16, which smp's "
            "deeplabv3plus needs (model.generator.arch=deeplabv3plus, encoder_depth=4, output_stride=16); use e.g. "
            "48x48") in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "r").exists()


# ------------------------------------------------------------------ the run dir rule (segadv/training/run_dir.py)

# A run whose data differs from the embedded default's (16 training samples, not 4000) and whose G
# does too (mobilenet_v2): a resume on the default config would train on other data.
RUN_ARGS = ["--device-map", "cpu", *TINY_OVERRIDES, "log.tensorboard=false", "train.eval_every=100"]


def hashes(*folders):
    from segadv.fsutil import file_sha256

    from segadv.training.lock import LOCK_FILE

    # The lock names its holder: taking it rewrites it (segadv/training/lock.py).
    return {p: file_sha256(p) for folder in folders for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


@pytest.fixture
def stopped_run(tmp_path):
    """A run of 2 steps out of an intended 4 (resumed with train.max_steps=4)."""
    run_dir = tmp_path / "run"
    assert train_cli.main(["--run-dir", str(run_dir), *RUN_ARGS, "train.max_steps=2"]) == 0
    return run_dir


def resumed_data(run_dir):
    ckpt = read_checkpoint(run_dir / "checkpoints" / "last.pt")
    return ckpt["step"], ckpt["config"]["data"], ckpt["data_streams"]["labeled"]["samples"]


@pytest.mark.parametrize("damage", ["deleted", "emptied", "binary"])
def test_a_resume_with_a_deleted_emptied_or_garbled_config_yaml_trains_on_the_checkpoints_data(
        stopped_run, damage, caplog):
    saved = stopped_run / "config.yaml"
    data_before = read_checkpoint(stopped_run / "checkpoints" / "last.pt")["config"]["data"]
    if damage == "deleted":
        saved.unlink()
    elif damage == "emptied":
        saved.write_text("")
    else:
        saved.write_bytes(b"\xff\xfe\x00garbage")
    with caplog.at_level("INFO"):
        assert train_cli.main(["--run-dir", str(stopped_run), "--resume", "auto", "train.max_steps=4"]) == 0
    step, data, samples = resumed_data(stopped_run)
    assert (step, data, samples) == (4, data_before, 16)  # not the default's 4000 synthetic samples
    assert "rebuilt from the config stored in" in caplog.text
    assert yaml_load(saved)["data"] == data_before  # written back
    if damage == "binary":  # set aside, not deleted
        (aside,) = stopped_run.glob("config.yaml.unreadable-*")
        assert aside.read_bytes() == b"\xff\xfe\x00garbage"


def yaml_load(path):
    import yaml

    return yaml.safe_load(path.read_text())


def test_a_config_yaml_copied_from_another_run_is_refused_naming_the_key(stopped_run, tmp_path, capsys):
    other = tmp_path / "other"
    assert train_cli.main(["--run-dir", str(other), *RUN_ARGS, "train.max_steps=1", "data.synthetic.train_size=24"]) == 0
    (stopped_run / "config.yaml").write_bytes((other / "config.yaml").read_bytes())
    before = hashes(stopped_run)
    code = train_cli.main(["--run-dir", str(stopped_run), "--resume", "auto", "train.max_steps=4"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "data.synthetic.train_size differs from the checkpoint's (16 then, 24 now)" in err
    assert hashes(stopped_run) == before


def test_a_config_copied_from_a_run_never_trains_inside_that_run(stopped_run, tmp_path, capsys, monkeypatch):
    """The issue's case: a copy carrying ``run_dir: A`` (as configs saved before run_dir was left
    out of them did), run without --run-dir: refused, A untouched. A run's own config.yaml no
    longer names its dir at all."""
    assert yaml_load(stopped_run / "config.yaml")["run_dir"] is None
    copy = tmp_path / "copy.yaml"
    copy.write_text((stopped_run / "config.yaml").read_text().replace("run_dir: null", f"run_dir: {stopped_run}"))
    before = hashes(stopped_run, tmp_path / "copy.yaml")
    code = train_cli.main(["--config", str(copy), "optim.generator.lr=5e-4"])
    err = capsys.readouterr().err
    assert code == 2 and f"run dir {stopped_run} already holds a run" in err and "--resume auto" in err
    assert hashes(stopped_run, tmp_path / "copy.yaml") == before


def test_a_fresh_start_in_a_dir_holding_a_run_is_refused_and_nothing_changes(stopped_run, capsys):
    before = hashes(stopped_run)
    code = train_cli.main(["--run-dir", str(stopped_run), *RUN_ARGS, "train.max_steps=2", "model.discriminator.ndf=4"])
    err = capsys.readouterr().err
    assert code == 2 and "already holds a run (config.yaml, metrics.jsonl, checkpoints/" in err
    assert f"segadv-train --run-dir {stopped_run} --resume auto, or start a new run in another --run-dir" in err
    assert hashes(stopped_run) == before  # no second run's steps in metrics.jsonl


def test_an_empty_run_dir_and_the_input_config_as_run_dir_are_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as raised:
        train_cli.main(["--run-dir", "", *RUN_ARGS])
    assert raised.value.code == 2 and "--run-dir: empty path" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("train:\n  max_steps: 1\n")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    before = hashes(tmp_path)
    code = train_cli.main(["--run-dir", ".", "--config", "config.yaml", *RUN_ARGS])
    err = capsys.readouterr().err
    assert code == 2 and "--run-dir . holds the input config" in err and "config.yaml, which the run would write over" in err
    assert hashes(tmp_path) == before


def test_tilde_is_expanded_in_the_run_dir_option_and_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert train_cli.main(["--run-dir", "~/a", *RUN_ARGS, "train.max_steps=1"]) == 0
    assert train_cli.main([*RUN_ARGS, "train.max_steps=1", "run_dir=~/b"]) == 0
    assert (tmp_path / "home" / "a" / "checkpoints" / "last.pt").is_file()
    assert (tmp_path / "home" / "b" / "checkpoints" / "last.pt").is_file()
    assert not (tmp_path / "~").exists()


def test_resuming_a_finished_run_reports_its_stored_score_and_trains_nothing(stopped_run, caplog, capsys):
    final = [r for r in read_metrics(stopped_run) if "val/mIoU" in r][-1]
    before = hashes(stopped_run)
    with caplog.at_level("INFO"):
        assert train_cli.main(["--run-dir", str(stopped_run), "--resume", "auto"]) == 0
    assert f"is finished: step 2 of train.max_steps=2, nothing to train; final val mIoU {final['val/mIoU']:.4f}, " \
           f"pixel accuracy {final['val/pixel_acc']:.4f}" in caplog.text
    assert "nan" not in caplog.text
    assert hashes(stopped_run) == before

    code = train_cli.main(["--run-dir", str(stopped_run), "--resume", "auto", "train.max_steps=1"])
    err = capsys.readouterr().err
    assert code == 2 and "train.max_steps=1 is below the step of" in err and "(2): nothing would train" in err
    assert hashes(stopped_run) == before


def test_after_a_resume_the_profile_counts_the_whole_run_from_the_checkpoints_clock(stopped_run, caplog):
    with caplog.at_level("INFO"):
        assert train_cli.main(["--run-dir", str(stopped_run), "--resume", "auto", "train.max_steps=4"]) == 0
    assert ("time profile (the run, steps 1-4: this process ran 3-4, the checkpoint it resumed from held the "
            "time of 1-2)") in caplog.text


def test_a_garbled_metrics_jsonl_is_exit_2_naming_it(stopped_run, capsys):
    metrics = stopped_run / "metrics.jsonl"
    metrics.write_bytes(b"\x80\x81\x82 binary\n" + metrics.read_bytes())
    before = hashes(stopped_run)
    code = train_cli.main(["--run-dir", str(stopped_run), "--resume", "auto", "train.max_steps=4"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"{metrics}: line 1 is not a metrics record" in err
    assert hashes(stopped_run) == before


def test_a_start_that_fails_leaves_no_run_dir_and_checks_the_data_before_building(tmp_path, monkeypatch, capsys):
    """Cheap checks first: a missing data root is found before any network is built (with
    ``encoder_weights: imagenet`` that build would try a download first)."""
    from segadv.training import build

    monkeypatch.setattr(build, "build_training", lambda *a, **k: pytest.fail("networks built before the checks"))
    run_dir = tmp_path / "run"
    code = train_cli.main(["--run-dir", str(run_dir), *RUN_ARGS, "data.kind=folder", f"data.root={tmp_path / 'nope'}",
                           "model.generator.encoder_weights=imagenet"])
    assert code == 2 and "data.root:" in capsys.readouterr().err
    assert not run_dir.exists()
    missing = tmp_path / "missing.pt"
    code = train_cli.main(["--run-dir", str(run_dir), *RUN_ARGS, f"init.generator.path={missing}"])
    assert code == 2 and f"init.generator.path: checkpoint not found: {missing}" in capsys.readouterr().err
    assert not run_dir.exists()


def test_a_start_that_fails_after_the_build_removes_what_it_wrote(tmp_path, monkeypatch, capsys):
    from segadv.checkpoint import manager

    monkeypatch.setattr(manager, "unwritable", lambda directory: "Read-only file system")
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    for run_dir in (tmp_path / "new", existing):
        code = train_cli.main(["--run-dir", str(run_dir), *RUN_ARGS, "train.max_steps=1"])
        assert code == 2 and "cannot write checkpoints" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]
