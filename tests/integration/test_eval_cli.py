"""segadv-eval needs the val split only."""

import json
import shutil

import torch

from conftest import TINY_OVERRIDES
from data_builders import make_folder
from segadv.config import dump_config, load_config
from segadv.data import class_names
from segadv.cli.eval import main as eval_main
from segadv.models import build_generator


def test_eval_needs_only_the_val_split(tmp_path, capsys):
    make_folder(tmp_path / "data", n_train=2, n_val=3, num_classes=3)
    shutil.rmtree(tmp_path / "data" / "train")  # nothing of the train split is there
    cfg = load_config(None, [*TINY_OVERRIDES, "data.kind=folder", f"data.root={tmp_path / 'data'}",
                             "data.num_classes=3", "data.val_transforms=[{name: Resize, height: 32, width: 32}]"])
    dump_config(cfg, tmp_path / "config.yaml")
    torch.save(build_generator(cfg.model.generator, 3).state_dict(), tmp_path / "g.pt")

    code = eval_main(["--checkpoint", str(tmp_path / "g.pt"), "--config", str(tmp_path / "config.yaml"),
                      "--json", "--device", "cpu"])
    assert code == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= metrics["mIoU"] <= 1.0 and len(metrics["iou"]) == 3
    assert list(metrics["iou"]) == list(class_names(cfg.data))  # per-class IoU by class name
