"""A start of segadv-train looks at the labeled training masks before the run dir is made: none
holding a labelled pixel is exit 2 naming them, with nothing written; some is a warning in the
training log, and the run trains through the batches that hold none (each loss over their
labelled pixels 0, counted in train/empty/<loss>), where it used to stop as diverged (issue 69);
0/255 binary masks are warned about there as segadv-data check warns."""

from __future__ import annotations

import re

from segadv.cli import train as train_cli

from conftest import TINY_OVERRIDES
from data_builders import make_folder, save_mask, stripes
from helpers import records


def folder_run(root, run_dir, num_classes, *extra) -> int:
    return train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES, "data.kind=folder",
                           f"data.root={root}", f"data.num_classes={num_classes}", "data.train_transforms=[]",
                           "data.val_transforms=[]", "log.tensorboard=false", "train.eval_every=100", *extra])


def ignore_all(root, ids) -> None:
    for k in ids:
        save_mask(root / "train" / "masks" / f"train_{k:03d}.png", stripes([255], 32, 32))


def test_batches_with_no_labelled_pixel_train_to_the_end_and_are_counted(tmp_path):
    """6 of 8 masks wholly ignored, batches of 2: every epoch has at least two batches holding no
    labelled pixel (the 2 labelled masks can be in two batches at most)."""
    make_folder(tmp_path / "data", n_train=8, n_val=2, num_classes=3, h=32, w=32)
    ignore_all(tmp_path / "data", range(6))
    run_dir = tmp_path / "run"
    assert folder_run(tmp_path / "data", run_dir, 3, "train.max_steps=8", "train.log_every=4") == 0
    logged = [r for r in records(run_dir) if "train/loss_seg" in r]
    assert [r["step"] for r in logged] == [4, 8]
    assert all(r["train/empty/loss_seg"] >= 0.25 and r["train/empty/loss_d"] == r["train/empty/loss_seg"]
               for r in logged)
    log = (run_dir / "train.log").read_text()
    assert re.search(r"WARNING segadv\.data\.bundle: data: train: 6 of 8 masks hold no labelled pixel \(every pixel "
                     r"is data\.ignore_index 255\): 'train_000', 'train_001', 'train_002', 'train_003', 'train_004' "
                     r"and 1 more; they teach G nothing", log), log
    assert re.search(r"step 4/8 loss_seg=\S+ .*empty/loss_seg=0\.\d+", log), log


def test_no_labelled_pixel_in_any_mask_is_exit_2_before_the_run_dir_is_made(tmp_path, capsys):
    make_folder(tmp_path / "data", n_train=4, n_val=2, num_classes=3, h=32, w=32)
    ignore_all(tmp_path / "data", range(4))
    run_dir = tmp_path / "run"
    assert folder_run(tmp_path / "data", run_dir, 3) == 2
    err = capsys.readouterr().err
    masks = tmp_path / "data" / "train" / "masks"
    assert f"error: data: none of the 4 labeled training masks holds a labelled pixel: every pixel is " \
           f"data.ignore_index (255) in {masks / 'train_000.png'}, {masks / 'train_001.png'}, " in err
    assert "Traceback" not in err
    assert not run_dir.exists()


def test_binary_masks_saved_as_0_255_are_warned_about_in_the_training_log(tmp_path):
    make_folder(tmp_path / "data", n_train=4, n_val=2, num_classes=2, h=32, w=32)
    for k in (0, 1):
        save_mask(tmp_path / "data" / "train" / "masks" / f"train_{k:03d}.png", stripes([0, 255, 0], 32, 32))
    run_dir = tmp_path / "run"
    assert folder_run(tmp_path / "data", run_dir, 2, "train.max_steps=1") == 0
    log = (run_dir / "train.log").read_text()
    assert ("WARNING segadv.data.bundle: data: train: 2 masks hold only 0 and 255 with 2 classes: 255 is "
            "data.ignore_index, so every object pixel is ignored (binary masks saved as 0/255? save objects as 1)"
            in log), log
