"""``train.smoke`` (segadv/training/smoke.py): a few steps, one evaluation on a few val batches, a
checkpoint read back, and nothing kept: neither the throwaway run dir nor any file of the run dir
the config names."""

from __future__ import annotations

import logging
import os
import tempfile

import pytest

from segadv.cli import train as train_cli
from segadv.config import load_config
from segadv.training import run_data
from segadv.training.run_dir import THROWAWAY_PREFIX
from segadv.training.smoke import SMOKE_STEPS, SMOKE_VAL_BATCHES, smoke_config

from conftest import TINY_OVERRIDES

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def throwaway_parent(tmp_path, monkeypatch):
    """The system temp dir, for this test alone: what a smoke run leaves there shows."""
    parent = tmp_path / "tmp"
    parent.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    return parent


def left_behind(parent):
    """The smoke runs' own dirs in the temp dir (other libraries' caches, a compiler's or a tracker's,
    may come and go there beside them)."""
    return [name for name in os.listdir(parent) if name.startswith(THROWAWAY_PREFIX)]


def smoke(run_dir, *extra):
    return train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES,
                           "data.synthetic.val_size=20", "train.smoke=true", *extra])


def test_a_smoke_run_trains_evaluates_a_few_batches_reads_its_checkpoint_back_and_keeps_nothing(
        tmp_path, throwaway_parent, monkeypatch, caplog):
    scored = []
    evaluate = run_data.evaluate

    def counting(model, loader, *args, **kwargs):
        batches = list(loader)
        scored.append(sum(len(labels) for _, labels in batches))
        return evaluate(model, batches, *args, **kwargs)

    monkeypatch.setattr(run_data, "evaluate", counting)
    with caplog.at_level(logging.INFO):
        assert smoke(tmp_path / "run") == 0
    lines = [r.getMessage() for r in caplog.records]
    assert not (tmp_path / "run").exists() and left_behind(throwaway_parent) == []
    assert [line.split(" loss_seg")[0] for line in lines if line.startswith("step ") and "loss_seg" in line] == \
        [f"step {step}/{SMOKE_STEPS}" for step in range(1, SMOKE_STEPS + 1)]  # every step logged
    assert scored == [SMOKE_VAL_BATCHES * 4]  # data.val_batch_size=4: 8 of the 20 val samples, once
    assert any(line.startswith("checkpoint read back: last.pt restores the run at step 2") for line in lines)
    assert lines[-1].startswith(f"smoke run: {SMOKE_STEPS} steps and one evaluation (val mIoU ") and \
        lines[-1].endswith("nothing kept")


def test_a_smoke_run_on_a_runs_dir_leaves_every_file_of_it_as_it_was(tmp_path, throwaway_parent):
    run = tmp_path / "run"
    files = {"config.yaml": b"train: {max_steps: 9}\n", "metrics.jsonl": b'{"step": 1}\n', "train.log": b"x\n",
             "status.json": b"{}\n", "checkpoints/last.pt": b"weights", "checkpoints/best.json": b"{}\n"}
    for name, data in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)
    before = {p: (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns) for p in [run, *run.rglob("*")]}
    assert smoke(run) == 0
    assert {p: (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in [run, *run.rglob("*")]} == before
    assert left_behind(throwaway_parent) == []


def test_a_smoke_run_stopped_early_says_so_and_points_at_nothing(tiny_cfg, throwaway_parent, caplog):
    from segadv.training import loop

    tiny_cfg.train.smoke = True
    with caplog.at_level(logging.INFO):
        result = loop.train(tiny_cfg, stop_at=1)  # as a signal would stop it, at a step's end
    lines = [r.getMessage() for r in caplog.records]
    assert (result.stopped_by, result.step) == ("stop_at", 1)
    assert lines[-1] == "smoke run: stopped (stop_at) at step 1; nothing kept"
    assert not any("resume with" in line for line in lines)  # its run dir is gone: nothing to resume
    assert left_behind(throwaway_parent) == [] and not os.path.exists(tiny_cfg.run_dir)


def test_a_smoke_run_resumes_nothing(tmp_path, throwaway_parent, capsys):
    assert smoke(tmp_path / "run", "--resume", "auto") == 2
    assert "train.smoke: a smoke run starts fresh and keeps nothing" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and left_behind(throwaway_parent) == []


def test_the_smoke_config_is_the_run_cut_short(tmp_path):
    cfg = load_config(None, ["log.wandb.enabled=true", "log.mlflow.enabled=true", "train.smoke=true",
                             "checkpoint.keep_best=2"])
    cut = smoke_config(cfg, tmp_path)
    assert (cut.train.max_steps, cut.train.eval_every, cut.train.log_every) == (SMOKE_STEPS, SMOKE_STEPS, 1)
    assert cut.checkpoint.every > SMOKE_STEPS and cut.checkpoint.keep_best == 2  # last.pt at the end alone
    assert not cut.log.wandb.enabled and not cut.log.mlflow.enabled and cut.run_dir == str(tmp_path)
    assert cfg.train.max_steps == load_config(None, []).train.max_steps  # the config given is left as it was
    assert (cut.model, cut.data, cut.method) == (cfg.model, cfg.data, cfg.method)
    described = type(cfg.train).model_fields["smoke"].description  # --help-config's line says the same
    assert f"{SMOKE_STEPS} steps" in described and f"at most {SMOKE_VAL_BATCHES} val batches" in described
