"""Listing a dataset: directories that cannot be listed are named (exit 2), and train / val
splits that share image files are refused where the layout means them disjoint (gta5), warned
about where an overlap may be deliberate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from data_builders import make_cityscapes, make_folder, make_gta5, make_voc, write_list
from segadv.config import CONFIGS_DIR, load_config
from segadv.data import build_data
from segadv.cli.data import main as check_main
from segadv.errors import UserError

from conftest import TINY_OVERRIDES


def refuse_listing(monkeypatch, directory: Path) -> None:
    """``os.scandir`` of ``directory`` fails as on a folder without read permission (root, as
    these tests often run, lists any folder whatever its mode)."""
    real = os.scandir

    def scandir(path="."):
        if Path(path).resolve() == directory.resolve():
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def check(tmp_path, kind, *overrides):
    return check_main(["check", "--config", str(CONFIGS_DIR / f"{kind}.yaml"), f"data.root={tmp_path}", *overrides])


def test_unlistable_image_folder_is_exit_2_naming_it(tmp_path, monkeypatch, capsys):
    make_folder(tmp_path, n_train=2, n_val=2)
    refuse_listing(monkeypatch, tmp_path / "train" / "images")
    assert check(tmp_path, "folder") == 2
    err = capsys.readouterr().err
    assert "data.folder.train.images: cannot list the directory" in err and "train/images" in err
    assert "Permission denied" in err and "Traceback" not in err
    with pytest.raises(UserError, match="cannot list the directory .*train/images"):
        build_data(load_config("folder", [f"data.root={tmp_path}"]).data)


def test_unlistable_cityscapes_city_is_named_not_passed_over(tmp_path, monkeypatch, capsys):
    make_cityscapes(tmp_path, "train", {"aachen": 2, "bremen": 2})
    make_cityscapes(tmp_path, "val", {"lindau": 2})
    refuse_listing(monkeypatch, tmp_path / "leftImg8bit" / "train" / "bremen")
    assert check(tmp_path, "cityscapes") == 2
    assert "data.cityscapes.train_split: cannot list the directory" in capsys.readouterr().err


def test_unlistable_gta5_labels_are_named(tmp_path, monkeypatch):
    make_gta5(tmp_path, 6)
    refuse_listing(monkeypatch, tmp_path / "labels")
    with pytest.raises(UserError, match="data.root: cannot list the directory .*labels"):
        build_data(load_config("gta5", [f"data.root={tmp_path}", "data.gta5.val_every=3"]).data)


def test_chmod_000_folder(tmp_path, capsys):
    make_folder(tmp_path, n_train=2, n_val=2)
    images = tmp_path / "val" / "images"
    images.chmod(0)
    try:
        try:
            os.listdir(images)
        except PermissionError:
            pass
        else:  # root: permissions do not apply (os.access says readable too), the monkeypatched tests stand in
            assert os.access(images, os.R_OK)
            pytest.skip("this user lists a mode-000 folder (root)")
        assert check(tmp_path, "folder") == 2
        assert "data.folder.val.images: cannot list the directory" in capsys.readouterr().err
    finally:
        images.chmod(0o755)


def test_gta5_lists_sharing_ids_are_exit_2(tmp_path, capsys):
    ids = make_gta5(tmp_path, 6)
    write_list(tmp_path / "train.txt", ids[:4])
    write_list(tmp_path / "val.txt", ids[3:])
    code = check(tmp_path, "gta5", "data.gta5.train_list=train.txt", "data.gta5.val_list=val.txt")
    err = capsys.readouterr().err
    assert code == 2
    assert "share 1 image ('00004')" in err and "train.txt" in err and "val.txt" in err


def test_gta5_train_list_with_held_out_val_images_is_exit_2(tmp_path):
    ids = make_gta5(tmp_path, 6)
    write_list(tmp_path / "train.txt", ids)  # every image, while val_every=3 holds out 00003 and 00006
    cfg = load_config("gta5", [f"data.root={tmp_path}", "data.gta5.train_list=train.txt", "data.gta5.val_every=3"])
    with pytest.raises(UserError, match=r"share 2 images \('00003', '00006'\)"):
        build_data(cfg.data)


def test_folder_splits_sharing_images_warn_in_check_and_training(tmp_path, capsys, caplog):
    make_folder(tmp_path, n_train=4, n_val=2, num_classes=2)
    same = ["data.folder.val.images=train/images", "data.folder.val.masks=train/masks"]
    assert check(tmp_path, "folder", *same) == 0
    out = capsys.readouterr().out
    assert "warnings" in out and "share 4 images" in out
    with caplog.at_level("WARNING"):
        build_data(load_config("folder", [f"data.root={tmp_path}", *same]).data)
    assert any("share 4 images" in r.getMessage() for r in caplog.records)


def test_workers_option_is_validated(capsys):
    for value in ("-3", "0", "x"):
        with pytest.raises(SystemExit) as stop:
            check_main(["check", "--workers", value])
        assert stop.value.code == 2
        assert "argument --workers" in capsys.readouterr().err


def test_voc_trainval_against_val_is_a_warning(tmp_path, capsys):
    make_voc(tmp_path, train=["a", "b"], val=["c"])
    write_list(tmp_path / "ImageSets" / "Segmentation" / "trainval.txt", ["a", "b", "c"])
    assert check(tmp_path, "voc", "data.voc.train_split=trainval") == 0
    assert "share 1 image ('c')" in capsys.readouterr().out


def test_a_folder_behind_one_that_cannot_be_searched_is_not_called_missing(tmp_path, monkeypatch, capsys):
    make_folder(tmp_path, n_train=2, n_val=2, num_classes=2)
    images = tmp_path / "train" / "images"
    real = Path.stat

    def stat(self, *args, **kwargs):  # as under a parent folder without search (x) permission
        if self == images:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    assert check(tmp_path, "folder") == 2
    err = capsys.readouterr().err
    assert "data.folder.train.images:" in err and "cannot be reached: Permission denied" in err
    assert "does not exist" not in err


def test_a_splits_image_sizes_come_from_the_headers_once(tmp_path, monkeypatch):
    """Listing.image_sizes: each upright size -> its samples' ids, read from the headers once (a
    start's checks of G's input sizes and the builders share it); an unreadable image is left to
    the header scan, which names it."""
    from segadv.data import files
    from segadv.data.listing import list_source

    make_folder(tmp_path / "d", n_train=3, n_val=2, h=30, w=40)
    (tmp_path / "d" / "val" / "images" / "val_001.png").write_bytes(b"not a png")
    listed = list_source(load_config(None, ["data.kind=folder", f"data.root={tmp_path / 'd'}", "data.num_classes=3"]).data)
    assert listed.train.image_sizes == {(30, 40): ["train_000", "train_001", "train_002"]}
    assert listed.val.image_sizes == {(30, 40): ["val_000"]}
    monkeypatch.setattr(files, "probe_image", lambda path: pytest.fail("read twice"))
    assert listed.val.image_sizes == {(30, 40): ["val_000"]}
