"""Runs that go wrong stop cleanly and lose nothing: divergence, a failed write, a run dir that is
unwritable or too small (docs/failures.md)."""

import contextlib
import errno
import io
import json
import logging
import math
import os
import re
import shutil

import pytest
import torch

from segadv import fsutil
from segadv.cli import train as train_cli
from segadv.training import session as run_session
from segadv.checkpoint import read_checkpoint
from segadv.checkpoint.state import nonfinite_entries
from segadv.data.streams import Stream
from segadv.errors import EXIT_DIVERGED, EXIT_WRITE_FAILED, Diverged, UserError, WriteFailed
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from helpers import per_step_losses, records, resume_cfg


def nan_batch_at(monkeypatch, step):
    """The labeled batch of ``step`` arrives with NaN images (a corrupt sample)."""
    original = Stream.next

    def next_batch(self):
        batch = original(self)
        if self.drawn == step:
            batch = (torch.full_like(batch[0], math.nan), *batch[1:])
        return batch

    monkeypatch.setattr(Stream, "next", next_batch)


def assert_finite(path):
    assert nonfinite_entries(read_checkpoint(path)) == []


@pytest.mark.parametrize("log_every", [1, 100])  # caught at its log step; caught before the save at 6
def test_a_nan_batch_stops_the_run_before_anything_non_finite_is_saved(tmp_path, monkeypatch, log_every):
    cfg = resume_cfg(tmp_path, "nan", "train.max_steps=8", "checkpoint.every=2", "checkpoint.keep_last=1",
                     "train.eval_every=2", f"train.log_every={log_every}")
    nan_batch_at(monkeypatch, 5)
    with pytest.raises(Diverged) as raised:
        train(cfg)
    ckpt_dir = tmp_path / "nan" / "checkpoints"
    where = "step 5" if log_every == 1 else "steps 5-6"
    assert re.match(rf"training diverged: train/loss_seg = nan, .* in {where} \(train.on_nonfinite: stop\)",
                    str(raised.value))
    assert f"the last complete checkpoint is {ckpt_dir / 'last.pt'} (step 4" in str(raised.value)
    # keep_last: 1 kept the newest finite checkpoint; nothing of step 5 or later was written.
    assert sorted(p.name for p in ckpt_dir.glob("*.pt")) == ["best.pt", "last.pt", "step_4.pt"]
    for name in ("best.pt", "last.pt", "step_4.pt"):
        assert_finite(ckpt_dir / name)
    assert read_checkpoint(ckpt_dir / "last.pt")["step"] == 4

    monkeypatch.undo()
    resumed = train(cfg, resume="auto")
    assert resumed.step == 8 and read_checkpoint(ckpt_dir / "last.pt")["step"] == 8
    assert_finite(ckpt_dir / "last.pt")


def test_non_finite_weights_are_never_saved(tmp_path, monkeypatch):
    """A NaN that reaches the weights but not (yet) a logged loss: the save refuses it."""
    cfg = resume_cfg(tmp_path, "weights", "train.max_steps=6", "checkpoint.every=2", "train.log_every=100",
                     "train.eval_every=100")
    original = run_session.build_training

    def build_with_a_poisoned_step(*args, **kwargs):
        parts = original(*args, **kwargs)
        step_d, steps = parts.d.opt.step, {"n": 0}

        def poisoned_step():
            step_d()
            steps["n"] += 1
            if steps["n"] == 4:  # D's fourth update leaves an infinite weight; no loss has seen it yet
                with torch.no_grad():
                    next(parts.d.bare.parameters()).fill_(math.inf)

        parts.d.opt.step = poisoned_step
        return parts

    monkeypatch.setattr(run_session, "build_training", build_with_a_poisoned_step)
    with pytest.raises(Diverged, match=r"non-finite values in discriminator at step 4, so no checkpoint of it was "
                                       r"written; the last complete checkpoint is .*last\.pt \(step 2"):
        train(cfg)
    assert read_checkpoint(tmp_path / "weights" / "checkpoints" / "last.pt")["step"] == 2


def test_skip_step_skips_non_finite_updates_and_counts_them(tmp_path, monkeypatch):
    cfg = resume_cfg(tmp_path, "skip", "train.max_steps=4", "checkpoint.every=2", "train.log_every=1",
                     "train.eval_every=100", "train.on_nonfinite=skip_step")
    original = run_session.build_training

    def build_with_a_nan_output(*args, **kwargs):
        parts = original(*args, **kwargs)
        forwards = {"n": 0}

        def nan_at_third_training_forward(module, inputs, output):
            if module.training:
                forwards["n"] += 1
                if forwards["n"] == 3:
                    return output * math.nan
            return output

        parts.g.bare.segmentation_head.register_forward_hook(nan_at_third_training_forward)
        return parts

    monkeypatch.setattr(run_session, "build_training", build_with_a_nan_output)
    result = train(cfg)
    assert result.step == 4
    logged = {r["step"]: r for r in records(result.run_dir) if "train/loss_seg" in r}
    assert math.isnan(logged[3]["train/loss_seg"]) and math.isfinite(logged[4]["train/loss_seg"])
    assert [logged[s]["train/skipped_steps/generator"] for s in (1, 2, 3, 4)] == [0, 0, 1, 1]
    assert [logged[s]["train/skipped_steps/discriminator"] for s in (1, 2, 3, 4)] == [0, 0, 1, 1]
    assert_finite(result.run_dir / "checkpoints" / "last.pt")


def fail_second_checkpoint_write(monkeypatch, err=errno.ENOSPC):
    """The second write of last.pt hits a full disk (at fsync, after the data: the worst moment)."""
    from segadv.checkpoint import io

    real_write, real_fsync, calls = io.atomic_write_bytes, fsutil.os.fsync, {"last.pt": 0}

    def failing_fsync(fd):
        raise OSError(err, os.strerror(err))

    def write(path, data):
        calls[path.name] = calls.get(path.name, 0) + 1
        if path.name == "last.pt" and calls["last.pt"] == 2:
            monkeypatch.setattr(fsutil.os, "fsync", failing_fsync)
        try:
            real_write(path, data)
        finally:
            monkeypatch.setattr(fsutil.os, "fsync", real_fsync)

    monkeypatch.setattr(io, "atomic_write_bytes", write)


def test_a_full_disk_at_the_second_save_stops_with_the_first_intact_and_resumable(tmp_path, monkeypatch):
    full = train(resume_cfg(tmp_path, "full"))  # 6 steps, checkpoints at 3 and 6
    cfg = resume_cfg(tmp_path, "disk")
    fail_second_checkpoint_write(monkeypatch)
    with pytest.raises(WriteFailed) as raised:
        train(cfg)
    ckpt_dir = tmp_path / "disk" / "checkpoints"
    # The final evaluation's best.pt (step 6) was written just before: the newest complete checkpoint.
    assert str(raised.value) == (f"cannot write {ckpt_dir / 'last.pt'}: No space left on device (ENOSPC); the last "
                                 f"complete checkpoint is {ckpt_dir / 'best.pt'} (step 6; resume: --resume "
                                 f"{ckpt_dir / 'best.pt'})")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["best.json", "best.pt", "last.pt", "step_3.pt"]  # no temp
    assert read_checkpoint(ckpt_dir / "last.pt")["step"] == 3

    monkeypatch.undo()
    resumed = train(cfg, resume="auto")
    assert resumed.step == 6
    assert per_step_losses(resumed.run_dir) == per_step_losses(full.run_dir)  # bitwise


def test_cli_a_full_disk_is_one_message_and_exit_4(tmp_path, monkeypatch, capsys):
    fail_second_checkpoint_write(monkeypatch, errno.EIO)
    code = train_cli.main(["--run-dir", str(tmp_path / "r"), "--device-map", "cpu", *TINY_OVERRIDES,
                           "log.tensorboard=false", "checkpoint.every=1", "train.max_steps=3"])
    err = capsys.readouterr().err
    assert code == EXIT_WRITE_FAILED == 4
    # best.pt of the evaluation at step 2 is the newest complete checkpoint, named by its path.
    assert re.search(r"^error: cannot write .*last\.pt: Input/output error \(EIO\); the last complete checkpoint is "
                     r"(.*best\.pt) \(step 2; resume: --resume \1\)$", err, re.M), err
    assert "Traceback" not in err


def test_a_metrics_write_failure_names_the_file_and_the_last_checkpoint(tmp_path, monkeypatch):
    from segadv.monitor import writer

    cfg = resume_cfg(tmp_path, "metrics", "train.max_steps=4", "checkpoint.every=2", "train.log_every=1")
    real = writer.MetricWriter.scalars

    def scalars(self, step, values):
        if step == 3:
            self._jsonl = open(os.devnull, "rb", buffering=0)  # writing to it fails as a revoked permission would
        real(self, step, values)

    monkeypatch.setattr(writer.MetricWriter, "scalars", scalars)
    with pytest.raises(WriteFailed, match=r"cannot write .*metrics\.jsonl: .*the last complete checkpoint is "
                                          r".*last\.pt \(step 2"):
        train(cfg)


def test_cli_a_diverging_run_is_one_message_and_exit_3(tmp_path, capsys):
    run_dir = tmp_path / "r"
    code = train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES, "log.tensorboard=false",
                           "train.max_steps=30", "checkpoint.every=10", "train.log_every=10", "train.eval_every=100",
                           "optim.generator.lr=100", "optim.discriminator.lr=100"])
    err = capsys.readouterr().err
    assert code == EXIT_DIVERGED == 3
    # lr=100 (the schema's ceiling) makes a loss or the optimizer state non-finite within the first 10 steps;
    # either is caught before a checkpoint could hold it.
    assert re.search(r"^error: training diverged: (train/loss_\w+ = nan.* in steps 1-10 \(train.on_nonfinite: stop\)|"
                     r"non-finite values in optim_\w+ at step 10, so no checkpoint of it was written); "
                     r"no checkpoint was written before it\.?$", err, re.M), err
    assert "Traceback" not in err
    assert not (run_dir / "checkpoints" / "last.pt").exists()
    status = json.loads((run_dir / "status.json").read_text())  # how the run ended, for scripts
    assert (status["outcome"], status["exit_code"], status["step"]) == ("diverged", 3, 10)
    assert err.strip().endswith(status["error"])


def test_an_unwritable_run_dir_is_refused_before_the_first_step(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cfg = resume_cfg(tmp_path, "unused")
    cfg.run_dir = str(blocker / "run")
    with pytest.raises(UserError, match=r"cannot write to run dir .*file/run: Not a directory"):
        train(cfg)

    from segadv.checkpoint import manager

    monkeypatch.setattr(manager, "unwritable", lambda directory: "Read-only file system")
    cfg = resume_cfg(tmp_path, "readonly")
    with pytest.raises(UserError, match=r"cannot write checkpoints to .*readonly/checkpoints: Read-only file system"):
        train(cfg)
    assert not (tmp_path / "readonly" / "metrics.jsonl").exists()  # no step was taken


def test_a_run_dir_too_small_for_the_checkpoints_is_refused_or_forced(tmp_path, monkeypatch, caplog):
    from collections import namedtuple

    from segadv.checkpoint import manager

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(manager.shutil, "disk_usage", lambda path: usage(2**30, 2**30 - 2**20, 2**20))
    cfg = resume_cfg(tmp_path, "small", "train.max_steps=4", "checkpoint.every=2", "checkpoint.keep_last=2")
    with pytest.raises(UserError) as raised:
        train(cfg)
    message = str(raised.value)
    match = re.search(r"5 files of about ([\d.]+) MiB \(2 step_<N>\.pt kept by checkpoint\.keep_last=2, last\.pt, "
                      r"best\.pt, one temp file\) need ([\d.]+) MiB, and 1\.0 MiB are free", message)
    assert match, message
    assert not (tmp_path / "small" / "metrics.jsonl").exists()

    with caplog.at_level("WARNING"):
        assert train(cfg, force=True).step == 4
    assert "going on (--force)" in caplog.text
    # The estimate is the size of a checkpoint of the run once it has stepped.
    actual = (tmp_path / "small" / "checkpoints" / "last.pt").stat().st_size / 2**20
    assert float(match.group(1)) == pytest.approx(actual, rel=0.05)


def test_cli_ddp_every_rank_stops_on_divergence_with_exit_3(tmp_path):
    import subprocess
    import sys

    run_dir = tmp_path / "ddp"
    result = subprocess.run(
        [sys.executable, "-m", "segadv.cli.train", "--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES,
         "log.tensorboard=false", "train.max_steps=30", "checkpoint.every=10", "train.log_every=10",
         "train.eval_every=100", "optim.generator.lr=100", "optim.discriminator.lr=100", "--nproc-per-node", "2"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == EXIT_DIVERGED, result.stderr[-3000:]
    assert result.stderr.count("error: training diverged: ") == 2  # each rank, the same decision
    assert not (run_dir / "checkpoints" / "last.pt").exists()
    status = json.loads((run_dir / "status.json").read_text())  # rank 0's
    assert (status["outcome"], status["exit_code"], status["step"]) == ("diverged", 3, 10)


# ------------------------------------------------------------------ bad data found mid-run (issue 33)


def test_cli_a_sample_that_fails_to_read_mid_run_names_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    """A truncated file found at step 2 (its header read fine at start-up): one message naming the
    file and the checkpoint of step 1, no traceback."""
    from PIL import Image

    from segadv.data.files import read_image

    truncated = tmp_path / "img_7.png"
    Image.new("RGB", (64, 64), (10, 20, 30)).save(truncated)
    truncated.write_bytes(truncated.read_bytes()[:60])
    original = Stream.next

    def next_batch(self):
        if self.drawn == 1:  # the second draw reads the damaged file
            read_image(truncated)
        return original(self)

    monkeypatch.setattr(Stream, "next", next_batch)
    run_dir = tmp_path / "r"
    code = train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES, "log.tensorboard=false",
                           "checkpoint.every=1", "train.max_steps=3", "train.eval_every=100"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert re.search(rf"^error: {re.escape(str(truncated))}: cannot read image: .*; the last complete checkpoint is "
                     rf"{re.escape(str(run_dir / 'checkpoints' / 'last.pt'))} \(step 1; resume: --resume auto\)$",
                     err, re.M), err


@pytest.fixture(scope="module")
def skipped_val_run(tmp_path_factory):
    """A 2-step run on files whose val split holds 3 good images and 1 that fails to decode, under
    data.on_error: skip, and the same val split without the bad file."""
    from data_builders import make_folder, save_mask, stripes

    root = tmp_path_factory.mktemp("skipval")
    make_folder(root / "data", n_train=4, n_val=4, num_classes=3, h=32, w=32)
    # Each val mask its own mix of classes (val_003, the one a replacement would score twice, is all
    # class 1), so no prediction scores the same with val_003 counted once and twice.
    for k, values in enumerate([[0, 0, 0, 1], [1, 2, 2, 0], [2, 2, 2, 2], [1, 1, 1, 1]]):
        save_mask(root / "data" / "val" / "masks" / f"val_{k:03d}.png", stripes(values, 32, 32))
    good = root / "good"
    shutil.copytree(root / "data", good)
    for sub in ("images", "masks"):
        (good / "val" / sub / "val_002.png").unlink()
    bad = root / "data" / "val" / "images" / "val_002.png"
    bad.write_bytes(bad.read_bytes()[:200])  # header intact: found only when read
    overrides = [*TINY_OVERRIDES, "data.kind=folder", f"data.root={root / 'data'}", "data.num_classes=3",
                 "data.on_error=skip", "data.train_transforms=[]", "data.val_transforms=[]", "data.val_batch_size=2",
                 "train.max_steps=2", "log.tensorboard=false", "log.num_images=0"]
    run_dir = root / "run"
    log, logger = io.StringIO(), logging.getLogger("segadv")
    handler, level = logging.StreamHandler(log), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *overrides]) == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return run_dir, good, log.getvalue()


def eval_json(checkpoint, *overrides):
    from segadv.cli import eval as eval_cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert eval_cli.main(["--checkpoint", str(checkpoint), "--device", "cpu", "--json", *overrides]) == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_a_val_file_that_fails_to_decode_is_left_out_of_train_and_eval_scores(skipped_val_run, capsys):
    """It used to be replaced by the next good file, which was then scored twice."""
    from segadv.cli import eval as eval_cli

    run_dir, good, train_log = skipped_val_run
    last = run_dir / "checkpoints" / "last.pt"
    trained = [r for r in records(run_dir) if "val/mIoU" in r][-1]["val/mIoU"]
    assert re.search(r"step 2: val mIoU [\d.]+, pixel accuracy [\d.]+; 1 val sample skipped \(data.on_error=skip\)",
                     train_log), train_log
    good_only = eval_json(last, f"data.root={good}")
    assert good_only["skipped"] == 0
    with_bad = eval_json(last)
    assert with_bad["skipped"] == 1
    assert with_bad["mIoU"] == good_only["mIoU"] == trained  # exactly the good files' score, in train and eval
    assert eval_cli.main(["--checkpoint", str(last), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "skipped    1 val sample left out of the scores (data.on_error=skip):" in out
    assert "val/images/val_002.png: cannot read image" in out


# ---------------------------------------------------------------- files read back, the run dir's path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run of 2 steps that reached train.max_steps (copied by each test before it is damaged)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES, "log.tensorboard=false",
                           "train.max_steps=2", "train.eval_every=2"]) == 0
    return run_dir


ALIAS_BOMB = "a: &a [" + ",".join(["lol"] * 9) + "]\n" + "".join(
    f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("damage, warning", [
    ("config_deep", "config.yaml is refused: values nested deeper than 64 levels"),
    ("config_bomb", "config.yaml is refused: its aliases expand to more than 100000 values"),
    ("metrics_huge_step", "is finished: step 2"),
])
def test_resume_auto_of_a_run_dir_with_garbled_files_answers_without_a_traceback(
        finished_run, tmp_path, damage, warning, caplog, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    if damage == "config_deep":
        (run_dir / "config.yaml").write_text("x: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n")
    elif damage == "config_bomb":
        (run_dir / "config.yaml").write_text(ALIAS_BOMB)
    else:
        with open(run_dir / "metrics.jsonl", "a") as fh:
            fh.write('{"step": 1e400, "val/mIoU": 0.5}\n')
    with caplog.at_level("INFO"):
        assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert warning in caplog.text and "is finished: step 2 of train.max_steps=2" in caplog.text


def test_resume_auto_with_a_status_json_that_is_not_utf8_sets_it_aside_and_goes_on(finished_run, tmp_path, caplog):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    (run_dir / "status.json").write_bytes(b"\xff\xfe{}")
    with caplog.at_level("WARNING"):
        assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto", "train.max_steps=3"]) == 0
    assert f"{run_dir / 'status.json'} is not UTF-8 text: byte 0 is 0xff: set aside" in caplog.text
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["outcome"], status["step"], status["start_step"]) == ("finished", 3, 2)


def test_resume_auto_of_a_read_only_finished_run_needs_no_write_lock(finished_run, tmp_path, monkeypatch, caplog):
    """Tests run as root, whom a chmod does not stop: the OS's answer to the lock file is simulated."""
    from segadv.training import lock

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(run_dir)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(lock.os, "open", read_only)
    with caplog.at_level("INFO"):
        assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto"]) == 0
    assert "is finished: step 2 of train.max_steps=2" in caplog.text
    # With no lock file there either, nobody can hold it: still answered.
    monkeypatch.setattr(lock.os, "open", real_open)
    (run_dir / lock.LOCK_FILE).unlink()
    monkeypatch.setattr(lock.os, "open", read_only)
    assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto"]) == 0


@pytest.mark.parametrize("kind", ["dangling", "loop"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_run_dir_that_is_a_link_leading_nowhere_is_named(tmp_path, capsys, kind, resume):
    run_dir = tmp_path / "run"
    if kind == "dangling":
        run_dir.symlink_to(tmp_path / "gone")
        expected = f"run dir {run_dir} is a symbolic link to {tmp_path / 'gone'}, which does not exist"
    else:
        (tmp_path / "other").symlink_to(run_dir)
        run_dir.symlink_to(tmp_path / "other")
        expected = f"run dir {run_dir} is a symbolic link loop"
    argv = ["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES, "train.max_steps=1"]
    assert train_cli.main(argv + (["--resume", "auto"] if resume else [])) == 2
    err = capsys.readouterr().err
    assert expected in err and "File exists" not in err and "Traceback" not in err
    assert not (tmp_path / "gone").exists()
