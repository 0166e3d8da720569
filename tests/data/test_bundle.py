"""The start's probe of each pipeline (segadv/data/bundle.py): it checks what the pipeline
promises. Without ``data.val_input_size`` image and mask have one size; with it the val image is
the resize's size and the mask keeps its own (evaluation upsamples G's logits to it)."""

from __future__ import annotations

import pytest
import torch

from data_builders import make_cityscapes, make_gta5, save_mask, stripes
from segadv.config.schema import DataConfig
from segadv.data.bundle import VAL_KEY, _probe, build_data, build_val_dataset
from segadv.errors import UserError

FULL = (64, 128)  # the files' (H, W)
RESIZED = [32, 16]  # data.val_input_size [W, H]: neither side the images' own


def cityscapes_cfg(root, **kw) -> DataConfig:
    return DataConfig(kind="cityscapes", root=str(root), num_classes=19, num_workers=0, **kw)


class Pairs:
    """A dataset handing out given (image, mask) pairs, as a pipeline would have made them."""

    split = "val"

    def __init__(self, *pairs):
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i):
        return self.pairs[i]


def pair(image_hw, mask_hw):
    return torch.zeros(3, *image_hw), torch.zeros(mask_hw, dtype=torch.long)


def test_a_val_input_size_other_than_the_images_is_accepted_and_the_mask_keeps_its_size(tmp_path):
    make_cityscapes(tmp_path, "train", {"aachen": 2}, *FULL)
    make_cityscapes(tmp_path, "val", {"frankfurt": 2}, *FULL)
    val = build_val_dataset(cityscapes_cfg(tmp_path, val_input_size=RESIZED))  # segadv-eval's path
    image, mask = val[0]
    assert tuple(image.shape) == (3, RESIZED[1], RESIZED[0]) and tuple(mask.shape) == FULL
    # Training's path: its val under the resize, its train set at the images' own size.
    bundle = build_data(cityscapes_cfg(tmp_path, val_input_size=RESIZED))
    assert tuple(bundle.val[1][0].shape[1:]) == (RESIZED[1], RESIZED[0]) and tuple(bundle.val[1][1].shape) == FULL
    assert tuple(bundle.train[0][0].shape[1:]) == tuple(bundle.train[0][1].shape) == FULL
    # Without it, as before: image and mask at the images' size.
    image, mask = build_val_dataset(cityscapes_cfg(tmp_path))[0]
    assert tuple(image.shape[1:]) == tuple(mask.shape) == FULL


def test_a_gta5_val_under_the_resize_is_accepted(tmp_path):
    make_gta5(tmp_path, 4, *FULL)
    cfg = DataConfig(kind="gta5", root=str(tmp_path), num_classes=19, num_workers=0, val_input_size=RESIZED,
                     gta5={"val_every": 2})
    image, mask = build_data(cfg).val[0]
    assert tuple(image.shape) == (3, RESIZED[1], RESIZED[0]) and tuple(mask.shape) == FULL


def test_an_image_and_mask_of_different_sizes_are_still_refused_under_the_resize(tmp_path):
    make_cityscapes(tmp_path, "val", {"frankfurt": 2}, *FULL)
    bad = tmp_path / "gtFine" / "val" / "frankfurt" / "frankfurt_000001_000019_gtFine_labelIds.png"
    save_mask(bad, stripes(list(range(34)), FULL[0] - 8, FULL[1]))
    with pytest.raises(UserError) as info:
        build_val_dataset(cityscapes_cfg(tmp_path, val_input_size=RESIZED))
    assert bad.name in str(info.value)


def test_the_probe_checks_what_each_pipeline_promises():
    _probe(Pairs(pair(FULL, FULL)), VAL_KEY)  # no resize: one size
    with pytest.raises(UserError) as info:  # no resize: a pipeline whose image and mask disagree
        _probe(Pairs(pair((16, 32), FULL)), VAL_KEY)
    assert str(info.value).startswith("data.val_transforms:")

    _probe(Pairs(pair((16, 32), FULL)), VAL_KEY, RESIZED)  # the resize: the image at it, the mask its own
    _probe(Pairs(pair((16, 32), (16, 32))), VAL_KEY, RESIZED)  # images the resize's size already
    for bad in (pair(FULL, FULL), pair((32, 16), FULL)):  # the image not at [W, H] = [32, 16]
        with pytest.raises(UserError) as info:
            _probe(Pairs(bad), VAL_KEY, RESIZED)
        assert str(info.value).startswith("data.val_input_size:")
    with pytest.raises(UserError):  # a mask that is no HxW map
        _probe(Pairs((torch.zeros(3, 16, 32), torch.zeros(1, *FULL))), VAL_KEY, RESIZED)
