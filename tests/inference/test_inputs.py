"""segadv-predict's inputs: what an --input names, checked and read (segadv/inference/inputs.py)."""

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segadv.errors import UserError
from segadv.inference.inputs import chunks, find_images, read_image, scan_inputs, unreadable_error


def test_input_folder_that_cannot_be_listed_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "pictures"
    folder.mkdir()
    real = os.scandir

    def scandir(path="."):  # as for a folder without read permission (root lists any folder)
        if Path(path) == folder:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(UserError, match=r"--input .*pictures: cannot list the directory .*Permission denied"):
        find_images(str(folder))
    # a pattern whose folder cannot be listed names the folder, not "no files match"
    with pytest.raises(UserError, match="cannot list the directory"):
        find_images(str(folder / "*.png"))


def test_a_recursive_glob_through_links_to_dot_and_dotdot_terminates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in" / "a" / "b").mkdir(parents=True)
    for path in ("in/x.png", "in/a/y.png", "in/a/b/z.png", "in/a/.hidden.png"):
        (tmp_path / path).write_bytes(b"")
    (tmp_path / "in" / "a" / "self").symlink_to(".")
    (tmp_path / "in" / "a" / "b" / "up").symlink_to("..")
    (tmp_path / "in" / "root").symlink_to(tmp_path)
    found = find_images("in/**/*.png")  # Python's glob follows these links at every level
    assert sorted(map(str, found)) == ["in/a/b/z.png", "in/a/y.png", "in/x.png"]
    assert find_images("in/*/*.png") == [Path("in/a/y.png")]
    assert find_images("in/**/b/*.png") == [Path("in/a/b/z.png")]


def test_a_folder_gives_its_image_files_and_a_broken_link_is_kept(tmp_path):
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "b.png")
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "a.JPG")
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "gone.png").symlink_to(tmp_path / "missing.png")
    assert sorted(p.name for p in find_images(str(tmp_path))) == ["a.JPG", "b.png", "gone.png"]
    with pytest.raises(UserError, match="no such file or folder"):
        find_images(str(tmp_path / "nothing"))
    with pytest.raises(UserError, match="no files match the pattern"):
        find_images(str(tmp_path / "*.webp"))


def test_scan_names_each_unreadable_input_and_read_image_names_its_file(tmp_path):
    good = tmp_path / "good.png"
    Image.fromarray(np.full((3, 5, 3), 7, np.uint8)).save(good)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    readable, problems = scan_inputs([good, bad])
    assert readable == [good] and len(problems) == 1 and str(bad) in problems[0]
    assert read_image(good).shape == (3, 5, 3)
    with pytest.raises(UserError, match="cannot read image .*bad.png"):
        read_image(bad)
    many = unreadable_error([f"cannot read image {i}" for i in range(12)], written=3)
    assert "12 unreadable inputs" in str(many) and "... and 2 more" in str(many)
    assert "3 mask(s) written before it" in str(many)
    assert [list(c) for c in chunks([1, 2, 3, 4, 5], 2)] == [[1, 2], [3, 4], [5]]
