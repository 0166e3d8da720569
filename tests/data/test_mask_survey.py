"""The start's survey of the labeled training masks: it finds the masks with no labelled pixel (after
the kind's label mapping) and the 0/255 ones as segadv-data check does, refuses data where none is
labelled, naming the masks, and reads each mask once: later surveys take what an unchanged mask
holds from the cache and decode only what changed."""

from __future__ import annotations

import os

import numpy as np
import pytest

from segadv.config.schema import DataConfig
from segadv.data.check import check_data
from segadv.data.listing import list_source
from segadv.data.mask_survey import CACHE_VARIABLE, cache_path, survey_masks
from segadv.errors import UserError

from data_builders import make_cityscapes, make_folder, save_mask, stripes


def folder(root, num_classes=3, **kw) -> DataConfig:
    return DataConfig(kind="folder", root=str(root), num_classes=num_classes, train_transforms=[], val_transforms=[],
                      num_workers=0, **kw)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_survey_names_what_segadv_data_check_names(tmp_path, cache):
    make_folder(tmp_path, n_train=6, n_val=2, num_classes=2)
    masks = tmp_path / "train" / "masks"
    for k in (1, 4):
        save_mask(masks / f"train_{k:03d}.png", stripes([255, 255]))
    save_mask(masks / "train_002.png", stripes([0, 255, 0]))  # a binary mask saved as 0/255
    cfg = folder(tmp_path, num_classes=2)
    survey = survey_masks(list_source(cfg))
    assert (survey.masks, survey.no_labels, survey.binary_255, survey.decoded) == (6, ["train_001", "train_004"], 1, 6)
    warnings = survey.warnings()
    assert warnings == [w for w in check_data(cfg, workers=1).warnings() if w.startswith("train:")]
    assert ("train: 2 of 6 masks hold no labelled pixel (every pixel is data.ignore_index 255): 'train_001', "
            "'train_004'; they teach G nothing") in warnings[1]
    assert warnings[0].startswith("train: 1 mask holds only 0 and 255 with 2 classes")


def test_no_labelled_pixel_in_any_mask_is_a_user_error_naming_them(tmp_path, cache):
    make_folder(tmp_path, n_train=7, n_val=1)
    for k in range(7):
        save_mask(tmp_path / "train" / "masks" / f"train_{k:03d}.png", stripes([255]))
    with pytest.raises(UserError) as err:
        survey_masks(list_source(folder(tmp_path)))
    message = str(err.value)
    assert message.startswith("data: none of the 7 labeled training masks holds a labelled pixel: every pixel is "
                              "data.ignore_index (255) in ")
    assert f"{tmp_path / 'train' / 'masks' / 'train_000.png'}, " in message and "and 2 more" in message
    assert "segadv-data check" in message


def test_only_the_labeled_masks_count(tmp_path, cache):
    """data.labeled_list: the masks of the unlabeled images are never read, so theirs may hold anything."""
    make_folder(tmp_path, n_train=4, n_val=1)
    (tmp_path / "labeled.txt").write_text("train_000\ntrain_001\n")
    for k in (2, 3):
        save_mask(tmp_path / "train" / "masks" / f"train_{k:03d}.png", stripes([255]))
    survey = survey_masks(list_source(folder(tmp_path, labeled_list="labeled.txt")))
    assert (survey.masks, survey.no_labels) == (2, [])


def test_a_label_mapping_that_leaves_nothing_is_named(tmp_path, cache):
    """Cityscapes' labelIds 0-6 (void, ego vehicle, ...) all map to ignore."""
    make_cityscapes(tmp_path, "train", {"aachen": 2})
    make_cityscapes(tmp_path, "val", {"frankfurt": 1})
    for mask in sorted((tmp_path / "gtFine" / "train").rglob("*_labelIds.png")):
        save_mask(mask, stripes([0, 1, 4, 6], 24, 68))
    cfg = DataConfig(kind="cityscapes", root=str(tmp_path), num_classes=19, train_transforms=[], val_transforms=[])
    with pytest.raises(UserError, match=r"none of the 2 labeled training masks holds a labelled pixel: every pixel is "
                                        r"data.ignore_index \(255\) after the cityscapes label mapping in "):
        survey_masks(list_source(cfg))


def test_a_mask_is_decoded_once_until_it_changes(tmp_path, cache):
    make_folder(tmp_path, n_train=5, n_val=1)
    cfg = folder(tmp_path)
    first = survey_masks(list_source(cfg))
    path = cache_path(tmp_path, list_source(cfg).spec)
    assert first.decoded == 5 and path.parent.parent == cache and path.is_file()
    again = survey_masks(list_source(cfg))
    assert (again.decoded, again.masks, again.no_labels) == (0, 5, [])
    np.testing.assert_array_equal(again.present, first.present)
    # train_003 (classes 0, 1) rewritten as classes 0, 2 with the same size and modification time:
    # the change time still shows it.
    mask = tmp_path / "train" / "masks" / "train_003.png"
    stat = os.stat(mask)
    save_mask(mask, stripes([0, 2, 255, 0]))
    os.utime(mask, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(mask).st_size == stat.st_size
    changed = survey_masks(list_source(cfg))
    assert changed.decoded == 1
    assert (changed.present[1], changed.present[2]) == (first.present[1] - 1, first.present[2] + 1)
    save_mask(mask, stripes([255] * 4))
    assert survey_masks(list_source(cfg)).no_labels == ["train_003"]


def test_a_cache_that_cannot_be_read_or_written_costs_only_time(tmp_path, monkeypatch):
    make_folder(tmp_path / "d", n_train=3, n_val=1)
    cfg = folder(tmp_path / "d")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv(CACHE_VARIABLE, str(blocked))
    assert survey_masks(list_source(cfg)).decoded == 3
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    path = cache_path(tmp_path / "d", list_source(cfg).spec)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert survey_masks(list_source(cfg)).decoded == 3
    assert survey_masks(list_source(cfg)).decoded == 0  # rewritten whole


def test_synthetic_data_is_not_surveyed():
    assert survey_masks(list_source(DataConfig(kind="synthetic"))) is None
