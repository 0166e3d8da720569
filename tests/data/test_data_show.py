"""segadv-data show: augmented training samples with their masks, through the training pipeline."""

from __future__ import annotations

from PIL import Image

from conftest import TINY_OVERRIDES
from data_builders import make_folder
from segadv.cli.data import main


def test_show_draws_augmented_training_samples_with_their_masks(tmp_path, capsys):
    out = tmp_path / "pics" / "samples.png"
    assert main(["show", "--output", str(out), "--num", "3", *TINY_OVERRIDES,
                 "data.train_transforms=[{name: RandomCrop, height: 32, width: 32}]"]) == 0
    assert "3 augmented training sample(s)" in capsys.readouterr().out
    picture = Image.open(out)
    assert picture.mode == "RGB" and picture.width == 2 * (32 + 2) + 2  # two columns of 32 px crops
    assert picture.height > 3 * (32 + 2)  # three rows, titled, with the legend below
    assert not [p for p in out.parent.iterdir() if p != out]  # written atomically: no temporary file left
    # the same command draws the same picture (seeded as training is)
    first = out.read_bytes()
    assert main(["show", "--output", str(out), "--num", "3", *TINY_OVERRIDES,
                 "data.train_transforms=[{name: RandomCrop, height: 32, width: 32}]"]) == 0
    assert out.read_bytes() == first


def test_show_never_replaces_an_input(tmp_path, capsys):
    make_folder(tmp_path / "data", n_train=2, n_val=1, num_classes=3)
    image = tmp_path / "data" / "train" / "images" / "train_000.png"
    before = image.read_bytes()
    folder = [*TINY_OVERRIDES, "data.kind=folder", f"data.root={tmp_path / 'data'}", "data.num_classes=3"]
    assert main(["show", "--output", str(image), *folder]) == 2
    assert "nothing replaces an input" in capsys.readouterr().err and image.read_bytes() == before
    assert main(["show", "--output", str(tmp_path / "samples.jpg"), *folder]) == 2
    assert "name a .png file" in capsys.readouterr().err
