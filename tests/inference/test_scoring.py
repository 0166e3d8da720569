"""segadv-eval's library, called without argparse: predicted masks scored against ground truth
(segadv/inference/scoring.py) and --show-dir's rules (segadv/inference/show_dir.py)."""

from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from segadv.data.masks import palette_png
from segadv.data.palette import palette
from segadv.errors import UserError
from segadv.inference.scoring import read_prediction, score_predictions
from segadv.inference.show_dir import SOFTWARE, check_show_dir, input_files, sample_stems


class Labels:
    """A val split of generated labels (no ``samples``: stems are indices)."""

    def __init__(self, n=3, h=8, w=12):
        rng = np.random.default_rng(0)
        self.labels = [rng.integers(0, 3, (h, w)).astype(np.uint8) for _ in range(n)]

    def __len__(self):
        return len(self.labels)

    def raw(self, i):
        return None, self.labels[i]


def write_masks(folder, labels, software="segadv-predict"):
    folder.mkdir(exist_ok=True)
    for stem, ids in labels.items():
        (folder / f"{stem}.png").write_bytes(palette_png(ids, palette(3), software))


def test_perfect_predictions_score_one_and_a_wrong_one_less(tmp_path):
    data = Labels()
    write_masks(tmp_path / "pred", dict(zip(sample_stems(data), data.labels)))
    assert score_predictions(tmp_path / "pred", data, 3).metrics["mIoU"] == pytest.approx(1.0)
    write_masks(tmp_path / "pred", {"00001": np.zeros_like(data.labels[1])})
    assert score_predictions(tmp_path / "pred", data, 3).metrics["mIoU"] < 1.0


def test_missing_extra_misshapen_or_out_of_range_predictions_are_named(tmp_path):
    data = Labels()
    stems = sample_stems(data)
    write_masks(tmp_path / "p", dict(zip(stems[:2], data.labels)))
    with pytest.raises(UserError, match="no prediction for 00002.png"):
        score_predictions(tmp_path / "p", data, 3)
    write_masks(tmp_path / "p", {"00002": data.labels[2], "stray": data.labels[0]})
    with pytest.raises(UserError, match="predictions for no val image: stray.png"):
        score_predictions(tmp_path / "p", data, 3)
    (tmp_path / "p" / "stray.png").unlink()
    write_masks(tmp_path / "p", {"00002": np.zeros((4, 4), np.uint8)})
    with pytest.raises(UserError, match="is 4x4, its ground truth 12x8"):
        score_predictions(tmp_path / "p", data, 3)
    write_masks(tmp_path / "q", {"x": np.full((4, 4), 7, np.uint8)})
    with pytest.raises(UserError, match="holds the value 7, not a class id 0..2"):
        read_prediction(tmp_path / "q" / "x.png", 3)
    Image.new("RGB", (4, 4)).save(tmp_path / "q" / "rgb.png")
    with pytest.raises(UserError, match="is a RGB image"):
        read_prediction(tmp_path / "q" / "rgb.png", 3)


def test_show_dir_stems_and_what_it_may_replace(tmp_path):
    samples = [SimpleNamespace(image=tmp_path / "a" / "x.jpg", mask=tmp_path / "x.png"),
               SimpleNamespace(image=tmp_path / "b" / "x.png", mask=None)]
    with pytest.raises(UserError, match="two val images share the stem 'x'"):
        sample_stems(SimpleNamespace(samples=samples))
    assert input_files(SimpleNamespace(samples=samples[:1])) == [("val image", str(samples[0].image)),
                                                                 ("val mask", str(samples[0].mask))]
    out = tmp_path / "show"
    write_masks(out, {"00000": np.zeros((2, 2), np.uint8)}, SOFTWARE)
    check_show_dir(out, ["00000"], [], overwrite=False)  # its own files may be replaced
    write_masks(out, {"other": np.zeros((2, 2), np.uint8)})  # segadv-predict's, not segadv-eval's
    with pytest.raises(UserError, match="holds files segadv-eval did not write"):
        check_show_dir(out, ["00000"], [], overwrite=False)
    check_show_dir(out, ["00000"], [], overwrite=True)


def test_a_checkpoint_is_evaluated_and_its_show_dir_masks_score_the_same(tmp_path, one_torch_thread):
    """evaluate_checkpoint's masks, scored back as predictions, give its own mIoU."""
    import torch

    from segadv import __version__
    from segadv.config import config_to_dict, load_config
    from segadv.inference.scoring import evaluate_checkpoint, score_prediction_folder
    from segadv.models import build_generator

    from conftest import TINY_OVERRIDES

    cfg = load_config(None, TINY_OVERRIDES)
    torch.manual_seed(0)
    torch.save({"format": "segadv", "format_version": 1, "segadv_version": __version__, "step": 3,
                "generator": build_generator(cfg.model.generator, cfg.data.num_classes).state_dict(),
                "config": config_to_dict(cfg)}, tmp_path / "last.pt")
    scored = evaluate_checkpoint(str(tmp_path / "last.pt"), None, [], device="cpu", show_dir=str(tmp_path / "show"))
    assert scored.header["step"] == 3 and scored.header["show_dir_written"] == 8 and scored.skipped == []
    assert scored.line.startswith(f"checkpoint: {tmp_path / 'last.pt'}")
    again = score_prediction_folder(str(tmp_path / "show"), None, TINY_OVERRIDES)
    assert again.line == f"predictions: {tmp_path / 'show'}"
    assert again.result.metrics["mIoU"] == pytest.approx(scored.result.metrics["mIoU"], nan_ok=True)


def test_the_test_split_is_scored_as_val_is_and_one_the_config_lacks_is_named(tmp_path, one_torch_thread):
    """--split test: data.test's samples (not val's), through the same evaluation; none named: exit 2."""
    import torch

    from segadv import __version__
    from segadv.config import config_to_dict, load_config
    from segadv.inference.scoring import evaluate_checkpoint
    from segadv.models import build_generator

    from conftest import TINY_OVERRIDES
    from helpers import TARGET_DATA

    cfg = load_config(None, [*TINY_OVERRIDES, "data.test=test", "data.synthetic.test_size=6"])
    torch.manual_seed(0)
    torch.save({"format": "segadv", "format_version": 1, "segadv_version": __version__, "step": 3,
                "generator": build_generator(cfg.model.generator, cfg.data.num_classes).state_dict(),
                "config": config_to_dict(cfg)}, tmp_path / "last.pt")
    ckpt = str(tmp_path / "last.pt")
    test = evaluate_checkpoint(ckpt, None, [], device="cpu", split="test", show_dir=str(tmp_path / "test"))
    val = evaluate_checkpoint(ckpt, None, [], device="cpu")
    assert (test.split, test.header["split"], val.split, val.header["split"]) == ("test", "test", "val", "val")
    size = cfg.data.synthetic.image_size
    assert test.result.matrix.sum() == 6 * size * size and val.result.matrix.sum() == 8 * size * size
    assert test.header["show_dir_written"] == 6 and test.header["precision"] == val.header["precision"]
    with pytest.raises(UserError, match=r"--split test: the config has no test split \(data\.test is null\)"):
        evaluate_checkpoint(ckpt, None, ["data.test=null"], device="cpu", split="test")
    with pytest.raises(UserError, match=r"target_data\.test is null"):  # adaptation scores the target's splits
        evaluate_checkpoint(ckpt, None, [TARGET_DATA], device="cpu", split="test")
