"""The test split (``data.test``): where each kind keeps it, what is refused, and that
``segadv-data check`` reads it like the others (segadv/data/layouts.py, listing.py, bundle.py,
config_checks.py, check.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data_builders import make_cityscapes, make_folder, make_gta5, make_voc, write_list
from segadv.cli.data import main as data_main
from segadv.config import CONFIGS_DIR
from segadv.config.schema import DataConfig
from segadv.data.bundle import build_val_dataset
from segadv.errors import UserError

NUM_CLASSES = {"voc": 21, "cityscapes": 19, "gta5": 19, "folder": 3, "synthetic": 5}


def data_cfg(kind: str, root=None, **kw) -> DataConfig:
    values = dict(kind=kind, root=None if root is None else str(root), num_classes=NUM_CLASSES[kind],
                  val_batch_size=2, num_workers=0, val_transforms=[])
    values.update(kw)
    return DataConfig(**values)


def test_voc_and_cityscapes_name_the_test_split_as_they_name_val(tmp_path):
    voc = tmp_path / "voc"
    make_voc(voc, train=["2007_000032"], val=["2007_000033", "2009_000001"])
    write_list(voc / "ImageSets" / "Segmentation" / "mytest.txt", ["2009_000001"])
    test = build_val_dataset(data_cfg("voc", voc, test="mytest"), split="test")
    assert test.ids == ["2009_000001"] and test.split == "test"

    cs = tmp_path / "cs"
    make_cityscapes(cs, "val", {"frankfurt": 2})
    held = make_cityscapes(cs, "holdout", {"lindau": 3})
    test = build_val_dataset(data_cfg("cityscapes", cs, test="holdout"), split="test")
    assert test.ids == held and all("/gtFine/holdout/lindau/" in str(s.mask) for s in test.samples)


def test_cityscapes_withheld_test_labels_and_the_synthetic_training_split_are_refused(tmp_path):
    with pytest.raises(UserError, match=r"data\.test: Cityscapes withholds the labels of its test split"):
        build_val_dataset(data_cfg("cityscapes", tmp_path, test="test"), split="test")
    with pytest.raises(UserError, match=r"data\.test: train is the synthetic kind's training split"):
        build_val_dataset(data_cfg("synthetic", test="train"), split="test")
    with pytest.raises(UserError, match=r"data\.test is null"):
        build_val_dataset(data_cfg("synthetic"), split="test")


def test_folder_test_split_by_default_folder_or_its_own_section(tmp_path):
    ids = make_folder(tmp_path, n_train=3, n_val=2, n_test=2)
    test = build_val_dataset(data_cfg("folder", tmp_path, test="test"), split="test")
    assert test.ids == ids["test"] and test.split == "test"
    assert not np.array_equal(test.raw(0)[0], build_val_dataset(data_cfg("folder", tmp_path)).raw(0)[0])
    # a layout whose splits share one folder and differ by list file: data.folder.test says so
    write_list(tmp_path / "test.txt", ["train_002"])
    own = data_cfg("folder", tmp_path, test="test",
                   folder={"test": {"images": "train/images", "masks": "train/masks", "list_file": "test.txt"}})
    assert build_val_dataset(own, split="test").ids == ["train_002"]
    with pytest.raises(UserError, match=r"data\.test: .*missing/images does not exist"):
        build_val_dataset(data_cfg("folder", tmp_path, test="missing"), split="test")


def test_gta5_test_list_must_leave_the_training_split(tmp_path):
    ids = make_gta5(tmp_path, 6)
    write_list(tmp_path / "test.txt", ids[4:])
    write_list(tmp_path / "train.txt", ids[:4])
    test = build_val_dataset(data_cfg("gta5", tmp_path, test="test.txt", gta5={"train_list": "train.txt"}),
                             split="test")
    assert test.ids == ids[4:]
    # its default train split, every image not held out for val, holds the test images: refused
    with pytest.raises(UserError, match=r"the train split .* and the test split .* share 2 images .*test would score"):
        build_val_dataset(data_cfg("gta5", tmp_path, test="test.txt"), split="test")


def test_synthetic_test_split_is_its_own_samples_a_function_of_its_name(tmp_path):
    cfg = data_cfg("synthetic", test="test", synthetic={"image_size": 32, "val_size": 4, "test_size": 3})
    test, val = build_val_dataset(cfg, split="test"), build_val_dataset(cfg)
    assert (len(test), len(val)) == (3, 4) and test.split == "test"
    assert not any(torch.equal(test[i][0], val[j][0]) for i in range(3) for j in range(4))
    again = build_val_dataset(cfg, split="test")
    assert all(torch.equal(test[i][0], again[i][0]) for i in range(3))
    as_val = build_val_dataset(cfg.model_copy(update={"test": "val"}), split="test")  # mmseg's test = val
    assert torch.equal(as_val[0][0], val[0][0])


def test_data_check_reads_the_test_split_too(tmp_path, capsys):
    make_folder(tmp_path, n_train=3, n_val=2, n_test=4, num_classes=2)  # folder.yaml: 2 classes
    config = ["check", "--config", str(CONFIGS_DIR / "folder.yaml"), f"data.root={tmp_path}"]
    assert data_main([*config, "data.test=test"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[:2] for line in out.splitlines() if line.startswith(("val ", "test "))] == \
        [["val", "2"], ["test", "4"]]
    assert data_main(config) == 0  # no data.test: no test row
    assert not any(line.startswith("test ") for line in capsys.readouterr().out.splitlines())
    assert data_main(["check", "--config", "synthetic", "data.synthetic.train_size=8", "data.synthetic.val_size=2",
                     "data.test=test", "data.synthetic.test_size=7"]) == 0
    assert any(line.split()[:2] == ["test", "7"] for line in capsys.readouterr().out.splitlines())
