"""Datasets and data loaders from a ``DataConfig``, with config errors reported by key.

Reproducibility: the data itself is a pure function of ``(data.synthetic.seed, split, index)``;
the shuffle order, the worker seeds and the augmentation RNGs all derive from the ``seed``
given to ``build_dataloaders`` (the training seed), never from global RNG state. That also means
iterating the val loader does not consume the global torch RNG that training relies on.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

from segadv.config.schema import DataConfig
from segadv.data.augment import build_transform, one_line, seed_transform
from segadv.data.synthetic import SHAPE_CLASSES, SyntheticShapes, palette
from segadv.errors import UserError

__all__ = ["build_datasets", "build_dataloaders", "class_names", "palette", "seed_worker"]

log = logging.getLogger(__name__)

_TRAIN_KEY = "data.train_transforms"
_VAL_KEY = "data.val_transforms"


def _check_config(cfg: DataConfig) -> None:
    """Cross-field checks the schema cannot express, each naming the key at fault."""
    if cfg.kind != "synthetic":
        raise UserError(f"data.kind: unsupported dataset kind {cfg.kind!r} (supported: synthetic)")
    if cfg.num_classes > len(SHAPE_CLASSES):
        raise UserError(
            f"data.num_classes: synthetic shapes have at most {len(SHAPE_CLASSES)} classes "
            f"({', '.join(SHAPE_CLASSES)}), got {cfg.num_classes}"
        )
    if 0 <= cfg.ignore_index < cfg.num_classes:
        raise UserError(
            f"data.ignore_index: {cfg.ignore_index} is a real class id "
            f"(classes are 0..{cfg.num_classes - 1}); use e.g. 255"
        )
    for key, values in (("data.mean", cfg.mean), ("data.std", cfg.std)):
        if len(values) != 3:
            raise UserError(f"{key}: expected 3 values (one per RGB channel), got {len(values)}")
    if any(s <= 0 for s in cfg.std):
        raise UserError(f"data.std: every value must be > 0, got {cfg.std}")


def class_names(cfg: DataConfig) -> list[str]:
    """The class names for ``cfg``, index = class id (0 is background)."""
    _check_config(cfg)
    return list(SHAPE_CLASSES[: cfg.num_classes])


def _probe(dataset: SyntheticShapes, key: str) -> None:
    """Run sample 0 through the pipeline now, so a broken step fails at startup by config key
    rather than later inside a DataLoader worker with a long traceback."""
    try:
        image, mask = dataset[0]
    except UserError:
        raise
    except Exception as err:
        raise UserError(
            f"{key}: pipeline failed on a {dataset.image_size}x{dataset.image_size} "
            f"{dataset.split} sample: {one_line(err)}"
        ) from err
    if image.ndim != 3 or mask.ndim != 2 or tuple(image.shape[1:]) != tuple(mask.shape):
        raise UserError(
            f"{key}: pipeline produced image {tuple(image.shape)} and mask {tuple(mask.shape)}; "
            "expected a 3xHxW image and an HxW mask of the same size"
        )


def build_datasets(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    """``(train, val)`` datasets with the train and val augmentation pipelines attached."""
    _check_config(cfg)
    syn = cfg.synthetic
    common: dict[str, Any] = dict(
        image_size=syn.image_size, num_classes=cfg.num_classes, seed=syn.seed
    )
    train_tf = build_transform(
        cfg.train_transforms, cfg.mean, cfg.std, _TRAIN_KEY, ignore_index=cfg.ignore_index
    )
    val_tf = build_transform(
        cfg.val_transforms, cfg.mean, cfg.std, _VAL_KEY, ignore_index=cfg.ignore_index
    )
    train = SyntheticShapes("train", syn.train_size, transform=train_tf, **common)
    val = SyntheticShapes("val", syn.val_size, transform=val_tf, **common)
    _probe(train, _TRAIN_KEY)
    _probe(val, _VAL_KEY)
    log.debug("datasets: %r, %r", train, val)
    return train, val


def seed_worker(worker_id: int) -> None:
    """Per-worker seeding: numpy/random from torch's per-worker seed, plus the augmentation RNG.

    Without the last part every forked worker would inherit the same albumentations RNG state
    and apply identical augmentation sequences.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    info = get_worker_info()
    if info is not None:
        seed_transform(getattr(info.dataset, "transform", None), seed)


class SameSizeCollate:
    """``default_collate`` that explains size mismatches in config terms.

    A pipeline with e.g. ``RandomScale`` but no crop/pad yields differently sized samples, and
    torch's own error ("stack expects each tensor to be equal size") does not say which key to fix.
    A class (not a closure) so it pickles into worker processes.
    """

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, batch: Sequence[Any]) -> Any:
        shapes = {tuple(sample[0].shape) for sample in batch}
        if len(shapes) > 1:
            raise UserError(
                f"{self.key}: samples in one batch have different sizes {sorted(shapes)}; "
                "end the pipeline with a fixed-size step (e.g. RandomCrop / PadIfNeeded / Resize)"
            )
        return default_collate(batch)


def _generator(seed: int) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(int(seed) % 2**63)
    return gen


def build_dataloaders(
    cfg: DataConfig, *, seed: int, pin_memory: bool
) -> tuple[DataLoader, DataLoader]:
    """``(train, val)`` loaders; train shuffles deterministically from ``seed`` and drops the
    last partial batch (the discriminator and BatchNorm both prefer full batches)."""
    train, val = build_datasets(cfg)
    if cfg.batch_size > len(train):
        raise UserError(
            f"data.batch_size: {cfg.batch_size} is larger than the training set "
            f"(data.synthetic.train_size = {len(train)}), so no full batch exists"
        )
    # Seed the in-process pipelines too: with num_workers = 0 no worker_init_fn runs.
    seed_transform(train.transform, seed)
    seed_transform(val.transform, seed + 1)
    workers: dict[str, Any] = dict(
        num_workers=cfg.num_workers,
        persistent_workers=cfg.num_workers > 0,
        worker_init_fn=seed_worker,
        pin_memory=pin_memory,
    )
    train_loader = DataLoader(
        train,
        batch_size=cfg.batch_size,
        shuffle=True,
        drop_last=True,
        generator=_generator(seed),
        collate_fn=SameSizeCollate(_TRAIN_KEY),
        **workers,
    )
    val_loader = DataLoader(
        val,
        batch_size=cfg.val_batch_size,
        shuffle=False,
        drop_last=False,
        # Own generator: worker seeds come from it, not from the global torch RNG.
        generator=_generator(seed + 1),
        collate_fn=SameSizeCollate(_VAL_KEY),
        **workers,
    )
    return train_loader, val_loader
