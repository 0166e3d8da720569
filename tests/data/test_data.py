"""Tests for segadv.data: the synthetic dataset, config-built augmentations and loaders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from segadv.config.normalization import resolve as resolve_normalization
from segadv.config.schema import DataConfig, SyntheticDataConfig
from segadv.data import (
    SHAPE_CLASSES,
    StreamSpec,
    SyntheticShapes,
    build_dataloaders,
    build_datasets,
    build_stream_loaders,
    build_transform,
    class_names,
)
from segadv.data.augment import seed_transform
from segadv.errors import UserError
from segadv.data.palette import palette

SIZE = 48  # small images keep the whole file fast; the generator is size-agnostic
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
IMAGENET = resolve_normalization("imagenet", MEAN, STD)


def make_ds(split: str = "train", seed: int = 0, num_classes: int = 6, **kw) -> SyntheticShapes:
    return SyntheticShapes(split, 64, SIZE, num_classes, seed, **kw)


def small_cfg(**overrides) -> DataConfig:
    values = dict(
        num_classes=5,
        batch_size=4,
        val_batch_size=3,
        num_workers=0,
        synthetic=SyntheticDataConfig(image_size=32, train_size=12, val_size=7, seed=3),
    )
    values.update(overrides)
    return DataConfig(**values)


# --- synthetic dataset -----------------------------------------------------------------------


def test_same_seed_and_index_is_identical():
    a, b = make_ds(), make_ds()
    for i in (0, 5, 63):
        img_a, mask_a = a.raw(i)
        img_b, mask_b = b.raw(i)
        np.testing.assert_array_equal(img_a, img_b)
        np.testing.assert_array_equal(mask_a, mask_b)


@pytest.mark.parametrize("other", [dict(seed=1), dict(split="val")])
def test_different_seed_or_split_differs(other):
    base = make_ds()
    changed = make_ds(**other)
    for i in range(3):
        assert not np.array_equal(base.raw(i)[0], changed.raw(i)[0])


def test_different_indices_differ():
    ds = make_ds()
    assert not np.array_equal(ds.raw(0)[0], ds.raw(1)[0])


def test_raw_dtypes_and_shapes():
    image, mask = make_ds().raw(0)
    assert image.dtype == np.uint8 and image.shape == (SIZE, SIZE, 3)
    assert mask.dtype == np.uint8 and mask.shape == (SIZE, SIZE)


def test_getitem_without_transform_returns_chw_uint8_and_long_mask():
    ds = make_ds()
    image, mask = ds[0]
    raw_image, raw_mask = ds.raw(0)
    assert image.dtype == torch.uint8 and image.shape == (3, SIZE, SIZE)
    assert mask.dtype == torch.int64 and mask.shape == (SIZE, SIZE)
    np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), raw_image)
    np.testing.assert_array_equal(mask.numpy(), raw_mask)


@pytest.mark.parametrize("num_classes", [2, 4, 6])
def test_mask_values_in_range_and_every_class_appears(num_classes):
    ds = make_ds(num_classes=num_classes)
    seen = set()
    for i in range(50):
        _, mask = ds.raw(i)
        assert mask.max() < num_classes
        seen.update(np.unique(mask).tolist())
    assert seen == set(range(num_classes))


def test_colour_does_not_identify_class():
    """The same class must show up in clearly different colours across samples."""
    ds = make_ds(num_classes=2)  # only circles
    means = [ds.raw(i)[0][ds.raw(i)[1] == 1].mean(axis=0) for i in range(10)]
    assert np.ptp(np.stack(means), axis=0).max() > 100


def test_background_is_textured():
    image, mask = make_ds().raw(0)
    assert image[mask == 0].std(axis=0).min() > 5


def test_class_names_and_out_of_range_index():
    ds = make_ds(num_classes=4)
    assert ds.class_names == list(SHAPE_CLASSES[:4])
    assert ds.class_names[0] == "background"
    assert len(set(SHAPE_CLASSES)) == len(SHAPE_CLASSES) >= 6
    with pytest.raises(IndexError):
        ds.raw(64)


# --- augmentations ---------------------------------------------------------------------------


def _denormalise(image: torch.Tensor) -> np.ndarray:
    mean = torch.tensor(MEAN).view(3, 1, 1) * 255
    std = torch.tensor(STD).view(3, 1, 1) * 255
    return (image * std + mean).permute(1, 2, 0).numpy()


CLASS_COLOURS = palette(6).astype(np.float32) + 40.0  # distinct; none is the pad colour 0


def _paint_and_transform(steps: list[dict], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Images whose pixels are their class colour, so the mask can be read back from the image.

    Returns (denormalised HxWx3 image, HxW mask) pairs after the pipeline.
    """
    transform = build_transform(steps, IMAGENET, "data.train_transforms", ignore_index=255)
    seed_transform(transform, seed)
    ds = make_ds(num_classes=6)
    pairs = []
    for i in range(4):
        _, mask = ds.raw(i)
        out = transform(image=CLASS_COLOURS[mask].astype(np.uint8), mask=mask)
        pairs.append((_denormalise(out["image"]), out["mask"].numpy()))
    return pairs


def _decode(image: np.ndarray) -> np.ndarray:
    """Class id of the nearest class colour, per pixel."""
    dist = np.linalg.norm(image[:, :, None, :] - CLASS_COLOURS[None, None], axis=-1)
    return dist.argmin(axis=-1)


def test_transform_keeps_image_and_mask_aligned_exactly():
    """Flips, 90-degree rotations, padding and crops move pixels without resampling: the mask
    must match the image pixel for pixel, and padding must be ignore_index in the mask."""
    steps = [
        {"name": "HorizontalFlip", "p": 1.0},
        {"name": "RandomRotate90", "p": 1.0},
        {"name": "PadIfNeeded", "min_height": 64, "min_width": 64},
        {"name": "RandomCrop", "height": 56, "width": 56},
    ]
    for image, mask in _paint_and_transform(steps):
        assert mask.shape == image.shape[:2] == (56, 56)
        labelled = mask != 255
        assert labelled.any() and (~labelled).any()
        np.testing.assert_allclose(image[labelled], CLASS_COLOURS[mask[labelled]], atol=1.0)
        np.testing.assert_allclose(image[~labelled], 0.0, atol=1.0)


def test_transform_keeps_image_and_mask_aligned_when_resampling():
    """Scaling and rotating resample the image linearly and the mask with nearest: only edge
    pixels may disagree. A one-pixel shift of the mask scores ~0.96-0.97; aligned ~0.985."""
    steps = [
        {"name": "HorizontalFlip", "p": 0.5},
        {"name": "RandomScale", "scale_limit": (0.3, 0.6), "p": 1.0},
        {"name": "RandomCrop", "height": 40, "width": 40},
        {"name": "Rotate", "limit": (20, 20), "p": 1.0},
    ]
    agree = shifted = total = 0
    for image, mask in _paint_and_transform(steps):
        assert mask.shape == image.shape[:2] == (40, 40)
        labelled = mask != 255
        assert labelled.mean() > 0.5 and (~labelled).any()  # rotation padded some pixels
        assert set(np.unique(mask[labelled])) <= set(range(6))  # nearest: no invented ids
        decoded = _decode(image)
        agree += int((decoded[labelled] == mask[labelled]).sum())
        # The same comparison against the mask moved by one pixel: what misalignment scores.
        shifted += int((decoded[labelled] == np.roll(mask, 1, axis=1)[labelled]).sum())
        total += int(labelled.sum())
    assert agree / total > 0.97
    assert agree / total > shifted / total + 0.005


def test_resize_steps_default_to_pixel_centred_nearest_for_masks():
    """cv2.INTER_NEAREST (albumentations' mask default) is half a pixel off the image's
    INTER_LINEAR when upscaling; INTER_NEAREST_EXACT (6) is aligned. Explicit choices stay."""
    steps = [
        {"name": "RandomScale"},
        {"name": "Resize", "height": 8, "width": 8, "mask_interpolation": 0},
        {"name": "Rotate"},  # warp-based: only 0..4 allowed, keeps albumentations' default
    ]
    compose = build_transform(steps, IMAGENET, "w")
    assert [t.mask_interpolation for t in compose.transforms[:3]] == [6, 0, 0]


def test_unknown_transform_name_suggests_closest():
    with pytest.raises(UserError) as info:
        build_transform([{"name": "HorizontalFlp"}], IMAGENET, "data.train_transforms")
    msg = str(info.value)
    assert "data.train_transforms[0].name" in msg
    assert "'HorizontalFlp'" in msg and "did you mean 'HorizontalFlip'?" in msg


@pytest.mark.parametrize(
    "step, expected",
    [
        ({"name": "RandomScale", "scale_limit": "abc"}, "data.val_transforms[1] (RandomScale)"),
        ({"name": "HorizontalFlip", "p": 2}, "data.val_transforms[1] (HorizontalFlip)"),
        ({"name": "RandomScale", "scale_limt": 0.2},
         "data.val_transforms[1]: Argument(s) 'scale_limt' are not valid for transform RandomScale; "
         "did you mean 'scale_limit'?"),
        ({"name": "Rotate", "bogus": 1, "other": 2}, "'bogus, other' are not valid for transform Rotate"),
        ({"name": "Resize", "height": 8, "width": 8, "mask_interpolation": 1}, "nearest"),
        ({"p": 0.5}, "data.val_transforms[1]: missing 'name'"),
        ("HorizontalFlip", "data.val_transforms[1]: expected a mapping"),
        ({"name": "Normalize"}, "appended automatically"),
    ],
)
def test_bad_step_is_user_error_naming_index(step, expected):
    steps = [{"name": "HorizontalFlip"}, step]
    with pytest.raises(UserError) as info:
        build_transform(steps, IMAGENET, "data.val_transforms")
    msg = str(info.value)
    assert expected in msg
    assert "data.val_transforms[1]" in msg
    assert "\n" not in msg


def test_pipeline_ends_with_normalize_and_tensor():
    out = build_transform([], IMAGENET, "w")(
        image=np.full((8, 8, 3), 255, np.uint8), mask=np.zeros((8, 8), np.uint8)
    )
    assert out["image"].dtype == torch.float32 and out["image"].shape == (3, 8, 8)
    expected = (1 - np.array(MEAN)) / np.array(STD)
    np.testing.assert_allclose(out["image"][:, 0, 0].numpy(), expected, rtol=1e-5)


# --- datasets and loaders --------------------------------------------------------------------


def test_build_datasets_and_class_names():
    cfg = small_cfg()
    train, val = build_datasets(cfg)
    assert (len(train), len(val)) == (12, 7)
    image, mask = train[0]
    assert image.dtype == torch.float32 and image.shape == (3, 32, 32)
    assert mask.dtype == torch.int64 and mask.shape == (32, 32)
    assert class_names(cfg) == list(SHAPE_CLASSES[:5])


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(num_classes=len(SHAPE_CLASSES) + 1), "data.num_classes"),
        (dict(batch_size=13), "data.batch_size"),
        (dict(ignore_index=2), "data.ignore_index"),
        (dict(train_transforms=[{"name": "RandomCrop", "height": 64, "width": 64}]),
         "data.train_transforms"),
    ],
)
def test_config_errors_name_the_key(overrides, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        build_dataloaders(small_cfg(**overrides), seed=0, pin_memory=False)


def test_loaders_batch_shapes_and_dtypes():
    train_loader, val_loader = build_dataloaders(small_cfg(), seed=0, pin_memory=False)
    batches = list(train_loader)
    assert len(batches) == 3  # 12 // 4, drop_last
    image, mask = batches[0]
    assert image.shape == (4, 3, 32, 32) and image.dtype == torch.float32
    assert mask.shape == (4, 32, 32) and mask.dtype == torch.int64
    val_sizes = [len(m) for _, m in val_loader]
    assert val_sizes == [3, 3, 1]  # no drop_last


def _epoch_masks(seed: int) -> list[torch.Tensor]:
    cfg = small_cfg(train_transforms=[])  # no random augmentation: order is all that varies
    train_loader, _ = build_dataloaders(cfg, seed=seed, pin_memory=False)
    return [mask for _, mask in train_loader]


def test_shuffle_is_deterministic_per_seed():
    first, again, other = _epoch_masks(0), _epoch_masks(0), _epoch_masks(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


def test_augmentation_is_deterministic_per_seed():
    def first_batch(seed: int) -> torch.Tensor:
        cfg = small_cfg(train_transforms=[{"name": "HorizontalFlip", "p": 0.5}])
        train_loader, _ = build_dataloaders(cfg, seed=seed, pin_memory=False)
        return torch.cat([image for image, _ in train_loader])

    assert torch.equal(first_batch(5), first_batch(5))


def test_val_loader_does_not_consume_global_rng():
    _, val_loader = build_dataloaders(small_cfg(), seed=0, pin_memory=False)
    state = torch.get_rng_state()
    list(val_loader)
    assert torch.equal(state, torch.get_rng_state())


def test_worker_processes_are_deterministic_and_independent():
    def epoch(num_workers: int, transforms: list[dict]) -> list[torch.Tensor]:
        cfg = small_cfg(num_workers=num_workers, train_transforms=transforms)
        train_loader, _ = build_dataloaders(cfg, seed=7, pin_memory=False)
        return [mask for _, mask in train_loader]

    flips = [{"name": "HorizontalFlip", "p": 0.5}]
    flipped_run = epoch(2, flips)
    assert all(torch.equal(a, b) for a, b in zip(flipped_run, epoch(2, flips)))
    plain = epoch(0, [])
    assert all(torch.equal(a, b) for a, b in zip(plain, epoch(2, [])))
    # Batches 0 and 1 come from different workers: their flip decisions must not be copies of
    # each other (they would be if every worker inherited the same augmentation RNG state).
    flip_bits = [
        [not torch.equal(m_aug, m) for m_aug, m in zip(aug, ref)]
        for aug, ref in zip(flipped_run[:2], plain[:2])
    ]
    assert flip_bits[0] != flip_bits[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_labeled_fraction_loads_with_per_sample_seeded_augmentation(num_workers):
    """A labeled subset used to reach the DataLoader through Subset.__getitems__ with (index, seed)
    keys: a crash on the first batch. Each sample is still augmented from its own seed, so the
    batches do not depend on the number of workers."""
    flips = [{"name": "HorizontalFlip", "p": 0.5}]

    def epoch(workers: int) -> list[torch.Tensor]:
        cfg = small_cfg(num_workers=workers, train_transforms=flips, labeled_fraction=0.5)
        train_loader, _ = build_dataloaders(cfg, seed=3, pin_memory=False)
        return [image for image, _ in train_loader]

    batches = epoch(num_workers)
    assert len(batches) == 1  # 6 labeled of 12 -> one full batch of 4
    assert all(torch.equal(a, b) for a, b in zip(batches, epoch(0)))
    flipped = small_cfg(train_transforms=flips, labeled_fraction=0.5)
    seeded = build_dataloaders(flipped, seed=3, pin_memory=False)[0].dataset
    key = (1, 12345)
    assert torch.equal(seeded[key][0], seeded[key][0])  # the same (index, seed), the same sample


# --- streams as a method declares them -------------------------------------------------------


def _order(loader) -> list[int]:
    return [index for index, _ in loader.sampler]


def test_streams_are_built_from_their_declarations_by_pool_and_seed_word():
    cfg = small_cfg(labeled_fraction=0.5, batch_size=2)
    specs = (StreamSpec("a", "labeled"), StreamSpec("b", "labeled", seed_word=2),
             StreamSpec("c", "unlabeled", seed_word=1))
    loaders, _ = build_stream_loaders(cfg, specs, seed=3, pin_memory=False, batch_sizes={"c": 3})
    assert list(loaders) == ["a", "b", "c"]
    labeled, _ = build_dataloaders(cfg, seed=3, pin_memory=False)
    assert _order(loaders["a"]) == _order(labeled)  # no seed word: the training seed itself
    assert sorted(_order(loaders["b"])) == sorted(_order(labeled)) != _order(loaders["b"])
    assert (len(loaders["c"].dataset), loaders["c"].batch_size) == (6, 3)
    assert next(iter(loaders["c"])).shape == (3, 3, 32, 32)  # the unlabeled pool: images only


@pytest.mark.parametrize(
    "overrides, spec, batch_sizes, message",
    [
        (dict(labeled_fraction=0.5), StreamSpec("u", "unlabeled", 1, "method.m.unlabeled_batch_size"), {"u": 7},
         "method.m.unlabeled_batch_size: 7 is larger than the u set (6 unlabeled samples)"),
        ({}, StreamSpec("g", "labeled", 2), {"g": 13},
         "data.batch_size: 13 is larger than the g set (data.synthetic.train_size = 12)"),
        ({}, StreamSpec("u", "unlabeled", 1), {}, "data.labeled_fraction: the method draws unlabeled images"),
        ({}, StreamSpec("t", "target", 3), {}, "target_data: the method adapts to a target domain"),
    ],
)
def test_stream_errors_name_the_declared_key(overrides, spec, batch_sizes, message):
    with pytest.raises(UserError) as info:
        build_stream_loaders(small_cfg(**overrides), (spec,), seed=0, pin_memory=False, batch_sizes=batch_sizes)
    assert message in str(info.value)


def test_data_imports_nothing_from_methods():
    """Data knows streams only as the methods declare them (``StreamSpec``)."""
    data_dir = Path(build_stream_loaders.__code__.co_filename).parent
    assert [p.name for p in sorted(data_dir.glob("*.py")) if "segadv.methods" in p.read_text()] == []


# --- data.normalization ----------------------------------------------------------------------


def _reference_input(rgb: np.ndarray, name: str) -> np.ndarray:
    """The references' own arithmetic on an RGB uint8 image, CHW float32: AdaptSegNet and ADVENT
    reverse PIL's RGB to BGR and subtract IMG_MEAN (dataset/cityscapes_dataset.py:50-51,
    advent/dataset/base_dataset.py:36-37); AdvSemiSeg subtracts it from cv2's BGR and then reverses
    the channels (dataset/voc_dataset.py:48-74)."""
    img_mean = np.array((104.00698793, 116.66876762, 122.67891434), dtype=np.float32)
    image = np.asarray(rgb, np.float32)
    if name == "caffe_bgr":
        image = image[:, :, ::-1] - img_mean
    else:  # caffe_rgb
        image = (image[:, :, ::-1] - img_mean)[:, :, ::-1]
    return image.transpose(2, 0, 1)


@pytest.mark.parametrize("name", ["caffe_bgr", "caffe_rgb"])
def test_the_caffe_normalizations_compute_the_references_input(name):
    rgb = np.random.default_rng(0).integers(0, 256, (6, 7, 3), dtype=np.uint8)
    rgb[0, 0] = (255, 0, 10)  # a pixel whose channel order shows
    cfg = DataConfig(normalization=name)
    out = build_transform([], cfg.input_normalization, "w")(image=rgb, mask=np.zeros((6, 7), np.uint8))["image"]
    np.testing.assert_allclose(out.numpy(), _reference_input(rgb, name), atol=2e-4, rtol=0)


def test_imagenet_is_the_default_and_reads_data_mean_and_std():
    norm = DataConfig().input_normalization
    assert (norm.name, norm.channels, list(norm.mean), list(norm.std)) == ("imagenet", "RGB", MEAN, STD)
    custom = DataConfig(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25]).input_normalization
    assert (custom.mean, custom.std) == ((0.5,) * 3, (0.25,) * 3)


def test_a_normalization_with_its_own_mean_refuses_data_mean_naming_it():
    from segadv.config import load_config

    with pytest.raises(UserError, match=r"data\.std: normalization caffe_bgr fixes its own mean and std"):
        load_config(None, ["data.normalization=caffe_bgr", "data.std=[0.5, 0.5, 0.5]"])
    with pytest.raises(UserError, match=r"data\.normalization: expected 'imagenet', 'caffe_bgr' or 'caffe_rgb'"):
        load_config(None, ["data.normalization=bgr"])


def test_the_schema_names_every_row_of_the_table():
    from typing import get_args

    from segadv.config.normalization import NORMALIZATIONS

    assert get_args(DataConfig.model_fields["normalization"].annotation) == tuple(NORMALIZATIONS)


def test_the_target_must_reach_g_as_the_source_does():
    from segadv.config import load_config
    from segadv.data.catalog import Catalog

    sys_path_helpers = __import__("helpers")
    cfg = load_config(None, [*sys_path_helpers.UDA_OVERRIDES, "target_data.normalization=caffe_bgr"])
    with pytest.raises(UserError, match=r"target_data\.normalization: .*data has imagenet"):
        Catalog.open(cfg.data, cfg.target_data)


def test_pipeline_size_follows_the_steps_whose_settings_say_it():
    """The size a pipeline makes of an image, from its steps' settings alone (what a start checks
    G's input sizes with): fixed-size steps, PadIfNeeded to its minimum (1024 where not given) or
    to a multiple of its divisor, size-keeping steps; unknown (None) after a step whose output
    depends on more than its settings. The real pipeline agrees."""
    from segadv.data.augment import build_transform, pipeline_size

    pad_min = {"name": "PadIfNeeded", "min_height": 504, "min_width": 504, "position": "top_left"}
    pad_div = {"name": "PadIfNeeded", "min_height": None, "min_width": None, "pad_height_divisor": 14,
               "pad_width_divisor": 14}
    cases = [
        ([], (60, 61), (60, 61)),
        ([pad_min], (375, 500), (504, 504)),
        ([pad_min], (375, 600), (504, 600)),
        ([pad_div], (1024, 2048), (1036, 2058)),
        ([{"name": "PadIfNeeded"}], (500, 700), (1024, 1024)),
        ([{"name": "Resize", "height": 40, "width": 50}, {"name": "HorizontalFlip", "p": 0.5},
          {"name": "ColorJitter"}], (300, 200), (40, 50)),
        ([{"name": "CenterCrop", "height": 32, "width": 48}, pad_div], (100, 100), (42, 56)),
    ]
    for steps, size, made in cases:
        assert pipeline_size(steps, size) == made
        image = np.zeros((*size, 3), np.uint8)
        out = build_transform(steps, resolve_normalization("imagenet", [0.5] * 3, [0.5] * 3), "data.val_transforms")(
            image=image, mask=np.zeros(size, np.uint8))
        assert tuple(out["image"].shape[1:]) == made
    assert pipeline_size([{"name": "RandomScale", "scale_limit": 0.5}], (60, 60)) is None
    assert pipeline_size([{"name": "LongestMaxSize", "max_size": 32}, pad_div], (60, 60)) is None
