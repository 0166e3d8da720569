"""A run dir where a checkpoint is taken: its best checkpoint (segadv-eval, segadv-export,
segadv-predict, segadv-ckpt inspect and convert: the one loader), said in one line; without best.pt
its last.pt; without either, exit 2 naming what is missing."""

import json
import logging
import shutil

import pytest

from segadv.cli import ckpt as ckpt_cli
from segadv.cli import eval as eval_cli
from segadv.cli import predict as predict_cli
from segadv.cli import export as export_cli
from segadv.checkpoint.inference import load_generator, read_files
from segadv.checkpoint.run_checkpoint import checkpoint_of_run
from segadv.data import class_names
from segadv.errors import UserError
from segadv.training.loop import train


def test_what_a_directory_stands_for(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("best.pt", "last.pt"):
        (run / "checkpoints" / name).write_bytes(b"")
    (run / "checkpoints" / "best.json").write_text('{"step": 20, "mIoU": 0.5}\n')
    found = checkpoint_of_run(run)
    assert found.path == run / "checkpoints" / "best.pt"
    assert found.note == f"run dir {run}: its best checkpoint, {found.path} (step 20, val mIoU 0.5000, per best.json)"
    (run / "checkpoints" / "best.pt").unlink()
    found = checkpoint_of_run(run)
    assert found.path == run / "checkpoints" / "last.pt" and "no best.pt (the run made no evaluation)" in found.note
    (run / "checkpoints" / "last.pt").unlink()
    with pytest.raises(UserError, match=r"has neither checkpoints/best.pt nor checkpoints/last.pt"):
        checkpoint_of_run(run)
    shutil.rmtree(run / "checkpoints")
    (run / "config.yaml").write_text("")
    with pytest.raises(UserError, match=r"has no checkpoints/ directory: the run wrote no checkpoint"):
        checkpoint_of_run(run)
    smp = tmp_path / "smp"  # not a run dir: left to the smp directory reader
    smp.mkdir()
    (smp / "config.json").write_text("{}")
    assert checkpoint_of_run(smp) is None and checkpoint_of_run(run / "config.yaml") is None


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from segadv.config import load_config

    from conftest import TINY_OVERRIDES

    cfg = load_config(None, [*TINY_OVERRIDES, "train.max_steps=2", "log.tensorboard=false"])
    cfg.run_dir, cfg.device_map = str(tmp_path_factory.mktemp("best") / "run"), "cpu"
    return train(cfg), cfg


def test_eval_of_a_run_dir_is_its_best_checkpoint_with_classes_by_name(trained, capsys, caplog):
    result, cfg = trained
    best = result.run_dir / "checkpoints" / "best.pt"
    with caplog.at_level(logging.INFO, logger="segadv"):
        assert eval_cli.main(["--checkpoint", str(result.run_dir), "--device", "cpu", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert f"run dir {result.run_dir}: its best checkpoint, {best} (step 2" in caplog.text
    assert metrics["checkpoint"] == str(best) and metrics["step"] == 2
    assert list(metrics["iou"]) == list(class_names(cfg.data))
    assert metrics["mIoU"] == pytest.approx(result.val_metrics["mIoU"], abs=1e-9)
    assert [metrics["iou"][name] for name in class_names(cfg.data)] == [
        v if v == v else None for v in result.val_metrics["iou"]]
    assert all(name in class_names(cfg.data) for name in metrics["absent_classes"])


def test_ckpt_inspect_of_a_run_dir(trained, capsys, caplog, tmp_path):
    result, _ = trained
    with caplog.at_level(logging.INFO, logger="segadv.cli.ckpt"):
        assert ckpt_cli.main(["inspect", str(result.run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"file:      {result.run_dir / 'checkpoints' / 'best.pt'}" in out and "step:      2" in out
    assert "its best checkpoint" in caplog.text
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "status.json").write_text("{}")
    assert ckpt_cli.main(["inspect", str(empty)]) == 2
    assert f"run dir {empty} has no checkpoints/ directory" in capsys.readouterr().err


def test_every_loader_command_takes_a_run_dir_as_its_best_checkpoint(trained, tmp_path, caplog):
    """The loader export, predict and convert share resolves a run dir as eval does, and a run dir's
    best checkpoint counts among the inputs no output may replace."""
    result, cfg = trained
    best = result.run_dir / "checkpoints" / "best.pt"
    with caplog.at_level(logging.INFO, logger="segadv"):
        loaded = load_generator(result.run_dir)
    assert loaded.checkpoint == best and loaded.step == 2 and "its best checkpoint" in caplog.text
    assert read_files(result.run_dir) == [("--checkpoint", str(best))]
    out = tmp_path / "g.ts"
    assert export_cli.main(["--checkpoint", str(result.run_dir), "--output", str(out), "--format", "torchscript"]) == 0
    source = json.loads(out.with_name("g.ts.json").read_text())["source"]
    assert out.is_file() and (source["checkpoint"], source["step"]) == (str(best), 2)
    assert export_cli.main(["--checkpoint", str(result.run_dir), "--output", str(best), "--format", "torchscript"]) == 2
    image = tmp_path / "in" / "a.png"
    image.parent.mkdir()
    from PIL import Image
    Image.new("RGB", (cfg.data.synthetic.image_size,) * 2, (90, 120, 30)).save(image)
    assert predict_cli.main(["--checkpoint", str(result.run_dir), "--input", str(image.parent),
                             "--output", str(tmp_path / "masks"), "--device", "cpu"]) == 0
    assert (tmp_path / "masks" / "a.png").is_file()


@pytest.mark.parametrize("record,why", [
    ({"step": 20, "mIoU": 0.5, "by": "bogus", "score": 0.1}, "its by 'bogus' is not a score checkpoint.best_by"),
    ({"step": 20, "mIoU": 7.0}, "its mIoU 7.0 is not a score in 0..1"),
    ({"step": 20, "mIoU": 0.5, "by": "proxy/entropy"}, "its score None (by proxy/entropy) is not a number"),
])
def test_a_best_json_that_is_no_record_is_set_aside_not_repeated(record, why, tmp_path, caplog):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.pt").write_bytes(b"")
    (run / "checkpoints" / "best.json").write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="segadv"):
        found = checkpoint_of_run(run)
    assert found.note == f"run dir {run}: its best checkpoint, {found.path}" and found.record is None
    assert why in caplog.text and "set aside" in caplog.text


def test_a_best_json_naming_another_step_than_best_pt_is_questioned(trained, tmp_path, capsys, caplog):
    result, _ = trained
    run = tmp_path / "run"
    shutil.copytree(result.run_dir, run)
    (run / "checkpoints" / "best.json").write_text('{"step": 99, "mIoU": 0.9}\n')
    with caplog.at_level(logging.INFO, logger="segadv"):
        assert eval_cli.main(["--checkpoint", str(run), "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 2
    assert "names step 99, but" in caplog.text and "is the checkpoint of step 2" in caplog.text
    assert f"its best checkpoint, {run / 'checkpoints' / 'best.pt'} (step 2)" in caplog.text
    assert "per best.json" not in caplog.text


def test_a_best_pt_that_is_a_folder_is_named_as_one(tmp_path, capsys):
    from segadv.cli import train as train_cli

    run = tmp_path / "run"
    (run / "checkpoints" / "best.pt").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    assert eval_cli.main(["--checkpoint", str(run), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: checkpoint {run / 'checkpoints' / 'best.pt'} is a directory, not a file: name a regular file"]
    assert train_cli.main(["--run-dir", str(run), "--resume", "best", "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume best: checkpoint" in err[0] and "best.pt is a directory" in err[0], err
