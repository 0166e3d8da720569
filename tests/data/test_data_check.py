"""segadv-data check, the per-kind configs, and a short training run on the folder kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from data_builders import make_cityscapes, make_folder, make_gta5, make_voc, save_mask, stripes, write_list
from segadv.config import CONFIGS_DIR, load_config
from segadv.data import build_data
from segadv.cli.data import main as check_main

from conftest import TINY_OVERRIDES


def test_check_clean_voc_reports_counts_sizes_histogram(tmp_path, capsys):
    make_voc(tmp_path, train=["a", "b", "c"], val=["d", "e"])
    code = check_main(["check", "--config", str(CONFIGS_DIR / "voc.yaml"), f"data.root={tmp_path}",
                       "data.labeled_fraction=0.67"])
    out = capsys.readouterr().out
    assert code == 0
    assert "dataset: voc at" in out and "21 classes, ignore index 255" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith(("train ", "val "))}
    assert rows["train"] == ["2", "1", "0"] and rows["val"] == ["2", "-", "0"]
    assert "train  3 images, width 32, height 24" in out  # unlabeled images are read too
    lines = {line.split()[1]: line for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert {"background", "aeroplane", "(ignore)"} <= set(lines)
    assert "problems: none" in out


def test_check_reports_every_problem_and_exits_2(tmp_path, capsys):
    make_folder(tmp_path, n_train=4, n_val=2)
    (tmp_path / "train" / "masks" / "train_000.png").unlink()
    save_mask(tmp_path / "train" / "masks" / "train_001.png", stripes([0, 5, 255, 0]))
    (tmp_path / "val" / "images" / "val_001.png").write_bytes(b"junk")
    code = check_main(["check", "--config", str(CONFIGS_DIR / "folder.yaml"), f"data.root={tmp_path}",
                       "data.num_classes=3", "data.folder.class_names=[bg, a, b]"])
    captured = capsys.readouterr()
    assert code == 2
    out = captured.out
    assert "problems (3):" in out
    assert "train_000.png: mask file is missing" in out
    assert "train_001.png: mask values [5] in 192 pixels are not class ids 0..2" in out
    assert "val_001.png: cannot read image" in out
    assert captured.err.strip() == "error: 3 problems found in the dataset (listed above)"


def test_check_config_error_exits_2_naming_the_key(tmp_path, capsys):
    code = check_main(["check", "--config", str(CONFIGS_DIR / "cityscapes.yaml"), f"data.root={tmp_path / 'nope'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: data.root: ") and err.strip().endswith("nope does not exist")


def test_check_synthetic(capsys):
    code = check_main(["check", "data.synthetic.train_size=6", "data.synthetic.val_size=2",
                       "data.synthetic.image_size=32"])
    out = capsys.readouterr().out
    assert code == 0
    assert "dataset: synthetic shapes" in out and "problems: none" in out
    assert "circle" in out and "train  6 images, width 32, height 32" in out
    class_rows = [line.split()[1] for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert class_rows == ["background", "circle", "square", "triangle", "ring", "(ignore)"]  # every class


def test_module_entry_point_exits_2_without_traceback():
    bad = subprocess.run([sys.executable, "-m", "segadv.cli.data", "check", "data.kind=voc", "data.num_classes=21"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == "error: data.root: required for data.kind=voc (the dataset directory; see docs/datasets.md)"


MAKERS = {
    "voc": lambda root: make_voc(root, train=["a", "b"], val=["c"]),
    "cityscapes": lambda root: (make_cityscapes(root, "train", {"aachen": 2}), make_cityscapes(root, "val", {"ulm": 1})),
    "gta5": lambda root: make_gta5(root, 4),
    "folder": lambda root: make_folder(root, n_train=2, n_val=1),
}
CROPS = {"voc": (320, 320), "cityscapes": (512, 1024), "gta5": (512, 1024), "folder": (512, 512)}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_each_kind_has_a_config_that_works_with_one_line(tmp_path, kind):
    MAKERS[kind](tmp_path)
    extra = ["data.gta5.val_every=2"] if kind == "gta5" else []  # 4 images, not thousands
    cfg = load_config(CONFIGS_DIR / f"{kind}.yaml", [f"data.root={tmp_path}", "data.num_workers=0", *extra])
    assert cfg.data.kind == kind
    bundle = build_data(cfg.data)
    image, mask = bundle.train[0]
    assert tuple(image.shape[1:]) == tuple(mask.shape) == CROPS[kind]
    image, mask = bundle.val[0]
    assert image.shape[1] % 16 == 0 and image.shape[2] % 16 == 0  # DeepLab's output stride


def test_synthetic_config_is_the_demo():
    demo, synthetic = load_config(None), load_config(CONFIGS_DIR / "synthetic.yaml")
    assert synthetic.data == demo.data and synthetic.data.kind == "synthetic"
    assert {p.stem for p in CONFIGS_DIR.glob("*.yaml")} >= {"default", "synthetic", "folder", "voc", "cityscapes", "gta5"}


def test_short_training_run_on_folder_kind(tmp_path):
    from segadv.training.loop import train

    root = tmp_path / "data"
    make_folder(root, n_train=8, n_val=2, num_classes=3, h=64, w=64)
    save_mask(root / "train" / "masks" / "train_005.png", stripes([0, 9, 1, 2], 64, 64))  # found when read
    write_list(root / "labeled.txt", [f"train_{k:03d}" for k in range(2, 6)])
    overrides = [
        *TINY_OVERRIDES, "data.kind=folder", f"data.root={root}", "data.num_classes=3",
        "data.labeled_list=labeled.txt", "data.on_error=skip", "data.val_transforms=[]",
        "train.max_steps=2", "train.eval_every=2", "checkpoint.every=2",
    ]
    cfg = load_config(None, overrides)
    cfg.run_dir = str(tmp_path / "run")
    cfg.device_map = "g:cpu,d:cpu"
    result = train(cfg)
    assert result.step == 2 and "mIoU" in result.val_metrics
    run = Path(cfg.run_dir)
    split = json.loads((run / "data_split.json").read_text())
    assert split["counts"] == {"labeled": 4, "unlabeled": 4, "val": 2} and split["kind"] == "folder"
    assert split["unlabeled"] == ["train_000", "train_001", "train_006", "train_007"]
    skipped = json.loads((run / "skipped.json").read_text())
    assert [s["id"] for s in skipped["samples"]] == ["train_005"]  # read in the first epoch
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("perf/data_time" in r for r in records) and any("val/mIoU" in r for r in records)
    assert any("val/IoU/class_1" in r for r in records)
