"""segadv-data check's hints say only what the masks show: the 0/255 hint needs a mask holding 255."""

from __future__ import annotations

from data_builders import make_folder, save_mask, stripes
from segadv.cli.data import main as check_main


def check(root, capsys):
    code = check_main(["check", "data.kind=folder", f"data.root={root}", "data.num_classes=2",
                       "data.train_transforms=[]", "data.val_transforms=[]", "--workers", "1"])
    return code, capsys.readouterr().out


def test_val_masks_all_0_get_the_absent_class_note_without_the_0_255_hint(tmp_path, capsys):
    make_folder(tmp_path, n_train=2, n_val=2, num_classes=2)
    for sample_id in ("val_000", "val_001"):
        save_mask(tmp_path / "val" / "masks" / f"{sample_id}.png", stripes([0, 0, 0, 0]))
    code, out = check(tmp_path, capsys)
    assert code == 0
    assert "no val mask pixels of class_1: mIoU cannot measure it (IoU 0 where predicted, left out where not)" in out
    assert "0/255" not in out


def test_masks_holding_255_and_no_class_1_still_get_the_hint(tmp_path, capsys):
    make_folder(tmp_path, n_train=2, n_val=2, num_classes=2)
    for sample_id in ("val_000", "val_001"):
        save_mask(tmp_path / "val" / "masks" / f"{sample_id}.png", stripes([0, 255, 0, 0]))
    code, out = check(tmp_path, capsys)
    assert code == 0
    assert "no val mask pixels of class_1: mIoU cannot measure it (IoU 0 where predicted, left out where not); " \
           "binary masks saved as 0/255?" in out


def test_masks_with_no_labelled_pixel_are_named_per_split(tmp_path, capsys):
    """The training start refuses data where none has one, and warns where some have none
    (tests/training/test_preflight.py): segadv-data check names them the same way."""
    make_folder(tmp_path, n_train=3, n_val=2, num_classes=2)
    save_mask(tmp_path / "train" / "masks" / "train_001.png", stripes([255, 255]))
    save_mask(tmp_path / "val" / "masks" / "val_000.png", stripes([255]))
    code, out = check(tmp_path, capsys)
    assert code == 0
    assert ("train: 1 of 3 masks holds no labelled pixel (every pixel is data.ignore_index 255): 'train_001'; "
            "they teach G nothing (a batch of only such crops is counted in train/empty/<loss>)") in out
    assert ("val: 1 of 2 masks holds no labelled pixel (every pixel is data.ignore_index 255): 'val_000'; "
            "they add nothing to the scores") in out
