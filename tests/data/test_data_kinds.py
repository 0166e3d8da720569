"""Dataset kinds on disk (VOC, SBD, Cityscapes, GTA5, folder), splits, augmentation alignment."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_builders import (
    CS_IDS,
    H,
    W,
    make_cityscapes,
    make_folder,
    make_gta5,
    make_voc,
    save_image,
    save_mask,
    stripes,
    write_list,
)
from segadv.config import load_config
from segadv.config.schema import DataConfig
from segadv.data import build_data, build_dataloaders, class_names
from segadv.data.palette import palette
from segadv.data.augment import seed_transform
from segadv.data.layouts import CITYSCAPES_CLASSES, CITYSCAPES_LABELS, VOC_CLASSES
from segadv.errors import UserError

NUM_CLASSES = {"voc": 21, "cityscapes": 19, "gta5": 19, "folder": 3}


def data_cfg(kind: str, root, **kw) -> DataConfig:
    values = dict(
        kind=kind, root=str(root), num_classes=NUM_CLASSES[kind], batch_size=2, val_batch_size=2,
        num_workers=0, train_transforms=[], val_transforms=[],
    )
    values.update(kw)
    return DataConfig(**values)


def folder_split(split: str, list_file=None) -> dict:
    return {"images": f"{split}/images", "masks": f"{split}/masks", "list_file": list_file}


# --- VOC ---------------------------------------------------------------------------------------


def test_voc_lengths_ids_palette_indices_and_boundary(tmp_path):
    masks = make_voc(tmp_path, train=["2007_000032", "2007_000039", "2008_000002"], val=["2007_000033", "2009_000001"])
    bundle = build_data(data_cfg("voc", tmp_path))
    train, val = bundle.train, bundle.val
    assert (len(train), len(val)) == (3, 2)
    assert train.ids == ["2007_000032", "2007_000039", "2008_000002"]  # list-file order
    assert val.ids == ["2007_000033", "2009_000001"]
    assert bundle.unlabeled is None
    for ds in (train, val):
        for i, sample_id in enumerate(ds.ids):
            image, mask = ds.raw(i)
            assert image.shape == (H, W, 3) and image.dtype == np.uint8
            # Palette indices are the class ids; the boundary stays 255 (ignore).
            np.testing.assert_array_equal(mask, masks[sample_id])
    image, mask = train[0]
    assert image.shape == (3, H, W) and mask.dtype == torch.int64
    assert set(torch.unique(mask).tolist()) == {0, 1, 255}
    assert class_names(data_cfg("voc", tmp_path)) == list(VOC_CLASSES)


def test_voc_ignore_index_other_than_255_is_remapped(tmp_path):
    masks = make_voc(tmp_path, train=["a", "b"], val=["c"])
    train = build_data(data_cfg("voc", tmp_path, ignore_index=250)).train
    _, mask = train.raw(0)
    expected = masks["a"].copy()
    expected[expected == 255] = 250
    np.testing.assert_array_equal(mask, expected)


def test_voc_sbd_augmented_reads_train_aug_and_segmentation_class_aug(tmp_path):
    devkit = tmp_path / "VOCdevkit" / "VOC2012"
    aug = ["2007_000032", "2008_000123", "2011_000999", "2012_000001"]
    masks = make_voc(devkit, train=["2007_000032"], val=["2007_000033"], aug=aug)
    # data.root may be the directory holding VOCdevkit.
    bundle = build_data(data_cfg("voc", tmp_path, voc={"augmented": True, "val_split": "val"}))
    assert bundle.train.ids == aug
    assert all(s.mask.parent.name == "SegmentationClassAug" for s in bundle.train.samples)
    assert all(s.mask.parent.name == "SegmentationClass" for s in bundle.val.samples)
    np.testing.assert_array_equal(bundle.train.raw(1)[1], masks["2008_000123"])


def test_voc_wrong_num_classes_and_not_a_voc_root(tmp_path):
    make_voc(tmp_path / "v", train=["a"], val=["b"])
    with pytest.raises(UserError, match=r"data\.num_classes: data\.kind=voc has 21 classes"):
        build_data(data_cfg("voc", tmp_path / "v", num_classes=5))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"data\.root: .*empty is not a VOC2012 directory"):
        build_data(data_cfg("voc", tmp_path / "empty"))
    with pytest.raises(UserError, match=r"data\.root: required for data\.kind=voc"):
        build_data(DataConfig(kind="voc", num_classes=21))
    with pytest.raises(UserError, match=r"data\.voc\.train_split: list file .*trainx\.txt does not exist"):
        build_data(data_cfg("voc", tmp_path / "v", voc={"train_split": "trainx"}))


# --- Cityscapes and GTA5 -------------------------------------------------------------------------


def expected_train_ids(ignore: int = 255) -> np.ndarray:
    table = {label_id: train_id for _, label_id, train_id in CITYSCAPES_LABELS}
    return np.array([table[i] if table[i] != 255 else ignore for i in CS_IDS], dtype=np.uint8)


def check_cityscapes_mask(mask: np.ndarray, ignore: int = 255) -> None:
    # Each stripe of labelId i must become its official trainId; read back one pixel per stripe.
    cols = np.array_split(np.arange(mask.shape[1]), len(CS_IDS))
    got = np.array([mask[0, c[0]] for c in cols], dtype=np.uint8)
    np.testing.assert_array_equal(got, expected_train_ids(ignore))


def test_cityscapes_layout_ids_and_official_train_ids(tmp_path):
    train_ids = make_cityscapes(tmp_path, "train", {"aachen": 2, "bochum": 1})
    val_ids = make_cityscapes(tmp_path, "val", {"frankfurt": 2})
    bundle = build_data(data_cfg("cityscapes", tmp_path))
    assert bundle.train.ids == train_ids and bundle.val.ids == val_ids
    assert bundle.train.ids[0] == "aachen_000000_000019"
    assert all(s.mask.name.endswith("_gtFine_labelIds.png") for s in bundle.train.samples)
    _, mask = bundle.train.raw(0)
    check_cityscapes_mask(mask)
    assert set(np.unique(mask)) == set(range(19)) | {255}
    assert class_names(data_cfg("cityscapes", tmp_path)) == list(CITYSCAPES_CLASSES)
    assert CITYSCAPES_CLASSES[0] == "road" and CITYSCAPES_CLASSES[13] == "car" and len(CITYSCAPES_CLASSES) == 19
    # ignore_index other than 255: the 15 unmapped ids become it.
    _, mask = build_data(data_cfg("cityscapes", tmp_path, ignore_index=200)).val.raw(0)
    check_cityscapes_mask(mask, ignore=200)


def test_cityscapes_rejects_train_id_masks(tmp_path):
    """trainIds files (0..18, 255) are not labelIds: 255 is not an official id, so say so."""
    make_cityscapes(tmp_path, "train", {"aachen": 2})
    make_cityscapes(tmp_path, "val", {"frankfurt": 1})
    bad = tmp_path / "gtFine" / "train" / "aachen" / "aachen_000001_000019_gtFine_labelIds.png"
    save_mask(bad, stripes([0, 13, 255], H, 68))
    train = build_data(data_cfg("cityscapes", tmp_path)).train
    with pytest.raises(UserError) as info:
        train[1]
    msg = str(info.value)
    assert "aachen_000001_000019_gtFine_labelIds.png" in msg and "[255]" in msg and "labelIds" in msg


def test_gta5_palette_labels_map_to_cityscapes_train_ids_and_val_holdout(tmp_path):
    ids = make_gta5(tmp_path, 6)
    bundle = build_data(data_cfg("gta5", tmp_path, gta5={"val_every": 3}))
    assert bundle.val.ids == [ids[2], ids[5]]
    assert bundle.train.ids == [ids[0], ids[1], ids[3], ids[4]]
    check_cityscapes_mask(bundle.train.raw(0)[1])
    assert class_names(data_cfg("gta5", tmp_path)) == list(CITYSCAPES_CLASSES)

    write_list(tmp_path / "train.txt", ids[:2])
    write_list(tmp_path / "val.txt", [ids[5]])
    listed = build_data(data_cfg("gta5", tmp_path, gta5={"train_list": "train.txt", "val_list": "val.txt"}))
    assert (listed.train.ids, listed.val.ids) == (ids[:2], [ids[5]])


# --- folder ------------------------------------------------------------------------------------


def test_folder_matches_by_stem_and_list_files(tmp_path):
    ids = make_folder(tmp_path, n_train=4, n_val=2)
    (tmp_path / "train" / "images" / "README.txt").write_text("not an image")
    bundle = build_data(data_cfg("folder", tmp_path))
    assert bundle.train.ids == ids["train"] and bundle.val.ids == ids["val"]
    image, mask = bundle.val.raw(1)
    np.testing.assert_array_equal(mask, stripes([1, 2, 255, 0]))
    assert class_names(data_cfg("folder", tmp_path)) == ["class_0", "class_1", "class_2"]
    named = data_cfg("folder", tmp_path, folder={"class_names": ["bg", "a", "b"]})
    assert class_names(named) == ["bg", "a", "b"]
    with pytest.raises(UserError, match=r"data\.folder\.class_names: 2 names for data\.num_classes=3"):
        class_names(data_cfg("folder", tmp_path, folder={"class_names": ["bg", "a"]}))

    # Both splits from one pool, chosen by list files.
    write_list(tmp_path / "lists" / "a.txt", ["train_002", "train_000"])
    write_list(tmp_path / "lists" / "b.txt", ["# comment", "", "train_001"])
    listed = data_cfg("folder", tmp_path, folder={
        "train": folder_split("train", "lists/a.txt"), "val": folder_split("train", "lists/b.txt"),
    })
    bundle = build_data(listed)
    assert (bundle.train.ids, bundle.val.ids) == (["train_002", "train_000"], ["train_001"])


# --- labeled / unlabeled split -----------------------------------------------------------------


def test_labeled_fraction_is_seeded_saved_and_unlabeled_masks_never_read(tmp_path, monkeypatch):
    ids = make_folder(tmp_path / "d", n_train=10, n_val=2)
    run = tmp_path / "run"
    run.mkdir()
    cfg = data_cfg("folder", tmp_path / "d", labeled_fraction=0.3, labeled_seed=4)
    first = build_data(cfg, run_dir=run)
    again = build_data(cfg)
    other = build_data(data_cfg("folder", tmp_path / "d", labeled_fraction=0.3, labeled_seed=5))
    assert len(first.train) == 3 and len(first.unlabeled) == 7
    assert first.train.ids == again.train.ids != other.train.ids
    assert sorted(first.train.ids + first.unlabeled.ids) == ids["train"]
    saved = json.loads((run / "data_split.json").read_text())
    assert saved["labeled"] == first.train.ids and saved["unlabeled"] == first.unlabeled.ids
    assert saved["counts"] == {"labeled": 3, "unlabeled": 7, "val": 2}
    assert saved["labeled_fraction"] == 0.3 and saved["labeled_seed"] == 4

    # Unlabeled masks may be missing or broken: they are never opened.
    for sample_id in first.unlabeled.ids:
        (tmp_path / "d" / "train" / "masks" / f"{sample_id}.png").write_bytes(b"garbage")
    opened = []
    import segadv.data.files as files

    real_open = files._open
    monkeypatch.setattr(files, "_open", lambda path, what: (opened.append(path), real_open(path, what))[1])
    bundle = build_data(cfg)
    image = bundle.unlabeled[0]
    assert image.shape == (3, H, W)
    unlabeled_masks = {f"{i}.png" for i in first.unlabeled.ids}
    assert not [p for p in opened if p.name in unlabeled_masks and p.parent.name == "masks"]


def test_labeled_list_and_its_missing_ids(tmp_path):
    make_folder(tmp_path, n_train=5, n_val=2)
    write_list(tmp_path / "labeled.txt", ["train_003", "train_001"])
    bundle = build_data(data_cfg("folder", tmp_path, labeled_list="labeled.txt"))
    assert bundle.train.ids == ["train_001", "train_003"]
    assert bundle.unlabeled.ids == ["train_000", "train_002", "train_004"]

    write_list(tmp_path / "labeled.txt", ["train_003", "ghost"])
    with pytest.raises(UserError) as info:
        build_data(data_cfg("folder", tmp_path, labeled_list="labeled.txt"))
    assert "labeled.txt names id 'ghost', which is not in the train split" in str(info.value)
    skipped = build_data(data_cfg("folder", tmp_path, labeled_list="labeled.txt", on_error="skip"))
    assert skipped.train.ids == ["train_003"] and skipped.skipped.count == 1

    with pytest.raises(UserError, match="set one of them, not both"):
        build_data(data_cfg("folder", tmp_path, labeled_list="labeled.txt", labeled_fraction=0.5))


def test_synthetic_labeled_fraction(tmp_path):
    cfg = DataConfig(num_workers=0, batch_size=2, labeled_fraction=0.25,
                     synthetic={"image_size": 32, "train_size": 8, "val_size": 2, "seed": 0})
    bundle = build_data(cfg, run_dir=tmp_path)
    assert (len(bundle.train), len(bundle.unlabeled)) == (2, 6)
    image, mask = bundle.train[0]
    assert image.shape == (3, 32, 32) and mask.shape == (32, 32)
    assert bundle.unlabeled[0].shape == (3, 32, 32)
    assert json.loads((tmp_path / "data_split.json").read_text())["counts"]["labeled"] == 2


# --- augmentation ------------------------------------------------------------------------------

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
COLOURS = palette(4).astype(np.float32) * 0.5 + 60.0  # distinct, none near the pad colour 0


def content_folder(root, n: int = 4, h: int = 40, w: int = 56):
    """Images whose pixels are their class colour: the mask can be read back from the image."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for k in range(n):
            mask = np.zeros((h, w), np.uint8)
            for _ in range(4):
                y, x = rng.integers(0, h - 10), rng.integers(0, w - 12)
                mask[y : y + rng.integers(6, 14), x : x + rng.integers(6, 20)] = rng.integers(1, 4)
            save_image(root / split / "images" / f"{k}.png", COLOURS[mask].astype(np.uint8))
            save_mask(root / split / "masks" / f"{k}.png", mask)


def decode(image: torch.Tensor) -> np.ndarray:
    mean, std = torch.tensor(MEAN).view(3, 1, 1) * 255, torch.tensor(STD).view(3, 1, 1) * 255
    pixels = (image * std + mean).permute(1, 2, 0).numpy()
    return np.linalg.norm(pixels[:, :, None, :] - COLOURS[None, None], axis=-1).argmin(-1), pixels


def test_config_pipeline_keeps_image_and_mask_aligned_and_pads_mask_with_ignore(tmp_path):
    content_folder(tmp_path)
    steps = [
        {"name": "RandomScale", "scale_limit": [-0.3, 0.6], "p": 1.0},
        {"name": "PadIfNeeded", "min_height": 64, "min_width": 64},
        {"name": "RandomCrop", "height": 48, "width": 48},
        {"name": "HorizontalFlip", "p": 0.5},
    ]
    cfg = data_cfg("folder", tmp_path, num_classes=4, mean=MEAN, std=STD, train_transforms=steps)
    train = build_data(cfg).train
    agree = total = padded = 0
    for epoch in range(3):
        seed_transform(train.transform, epoch)
        for i in range(len(train)):
            image, mask = train[i]
            assert image.shape == (3, 48, 48) and mask.shape == (48, 48)
            labelled = (mask != 255).numpy()
            assert set(np.unique(mask.numpy()[labelled])) <= {0, 1, 2, 3}  # nearest only
            ids, pixels = decode(image)
            agree += int((ids[labelled] == mask.numpy()[labelled]).sum())
            total += int(labelled.sum())
            padded += int((~labelled).sum())
            np.testing.assert_allclose(pixels[~labelled], 0.0, atol=1.0)  # pad: image 0, mask 255
    assert padded > 0
    assert agree / total > 0.97


def test_colour_jitter_changes_the_image_never_the_mask(tmp_path):
    content_folder(tmp_path, n=2)
    jitter = [{"name": "ColorJitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1, "p": 1.0}]
    cfg = data_cfg("folder", tmp_path, num_classes=4, mean=MEAN, std=STD, train_transforms=jitter)
    plain = build_data(data_cfg("folder", tmp_path, num_classes=4, mean=MEAN, std=STD)).train
    train = build_data(cfg).train
    for i in range(2):
        (img_j, mask_j), (img, mask) = train[i], plain[i]
        assert torch.equal(mask_j, mask) and not torch.allclose(img_j, img)


# --- loaders -----------------------------------------------------------------------------------


def test_loader_settings_drop_last_and_rank_shards(tmp_path):
    make_folder(tmp_path, n_train=7, n_val=5)
    cfg = data_cfg("folder", tmp_path, batch_size=3, val_batch_size=2, drop_last=False)
    train_loader, val_loader = build_dataloaders(cfg, seed=0, pin_memory=False)
    assert [len(m) for _, m in train_loader] == [3, 3, 1]
    assert not train_loader.pin_memory
    assert not build_dataloaders(cfg.model_copy(update={"pin_memory": False}), seed=0, pin_memory=True)[0].pin_memory

    workers = cfg.model_copy(update={"num_workers": 1, "prefetch_factor": 3, "persistent_workers": False})
    loader, _ = build_dataloaders(workers, seed=0, pin_memory=False)
    assert (loader.prefetch_factor, loader.persistent_workers) == (3, False)

    seen_val, seen_train = [], []
    for rank in range(2):
        t, v = build_dataloaders(cfg, seed=0, pin_memory=False, rank=rank, world_size=2)
        seen_val.append(list(iter(v.sampler)))
        seen_train.append([k[0] for k in t.sampler])
    assert sorted(seen_val[0] + seen_val[1]) == list(range(5))  # every val sample once
    assert not set(seen_train[0]) & set(seen_train[1]) and len(seen_train[0]) == 3


@pytest.mark.parametrize("ignore", [-1, 2, 256])
def test_ignore_index_must_fit_an_8bit_mask_and_not_be_a_class(tmp_path, ignore):
    # -1 and 256 are refused by the schema, 2 (a class id) by the data checks: both name the key.
    with pytest.raises(UserError, match=r"data\.ignore_index"):
        cfg = load_config(None, ["data.kind=folder", f"data.root={tmp_path}", f"data.ignore_index={ignore}"])
        class_names(cfg.data)


def test_worker_seeds_depend_on_seed_and_rank(tmp_path):
    make_folder(tmp_path, n_train=4, n_val=2)
    cfg = data_cfg("folder", tmp_path, num_workers=1)

    def seed_of(seed, rank):
        return build_dataloaders(cfg, seed=seed, pin_memory=False, rank=rank, world_size=2)[0].generator.initial_seed()

    assert seed_of(0, 0) == seed_of(0, 0)
    assert len({seed_of(0, 0), seed_of(0, 1), seed_of(1, 0)}) == 3
