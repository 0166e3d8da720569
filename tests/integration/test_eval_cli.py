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


def _folder_setup(tmp_path, n_val=3, resize=True):
    """A folder dataset (val only is read), its config and a raw G state dict."""
    make_folder(tmp_path / "data", n_train=2, n_val=n_val, num_classes=3)
    transforms = ["data.val_transforms=[{name: Resize, height: 32, width: 32}]"] if resize else []
    cfg = load_config(None, [*TINY_OVERRIDES, "data.kind=folder", f"data.root={tmp_path / 'data'}",
                             "data.num_classes=3", *transforms])
    dump_config(cfg, tmp_path / "config.yaml")
    torch.save(build_generator(cfg.model.generator, 3).state_dict(), tmp_path / "g.pt")
    return cfg, ["--checkpoint", str(tmp_path / "g.pt"), "--config", str(tmp_path / "config.yaml"), "--device", "cpu"]


def test_json_has_the_confusion_matrix_with_the_class_names(tmp_path, capsys):
    cfg, args = _folder_setup(tmp_path)
    assert eval_main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["network"] == "student" and out["step"] is None  # which network was scored: G (a raw state dict)
    matrix = out["confusion_matrix"]
    assert matrix["classes"] == list(class_names(cfg.data))
    rows = matrix["rows"]
    assert len(rows) == 3 and all(len(row) == 3 for row in rows)
    # rows: ground truth; the diagonal over all counted pixels is the pixel accuracy
    total = sum(map(sum, rows))
    assert total > 0 and abs(sum(rows[i][i] for i in range(3)) / total - out["pixel_acc"]) < 1e-9


def test_show_dir_writes_each_val_images_mask_and_overlay(tmp_path, capsys):
    from PIL import Image

    from segadv.data.palette import palette

    _, args = _folder_setup(tmp_path)
    show = tmp_path / "show"
    assert eval_main([*args, "--show-dir", str(show), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    stems = ["val_000", "val_001", "val_002"]
    assert sorted(p.name for p in show.glob("*.png")) == [f"{s}.png" for s in stems]
    assert sorted(p.name for p in (show / "overlay").glob("*.png")) == [f"{s}.png" for s in stems]
    mask = Image.open(show / "val_000.png")
    assert mask.mode == "P" and mask.size == (32, 32) and mask.info["Software"] == "segadv-eval"
    assert list(mask.getpalette()[:9]) == palette(3).reshape(-1).tolist()
    assert Image.open(show / "overlay" / "val_000.png").mode == "RGB"
    assert out["show_dir_written"] == 3 and not list(show.glob(".*"))  # no temporary file left
    # again into the same folder: its own files may be replaced
    assert eval_main([*args, "--show-dir", str(show)]) == 0
    assert "wrote      3 mask(s)" in capsys.readouterr().out


def test_show_dir_refuses_a_folder_with_other_files_and_never_replaces_an_input(tmp_path, capsys):
    _, args = _folder_setup(tmp_path)
    val_images = tmp_path / "data" / "val" / "images"
    before = (val_images / "val_000.png").read_bytes()
    for extra in ([], ["--overwrite"]):  # a mask would be an input image: refused, --overwrite or not
        assert eval_main([*args, "--show-dir", str(val_images), *extra]) == 2
        assert "is val image" in capsys.readouterr().err
    assert (val_images / "val_000.png").read_bytes() == before and not (val_images / "overlay").exists()
    # the dataset's own folders: the val folder, a folder inside the data root, one holding it
    for show, relation in ((tmp_path / "data" / "val", "lies inside data.root"),
                           (tmp_path / "data" / "preds", "lies inside data.root"), (tmp_path, "holds data.root")):
        assert eval_main([*args, "--show-dir", str(show), "--overwrite"]) == 2
        assert f"--show-dir {show} {relation} {tmp_path / 'data'}" in capsys.readouterr().err
    assert not (tmp_path / "data" / "preds").exists() and not (tmp_path / "data" / "val" / "overlay").exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep")
    assert eval_main([*args, "--show-dir", str(tmp_path / "notes")]) == 2  # holds a file segadv-eval did not write
    assert "did not write" in capsys.readouterr().err and not (tmp_path / "notes" / "overlay").exists()
    assert eval_main([*args, "--show-dir", str(tmp_path / "notes"), "--overwrite"]) == 0
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep"


def test_predictions_are_scored_against_the_val_ground_truth(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    from data_builders import H, W

    cfg, _ = _folder_setup(tmp_path, resize=False)
    config = ["--config", str(tmp_path / "config.yaml")]
    masks = tmp_path / "data" / "val" / "masks"
    preds = tmp_path / "preds"
    preds.mkdir()
    for path in sorted(masks.glob("*.png")):  # the ground truth itself, ignore pixels as class 0
        truth = np.asarray(Image.open(path))
        Image.fromarray(np.where(truth == 255, 0, truth).astype(np.uint8), mode="L").save(preds / path.name)
    assert eval_main(["--predictions", str(preds), *config, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["mIoU"] == 1.0 and out["pixel_acc"] == 1.0 and out["predictions"] == str(preds)
    assert out["confusion_matrix"]["classes"] == list(class_names(cfg.data))
    assert eval_main(["--predictions", str(preds), *config]) == 0
    assert "mIoU       1.0000" in capsys.readouterr().out  # the checkpoint evaluation's lines

    (preds / "val_001.png").rename(tmp_path / "val_001.png")
    assert eval_main(["--predictions", str(preds), *config]) == 2
    assert "no prediction for val_001.png" in capsys.readouterr().err
    (tmp_path / "val_001.png").rename(preds / "val_001.png")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(preds / "stray.png")
    assert eval_main(["--predictions", str(preds), *config]) == 2
    assert "predictions for no val image: stray.png" in capsys.readouterr().err
    (preds / "stray.png").unlink()
    Image.fromarray(np.zeros((H + 1, W), np.uint8)).save(preds / "val_002.png")
    assert eval_main(["--predictions", str(preds), *config]) == 2
    err = capsys.readouterr().err
    assert "val_002.png" in err and "ground truth" in err and "Traceback" not in err
    Image.fromarray(np.full((H, W), 7, np.uint8)).save(preds / "val_002.png")
    assert eval_main(["--predictions", str(preds), *config]) == 2
    assert "not a class id" in capsys.readouterr().err
    assert eval_main(["--predictions", str(preds), "--checkpoint", str(tmp_path / "g.pt")]) == 2  # one or the other


def test_split_test_scores_the_test_split_and_says_so(tmp_path, capsys):
    make_folder(tmp_path / "data", n_train=2, n_val=3, num_classes=3, n_test=2)
    shutil.rmtree(tmp_path / "data" / "val")  # scoring the test split reads nothing of val
    cfg = load_config(None, [*TINY_OVERRIDES, "data.kind=folder", f"data.root={tmp_path / 'data'}",
                             "data.num_classes=3", "data.test=test",
                             "data.val_transforms=[{name: Resize, height: 32, width: 32}]"])  # the test split's too
    dump_config(cfg, tmp_path / "config.yaml")
    torch.save(build_generator(cfg.model.generator, 3).state_dict(), tmp_path / "g.pt")
    args = ["--checkpoint", str(tmp_path / "g.pt"), "--config", str(tmp_path / "config.yaml"), "--device", "cpu"]
    assert eval_main([*args, "--split", "test", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["split"] == "test" and sum(map(sum, out["confusion_matrix"]["rows"])) > 0
    assert eval_main([*args, "--split", "test"]) == 0
    assert "; test split (data.test: test) of data" in capsys.readouterr().out
    assert eval_main([*args, "--split", "test", "data.test=null"]) == 2
    err = capsys.readouterr().err
    assert "data.test is null" in err and "Traceback" not in err
