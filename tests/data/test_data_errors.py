"""Bad input: each problem gets a message naming the file(s), under data.on_error raise and skip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_builders import H, W, make_folder, save_image, save_mask, stripes, write_list
from segadv.config.schema import DataConfig
from segadv.data import build_dataloaders
from segadv.errors import UserError

BAD = "train_001"  # not sample 0, so lazily found problems surface while iterating


def cfg_for(root, **kw) -> DataConfig:
    values = dict(kind="folder", root=str(root), num_classes=3, batch_size=2, val_batch_size=2,
                  num_workers=0, train_transforms=[], val_transforms=[])
    values.update(kw)
    return DataConfig(**values)


def image_path(root, sample_id=BAD):
    return root / "train" / "images" / f"{sample_id}.png"


def mask_path(root, sample_id=BAD):
    return root / "train" / "masks" / f"{sample_id}.png"


def corrupt_image(root):
    image_path(root).write_bytes(b"this is not a png at all")
    return {}, BAD, [f"{BAD}.png", "cannot read image"]


def truncated_image(root):
    data = image_path(root).read_bytes()
    image_path(root).write_bytes(data[: len(data) // 2])  # header intact, pixel data cut
    return {}, BAD, [f"images/{BAD}.png", "cannot read image"]


def missing_mask(root):
    mask_path(root).unlink()
    return {}, BAD, [f"masks/{BAD}.png", "mask file is missing"]


def size_mismatch(root):
    save_mask(mask_path(root), np.zeros((H, W - 2), np.uint8))
    return {}, BAD, [f"images/{BAD}.png is {W}x{H}", f"masks/{BAD}.png is {W - 2}x{H}"]


def bad_label_values(root):
    save_mask(mask_path(root), stripes([0, 7, 255, 9]))
    return {}, BAD, [f"masks/{BAD}.png", "mask values [7, 9]", "not class ids 0..2 or 255"]


def colour_mask(root):
    save_image(mask_path(root), np.zeros((H, W, 3), np.uint8))
    return {}, BAD, [f"masks/{BAD}.png", "RGB image (3 channels)", "single-channel or palette"]


def list_names_missing_id(root):
    write_list(root / "train.txt", ["train_000", "ghost", "train_002", "train_003"])
    split = {"images": "train/images", "masks": "train/masks", "list_file": "train.txt"}
    val = {"images": "val/images", "masks": "val/masks", "list_file": None}
    return {"folder": {"train": split, "val": val}}, "ghost", ["train.txt names id 'ghost'"]


CASES = [corrupt_image, truncated_image, missing_mask, size_mismatch, bad_label_values, colour_mask,
         list_names_missing_id]


@pytest.fixture
def dataset(tmp_path):
    make_folder(tmp_path / "d", n_train=4, n_val=2)
    run = tmp_path / "run"
    run.mkdir()
    return tmp_path / "d", run


def one_epoch(loader) -> list:
    return [batch for batch in loader]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_bad_input_raise_names_file_and_problem(dataset, case):
    root, run = dataset
    extra, _, expected = case(root)
    with pytest.raises(UserError) as info:
        train_loader, _ = build_dataloaders(cfg_for(root, **extra), seed=0, pin_memory=False, run_dir=run)
        one_epoch(train_loader)
    msg = str(info.value)
    for text in expected:
        assert text in msg
    assert "Traceback" not in msg and "data.on_error=skip" in msg


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_bad_input_skip_drops_counts_and_lists(dataset, case):
    root, run = dataset
    extra, bad_id, expected = case(root)
    train_loader, val_loader = build_dataloaders(
        cfg_for(root, on_error="skip", **extra), seed=0, pin_memory=False, run_dir=run
    )
    batches = one_epoch(train_loader) + one_epoch(val_loader)
    assert batches, "the run goes on"
    for _, labels in batches:  # nothing invalid ever reaches the loss
        assert ((labels < 3) | (labels == 255)).all()
    skipped = json.loads((run / "skipped.json").read_text())
    assert skipped["count"] == 1
    entry = skipped["samples"][0]
    assert entry["id"] == bad_id and entry["split"] == "train"
    for text in expected:
        assert text in entry["problem"]
    assert entry["files"]


def test_skipped_json_only_where_samples_may_be_skipped(dataset):
    """Under raise nothing is ever skipped: no skipped.json claims otherwise. Under skip the file
    says what was dropped, none included."""
    root, run = dataset
    train_loader, val_loader = build_dataloaders(cfg_for(root), seed=0, pin_memory=False, run_dir=run)
    one_epoch(train_loader) + one_epoch(val_loader)
    assert not (run / "skipped.json").exists()
    assert (run / "data_split.json").exists()
    train_loader, val_loader = build_dataloaders(cfg_for(root, on_error="skip"), seed=0, pin_memory=False,
                                                 run_dir=run)
    one_epoch(train_loader) + one_epoch(val_loader)
    assert json.loads((run / "skipped.json").read_text()) == {"count": 0, "samples": []}


def test_empty_split_is_an_error_under_both_policies(dataset):
    root, run = dataset
    for p in (root / "val" / "images").iterdir():
        p.unlink()
    for on_error in ("raise", "skip"):
        with pytest.raises(UserError, match=r"the val split is empty: no samples in .*val/images"):
            build_dataloaders(cfg_for(root, on_error=on_error), seed=0, pin_memory=False)


def test_all_samples_bad_under_skip_says_so(dataset):
    root, run = dataset
    for p in (root / "train" / "masks").iterdir():
        p.unlink()
    with pytest.raises(UserError, match=r"the train split has no usable samples: all 4 were dropped"):
        build_dataloaders(cfg_for(root, on_error="skip"), seed=0, pin_memory=False, run_dir=run)
    assert json.loads((run / "skipped.json").read_text())["count"] == 4


def test_many_problems_are_listed_in_one_message(dataset):
    root, _ = dataset
    for k in range(4):
        mask_path(root, f"train_{k:03d}").unlink()
    with pytest.raises(UserError) as info:
        build_dataloaders(cfg_for(root), seed=0, pin_memory=False)
    msg = str(info.value)
    assert msg.startswith("4 bad samples")
    assert all(f"masks/train_{k:03d}.png: mask file is missing" in msg for k in range(4))


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_bad_labels_found_in_a_worker_process(dataset, on_error):
    """In a worker the error comes back short (no worker traceback); a skip is still recorded."""
    root, run = dataset
    bad_label_values(root)
    cfg = cfg_for(root, on_error=on_error, num_workers=1)
    train_loader, _ = build_dataloaders(cfg, seed=0, pin_memory=False, run_dir=run)
    if on_error == "raise":
        with pytest.raises(UserError) as info:
            one_epoch(train_loader)
        msg = str(info.value)
        assert "\n" not in msg and "Traceback" not in msg
        assert f"masks/{BAD}.png: mask values [7, 9]" in msg and "data.on_error=skip" in msg
        return
    batches = one_epoch(train_loader)
    assert len(batches) == 2
    assert all(((labels < 3) | (labels == 255)).all() for _, labels in batches)
    skipped = json.loads((run / "skipped.json").read_text())
    assert [s["id"] for s in skipped["samples"]] == [BAD]
    assert "mask values [7, 9]" in skipped["samples"][0]["problem"]
    assert torch.count_nonzero(train_loader.dataset.bad) == 1  # shared with the worker
