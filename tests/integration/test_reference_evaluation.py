"""configs/*_gta5_cityscapes_reference.yaml from the command line on data in the documented GTA5
and Cityscapes layouts: the run starts, evaluates Cityscapes val as the references do
(``target_data.val_input_size``: G sees the image resized, its logits go to the label's own size)
and writes its checkpoints; segadv-eval scores the checkpoint the same way.

The configs' G (DeepLab-v2, ResNet-101, Caffe layout) at a tiny size; no ImageNet weights (no
network here)."""

import json

import pytest

from segadv.checkpoint import read_checkpoint
from segadv.cli import eval as eval_cli
from segadv.cli import train as train_cli

from data_builders import make_cityscapes, make_gta5

GTA5_HW = (32, 64)
CITYSCAPES_HW = (64, 128)  # the labels' size: the scores are at it
VAL_INPUT_WH = (64, 32)  # target_data.val_input_size [W, H]: half the Cityscapes images' sides

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("layouts")
    make_gta5(base / "gta5", 4, *GTA5_HW)  # data.gta5.val_every=2: 2 train, 2 val
    make_cityscapes(base / "cityscapes", "train", {"aachen": 2}, *CITYSCAPES_HW)
    make_cityscapes(base / "cityscapes", "val", {"frankfurt": 2}, *CITYSCAPES_HW)
    return base / "gta5", base / "cityscapes"


def overrides(gta5, cityscapes):
    resize = "[{name: Resize, height: %d, width: %d}]" % GTA5_HW
    return [f"data.root={gta5}", f"target_data.root={cityscapes}", "data.gta5.val_every=2",
            "model.generator.encoder_weights=null", f"data.train_transforms={resize}", "data.val_transforms=[]",
            f"target_data.train_transforms={resize}", "target_data.val_input_size=[%d,%d]" % VAL_INPUT_WH,
            "data.num_workers=0", "target_data.num_workers=0", "train.max_steps=2", "train.eval_every=2",
            "train.log_every=1", "checkpoint.every=100", "log.progress_bar=false", "log.tensorboard=false"]


@pytest.fixture
def seen(logits_at_calls):
    """Every (input size, output size) evaluation asks G for."""
    return logits_at_calls


@pytest.mark.parametrize("config", ["adaptsegnet_gta5_cityscapes_reference", "advent_gta5_cityscapes_reference"])
def test_the_reference_config_trains_and_evaluates_at_the_resized_input(tmp_path, roots, seen, capsys, config):
    run_dir = tmp_path / "run"
    argv = ["--config", config, "--run-dir", str(run_dir), "--device-map", "cpu", *overrides(*roots)]
    assert train_cli.main(argv) == 0

    resized_hw = VAL_INPUT_WH[::-1]
    assert (resized_hw, CITYSCAPES_HW) in seen  # G saw the resized image; its logits went to the label's size
    assert all(image != CITYSCAPES_HW for image, _ in seen)  # never the full-size image
    assert {label for _, label in seen} == {CITYSCAPES_HW}  # the label never resized

    checkpoints = run_dir / "checkpoints"
    assert {"last.pt", "best.pt", "best.json"} <= {p.name for p in checkpoints.iterdir()}
    ckpt = read_checkpoint(checkpoints / "last.pt")
    assert ckpt["step"] == 2
    assert ckpt["config"]["model"]["generator"]["arch"] == "deeplabv2"
    assert ckpt["config"]["target_data"]["val_input_size"] == list(VAL_INPUT_WH)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in records if "val/mIoU" in r]
    assert [r["step"] for r in final] == [2] and 0 <= final[0]["val/mIoU"] <= 1
    assert json.loads((checkpoints / "best.json").read_text())["step"] == 2

    # segadv-eval predicts as the run's evaluation did: the same scores.
    seen.clear()
    capsys.readouterr()
    assert eval_cli.main(["--checkpoint", str(checkpoints / "last.pt"), "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mIoU"] == pytest.approx(final[0]["val/mIoU"], abs=1e-9)
    assert seen and all(call == (resized_hw, CITYSCAPES_HW) for call in seen)
    for path in checkpoints.glob("*.pt"):  # ResNet-101's checkpoints are 400 MB each
        path.unlink()
