"""segadv-data check's scan as a library (segadv/data/check.py) and show's samples
(segadv/data/show.py), called without argparse."""

from __future__ import annotations

import numpy as np
import pytest

from data_builders import make_folder, save_mask, stripes
from segadv.config import CONFIGS_DIR, load_config
from segadv.data.bundle import build_data
from segadv.data.check import check_data, check_synthetic, format_report
from segadv.data.show import first_samples, sample_files
from segadv.errors import UserError

from conftest import TINY_OVERRIDES


def folder_config(root, *extra):
    return load_config(str(CONFIGS_DIR / "folder.yaml"), [f"data.root={root}", "data.num_classes=3",
                                                          "data.folder.class_names=[bg, a, b]", *extra]).data


def test_a_clean_folder_is_counted_per_split_with_its_class_pixels(tmp_path):
    make_folder(tmp_path, n_train=4, n_val=2)
    report = check_data(folder_config(tmp_path, "data.labeled_fraction=0.5"), workers=2)
    assert report.problems == [] and report.names == ["bg", "a", "b"]
    train, val = report.splits
    assert (train.labeled, train.unlabeled, val.labeled, val.unlabeled) == (2, 2, 2, None)
    assert len(train.widths) == 4  # unlabeled images are read too
    assert train.hist[255] > 0 and train.hist[3:255].sum() == 0
    lines = list(format_report(report))
    assert lines[0].startswith("dataset: folder at") and lines[-1] == "problems: none"


def test_every_problem_is_collected_with_its_split(tmp_path):
    make_folder(tmp_path, n_train=4, n_val=2)
    (tmp_path / "train" / "masks" / "train_000.png").unlink()
    save_mask(tmp_path / "train" / "masks" / "train_001.png", stripes([0, 5, 255, 0]))
    (tmp_path / "val" / "images" / "val_001.png").write_bytes(b"junk")
    report = check_data(folder_config(tmp_path), workers=1)
    assert sorted(p.split for p in report.problems) == ["train", "train", "val"]
    assert list(format_report(report))[-4] == "problems (3):"


def test_a_config_error_names_its_key_before_any_file_is_read(tmp_path):
    with pytest.raises(UserError, match="data.train_transforms"):
        check_data(folder_config(tmp_path, "data.train_transforms=[{name: NoSuchTransform}]"), workers=1)


def test_binary_masks_saved_as_0_and_255_are_warned_about():
    cfg = load_config(None, TINY_OVERRIDES).data
    report = check_synthetic(cfg)
    assert report.problems == [] and report.splits[0].labeled > 0
    report.names, report.splits[0].binary_255 = ["bg", "object"], 3
    report.splits[0].hist[1] = report.splits[0].hist[1] or 1
    assert any("3 masks hold only 0 and 255 with 2 classes" in w for w in report.warnings())


def test_show_draws_the_first_samples_seeded_and_names_their_files(tmp_path):
    make_folder(tmp_path, n_train=4, n_val=2)
    cfg = load_config(str(CONFIGS_DIR / "folder.yaml"), [f"data.root={tmp_path}", "data.num_classes=3",
                                                         "data.folder.class_names=[bg, a, b]",
                                                         "data.labeled_fraction=1.0"])
    train = build_data(cfg.data).train
    files = sample_files(train)
    assert {what for what, _ in files} == {"an image", "a mask"} and len(files) == 2 * len(train)
    first, again = first_samples(train, 3, seed=7), first_samples(train, 3, seed=7)
    assert len(first) == 3
    for (image, mask), (image2, mask2) in zip(first, again):
        assert np.array_equal(np.asarray(image), np.asarray(image2)) and np.array_equal(np.asarray(mask),
                                                                                        np.asarray(mask2))
