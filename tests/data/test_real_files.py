"""Real files, real mistakes (issue 33): each oddity built on disk, each answered by name or read right."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from data_builders import (
    H, W, declared_size_png, image_for, make_folder, make_gta5, save_image, save_mask, save_rotated, stripes,
)
from segadv.config.schema import DataConfig
from segadv.data import build_dataloaders
from segadv.cli.data import main as check_main
from segadv.data.files import read_id_list, read_image
from segadv.data.layouts import gta5_list_split
from segadv.errors import UserError
from segadv.inference.inputs import read_image as predict_read_image

from test_data_errors import cfg_for, one_epoch

BOMB_W, BOMB_H = 20000, 9000  # 180 Mpx: over twice PIL.Image.MAX_IMAGE_PIXELS


def check(root, *overrides, capsys):
    code = check_main(["check", "data.kind=folder", f"data.root={root}", "data.num_classes=3",
                       "data.train_transforms=[]", "data.val_transforms=[]", "--workers", "1", *overrides])
    return code, capsys.readouterr()


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_an_image_over_pillows_pixel_limit_is_a_bad_sample_named_by_its_path(tmp_path, on_error, capsys):
    make_folder(tmp_path / "d", n_train=4, n_val=2)
    declared_size_png(tmp_path / "d" / "train" / "images" / "train_001.png", BOMB_W, BOMB_H)
    cfg = cfg_for(tmp_path / "d", on_error=on_error)
    if on_error == "raise":
        with pytest.raises(UserError, match=r"images/train_001\.png: cannot read image: Image size \(180000000 "
                                             r"pixels\) exceeds limit.*MAX_IMAGE_PIXELS"):
            build_dataloaders(cfg, seed=0, pin_memory=False)
        code, captured = check(tmp_path / "d", capsys=capsys)
        assert code == 2 and "train_001.png: cannot read image: Image size (180000000 pixels)" in captured.out
        assert "Traceback" not in captured.err
        return
    run = tmp_path / "run"
    run.mkdir()
    train_loader, _ = build_dataloaders(cfg, seed=0, pin_memory=False, run_dir=run)
    assert len(train_loader.dataset) == 3 and one_epoch(train_loader)  # dropped at the header scan; the run goes on
    skipped = json.loads((run / "skipped.json").read_text())
    assert [s["id"] for s in skipped["samples"]] == ["train_001"] and "180000000 pixels" in skipped["samples"][0]["problem"]


def test_exif_orientation_is_applied_by_train_check_and_predict(tmp_path, capsys):
    """A phone photo stored sideways with its tag, labelled upright: its mask fits, its pixels are
    the upright ones everywhere (a square one too, where no size check could tell)."""
    make_folder(tmp_path / "d", n_train=2, n_val=1)
    upright = image_for(7)  # 24 x 32 like its mask
    photo = save_rotated(tmp_path / "d" / "train" / "images" / "train_000.png", upright)
    with Image.open(photo) as stored:
        assert stored.size == (H, W)  # 24 wide, 32 high on disk
    square = image_for(8, 32, 32)
    square_photo = save_rotated(tmp_path / "square.png", square)
    for path, expected in ((photo, upright), (square_photo, square)):
        np.testing.assert_array_equal(read_image(path), expected)
        np.testing.assert_array_equal(predict_read_image(path), expected)
    code, captured = check(tmp_path / "d", capsys=capsys)
    assert code == 0 and "problems: none" in captured.out
    train_loader, _ = build_dataloaders(cfg_for(tmp_path / "d", batch_size=1), seed=0, pin_memory=False)
    assert len(one_epoch(train_loader)) == 2


def test_16_bit_grayscale_is_scaled_not_clipped_and_check_says_so(tmp_path, capsys):
    make_folder(tmp_path / "d", n_train=2, n_val=1)
    deep = (np.arange(H * W, dtype=np.uint32).reshape(H, W) * 85).astype(np.uint16)  # 0 .. 65195
    path = tmp_path / "d" / "train" / "images" / "train_001.png"
    Image.fromarray(deep).save(path)
    expected = np.repeat(np.rint(deep / 257.0).astype(np.uint8)[:, :, None], 3, axis=2)
    np.testing.assert_array_equal(read_image(path), expected)
    np.testing.assert_array_equal(predict_read_image(path), expected)
    assert (expected < 255).mean() > 0.99  # convert("RGB") made all but the darkest pixels 255
    code, captured = check(tmp_path / "d", capsys=capsys)
    assert code == 0
    assert "train: 1 image is 16-bit grayscale (mode I;16), read scaled to 8 bits (value / 257)" in captured.out


def test_binary_masks_saved_as_0_255_with_two_classes_are_warned_about(tmp_path, capsys):
    make_folder(tmp_path / "d", n_train=2, n_val=1, num_classes=2)
    for split, sample_id in (("train", "train_000"), ("train", "train_001"), ("val", "val_000")):
        save_mask(tmp_path / "d" / split / "masks" / f"{sample_id}.png", stripes([0, 255, 255, 0]))
    code, captured = check(tmp_path / "d", "data.num_classes=2", capsys=capsys)
    assert code == 0 and "problems: none" in captured.out
    out = captured.out
    assert "warnings (2):" in out
    assert "no train mask pixels of class_1: training never shows it to G; binary masks saved as 0/255?" in out
    assert "no val mask pixels of class_1: mIoU cannot measure it" in out


def test_list_file_ids_are_whole_lines_and_a_byte_order_mark_is_dropped(tmp_path):
    lines = "\ufeffIMG_1 2\n# a comment line\nIMG_#3\n  IMG_4  \n/JPEGImages/a.jpg /SegmentationClassAug/a.png\nb c.png\n"
    (tmp_path / "list.txt").write_text(lines, encoding="utf-8")
    assert read_id_list(tmp_path / "list.txt", "key") == ["IMG_1 2", "IMG_#3", "IMG_4", "a", "b c"]

    make_folder(tmp_path / "d", n_train=2, n_val=1)
    images = tmp_path / "d" / "train" / "images"
    save_image(images / "IMG_1.png", image_for(1))  # what 'IMG_1 2' was cut to
    save_image(images / "IMG_1 2.png", image_for(2))
    save_mask(tmp_path / "d" / "train" / "masks" / "IMG_1 2.png", stripes([0, 1, 2, 0]))
    save_mask(tmp_path / "d" / "train" / "masks" / "IMG_1.png", stripes([0, 1, 2, 0]))
    (tmp_path / "d" / "train.txt").write_text("\ufeffIMG_1 2\ntrain_000\n", encoding="utf-8")
    split = {"images": "train/images", "masks": "train/masks", "list_file": "train.txt"}
    val = {"images": "val/images", "masks": "val/masks", "list_file": None}
    cfg = cfg_for(tmp_path / "d", folder={"train": split, "val": val}, batch_size=1)
    from segadv.data import build_data

    bundle = build_data(cfg)
    assert [s.id for s in bundle.train.samples] == ["IMG_1 2", "train_000"]
    assert bundle.train.samples[0].image.name == "IMG_1 2.png"


def test_broken_image_symlinks_and_upper_case_suffixes_are_never_silently_left_out(tmp_path):
    make_folder(tmp_path / "d", n_train=3, n_val=1)
    images = tmp_path / "d" / "train" / "images"
    (images / "train_001.png").unlink()
    os.symlink(tmp_path / "gone.png", images / "train_001.png")
    with pytest.raises(UserError, match=r"images/train_001\.png: image file is a broken symlink to .*gone\.png, "
                                         r"which does not exist \(train split"):
        build_dataloaders(cfg_for(tmp_path / "d"), seed=0, pin_memory=False)

    make_gta5(tmp_path / "g", 4)
    for sub in ("images", "labels"):
        os.replace(tmp_path / "g" / sub / "00002.png", tmp_path / "g" / sub / "00002.PNG")
    cfg = DataConfig(kind="gta5", root=str(tmp_path / "g"), num_classes=19, gta5={"val_every": 2})
    listed = {split: [s.id for s in gta5_list_split(cfg, tmp_path / "g", split).samples] for split in ("train", "val")}
    assert listed == {"train": ["00001", "00003"], "val": ["00002", "00004"]}


def test_a_val_sample_that_fails_to_decode_is_left_out_not_replaced(tmp_path):
    """Under skip, 3 good val samples + 1 truncated one: the loader hands out the 3, each once, and
    the val images of different sizes are batched by size rather than refused."""
    make_folder(tmp_path / "d", n_train=2, n_val=4)
    val_images = tmp_path / "d" / "val" / "images"
    data = (val_images / "val_002.png").read_bytes()
    (val_images / "val_002.png").write_bytes(data[: len(data) // 2])
    save_image(val_images / "val_003.png", image_for(3, 16, 16))  # another size than the others
    save_mask(tmp_path / "d" / "val" / "masks" / "val_003.png", stripes([0, 1, 2, 0], 16, 16))
    run = tmp_path / "run"
    run.mkdir()
    _, val_loader = build_dataloaders(cfg_for(tmp_path / "d", on_error="skip", val_batch_size=4), seed=0,
                                      pin_memory=False, run_dir=run)
    batches = one_epoch(val_loader)
    assert sorted(tuple(images.shape) for images, _ in batches) == [(1, 3, 16, 16), (2, 3, H, W)]
    seen = sorted(float(images[i].sum()) for images, _ in batches for i in range(len(images)))
    assert len(set(seen)) == 3  # no sample twice
    skipped = json.loads((run / "skipped.json").read_text())
    assert [(s["split"], s["id"]) for s in skipped["samples"]] == [("val", "val_002")]
