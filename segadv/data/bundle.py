"""Datasets from a ``DataConfig``: the labeled train set, val, the unlabeled pool and a domain
adaptation target, each with its augmentation pipeline attached.

``build_data`` lists the configured dataset, splits the training set into labeled / unlabeled,
runs a cheap header scan of every file (``listing.py``) and applies ``data.on_error``: ``raise``
stops with every problem named, ``skip`` drops the bad samples and lists them in
``RUN/skipped.json``. Decoding errors and bad label values are found when a sample is read
(``dataset.py``) and follow the same rule. ``segadv-data check`` runs the full check up front.

Synthetic data is a pure function of ``(data.synthetic.seed, split, index)``; the labeled split
of ``data.labeled_seed``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch.utils.data import Dataset, Subset

from segadv.config.schema import DataConfig
from segadv.data.augment import build_transform, one_line
from segadv.data.config_checks import check_config
from segadv.data.dataset import SegmentationFiles, UnlabeledImages
from segadv.data.files import SampleError, probe_image
from segadv.data.layouts import LABEL_SPECS
from segadv.data.listing import checked_split, collect, empty_split_message, raise_problems, scan_headers
from segadv.data.skips import SkipRecorder
from segadv.data.splits import split_labeled
from segadv.data.synthetic import SyntheticShapes
from segadv.errors import UserError
from segadv.fsutil import atomic_write_text

__all__ = [
    "TRAIN_KEY",
    "VAL_KEY",
    "DataBundle",
    "build_data",
    "build_datasets",
    "build_target_data",
    "build_val_dataset",
    "synthetic_split",
]

log = logging.getLogger(__name__)

TRAIN_KEY = "data.train_transforms"
VAL_KEY = "data.val_transforms"
SPLIT_FILE = "data_split.json"


class _Subset(Subset):
    """A ``Subset`` that keeps the dataset's ``transform`` and ``class_names`` reachable."""

    @property
    def transform(self) -> Any:
        return getattr(self.dataset, "transform", None)

    @property
    def class_names(self) -> list[str]:
        return self.dataset.class_names


class _ImagesOnly(Dataset):
    """Images of a labeled dataset, for the synthetic kind's unlabeled pool."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.dataset[i][0]

    def labeled_sample(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Image ``i`` with its mask: for diagnostics that measure against the truth (training
        draws images only)."""
        return self.dataset[i]

    @property
    def transform(self) -> Any:
        # Reachable, so PerSampleSeeded seeds the augmentation of each unlabeled sample too.
        return getattr(self.dataset, "transform", None)


def pool_has_masks(cfg: DataConfig) -> bool:
    """Whether the unlabeled pool's images have masks a diagnostic may read (``labeled_sample``):
    the synthetic kind's pool is labeled images with their labels withheld; a folder's unlabeled
    images may have none."""
    return cfg.kind == "synthetic"


@dataclass
class DataBundle:
    """Everything ``build_data`` makes: the labeled train set, val, and the unlabeled pool."""

    train: Dataset
    val: Dataset
    unlabeled: Optional[Dataset]  # None when every training sample is labeled
    split: dict  # what RUN/data_split.json holds
    skipped: SkipRecorder = field(default_factory=SkipRecorder)


def _describe(dataset: Any) -> str:
    if isinstance(dataset, SyntheticShapes):
        return f"a {dataset.image_size}x{dataset.image_size} {dataset.split} sample"
    if isinstance(dataset, _Subset):
        return _describe(dataset.dataset)
    sample = dataset.samples[0]
    try:
        h, w = probe_image(sample.image)
        return f"{dataset.split} sample '{sample.id}' ({w}x{h})"
    except SampleError:
        return f"{dataset.split} sample '{sample.id}'"


def _probe(dataset: Any, key: str) -> None:
    """Run the first good sample through the pipeline now, so a broken step fails at startup by
    config key rather than later inside a DataLoader worker with a long traceback."""
    try:
        item = next((item for item in map(dataset.__getitem__, range(len(dataset))) if item is not None), None)
    except UserError:
        raise
    except Exception as err:
        raise UserError(f"{key}: pipeline failed on {_describe(dataset)}: {one_line(err)}") from err
    if item is None:  # an evaluation set under data.on_error=skip whose every sample failed to load
        raise UserError(f"data: {empty_split_message(dataset.split, 'its files', len(dataset))}")
    image, mask = item
    if image.ndim != 3 or mask.ndim != 2 or tuple(image.shape[1:]) != tuple(mask.shape):
        raise UserError(
            f"{key}: pipeline produced image {tuple(image.shape)} and mask {tuple(mask.shape)}; "
            "expected a 3xHxW image and an HxW mask of the same size"
        )


def synthetic_split(cfg: DataConfig, split: str, transform: Any) -> SyntheticShapes:
    """The embedded dataset's ``train`` or ``val`` split as ``data.synthetic`` describes it."""
    syn = cfg.synthetic
    return SyntheticShapes(split, syn.train_size if split == "train" else syn.val_size, transform=transform,
                           image_size=syn.image_size, num_classes=cfg.num_classes, seed=syn.seed, domain=syn.domain)


def _synthetic(cfg: DataConfig, train_tf: Any, val_tf: Any) -> DataBundle:
    train, val = synthetic_split(cfg, "train", train_tf), synthetic_split(cfg, "val", val_tf)
    labeled, unlabeled, problems, record = split_labeled([str(i) for i in range(len(train))], cfg, None)
    if problems:
        raise_problems(problems)  # a labeled_list naming ids that do not exist: no file to skip
    record = {"kind": "synthetic", **record}
    if len(labeled) == len(train):
        return DataBundle(train, val, None, record)
    return DataBundle(_Subset(train, labeled), val, _ImagesOnly(_Subset(train, unlabeled)), record)


def _files(cfg: DataConfig, train_tf: Any, val_tf: Any, recorder: SkipRecorder) -> DataBundle:
    found = collect(cfg)
    if found.shared:
        log.warning("data: %s", found.shared)
    t0 = time.perf_counter()
    labeled, bad_labeled = scan_headers(found.labeled, "train", with_masks=True)
    unlabeled, bad_unlabeled = scan_headers(found.unlabeled, "unlabeled", with_masks=False)
    val, bad_val = scan_headers(found.val.samples, "val", with_masks=True)
    problems = [*found.problems, *bad_labeled, *bad_unlabeled, *bad_val]
    log.info(
        "data: checked the headers of %d samples in %.1f s",
        len(found.labeled) + len(found.unlabeled) + len(found.val.samples), time.perf_counter() - t0,
    )
    if problems and cfg.on_error == "raise":
        raise_problems(problems)
    recorder.add(problems)
    for split, samples, listing, dropped in (
        ("train", labeled, found.train, len(bad_labeled)),
        ("val", val, found.val, len(bad_val)),
    ):
        if not samples:
            if split == "train" and found.train.samples and not found.labeled:
                raise UserError("data.labeled_list: no training sample is labeled")
            raise UserError(f"data: {empty_split_message(split, listing.source, dropped)}")
    record = {"kind": cfg.kind, "root": str(found.root), **found.split_record}
    return DataBundle(
        SegmentationFiles("train", labeled, found.spec, train_tf, cfg.on_error),
        SegmentationFiles("val", val, found.spec, val_tf, cfg.on_error, drop_bad=True),
        UnlabeledImages("unlabeled", unlabeled, train_tf, cfg.on_error) if unlabeled else None,
        record,
        recorder,
    )


def build_data(cfg: DataConfig, *, run_dir: Optional[Path | str] = None) -> DataBundle:
    """Datasets with the train and val pipelines attached; see the module docstring.

    With ``run_dir`` the split is saved as ``data_split.json`` there, and (file kinds) the
    samples dropped under ``data.on_error=skip`` as ``skipped.json``.
    """
    check_config(cfg)
    train_tf = build_transform(
        cfg.train_transforms, cfg.mean, cfg.std, TRAIN_KEY, ignore_index=cfg.ignore_index
    )
    val_tf = build_transform(
        cfg.val_transforms, cfg.mean, cfg.std, VAL_KEY, ignore_index=cfg.ignore_index
    )
    recorder = SkipRecorder(Path(run_dir) if run_dir is not None else None)
    if cfg.kind == "synthetic":
        bundle = _synthetic(cfg, train_tf, val_tf)
        bundle.skipped = recorder
    else:
        bundle = _files(cfg, train_tf, val_tf, recorder)
        recorder.watch(bundle.train)
        recorder.watch(bundle.val)
    n_unlabeled = len(bundle.unlabeled) if bundle.unlabeled is not None else 0
    bundle.split["counts"] = {"labeled": len(bundle.train), "unlabeled": n_unlabeled, "val": len(bundle.val)}
    log.info(
        "data: %s; train %d labeled + %d unlabeled (labeled_fraction %g, labeled_list %s, seed %d); "
        "val %d%s",
        cfg.kind, len(bundle.train), n_unlabeled, cfg.labeled_fraction, cfg.labeled_list,
        cfg.labeled_seed, len(bundle.val),
        f"; {recorder.count} bad samples skipped" if recorder.count else "",
    )
    if run_dir is not None:
        atomic_write_text(Path(run_dir) / SPLIT_FILE, json.dumps(bundle.split, indent=1) + "\n")
    _probe(bundle.train, TRAIN_KEY)
    _probe(bundle.val, VAL_KEY)
    recorder.poll()
    log.debug("datasets: %r, %r", bundle.train, bundle.val)
    return bundle


def build_val_dataset(cfg: DataConfig, skipped: Optional[SkipRecorder] = None, split: str = "val") -> Dataset:
    """The val split alone, with the val pipeline (segadv-eval): the train split is neither listed
    nor opened, so evaluating needs only the val files. Bad val samples follow ``data.on_error``;
    under skip they are left out of the scores and recorded in ``skipped`` (watched: the ones
    found bad as they are read too). ``split``: what the samples' problems call the split."""
    check_config(cfg)
    val_tf = build_transform(cfg.val_transforms, cfg.mean, cfg.std, VAL_KEY, ignore_index=cfg.ignore_index)
    if cfg.kind == "synthetic":
        val = synthetic_split(cfg, "val", val_tf)
    else:
        samples = checked_split(cfg, "val", with_masks=True, skipped=skipped, split_name=split)
        val = SegmentationFiles(split, samples, LABEL_SPECS[cfg.kind](cfg), val_tf, cfg.on_error, drop_bad=True)
        if skipped is not None:
            skipped.watch(val)
    _probe(val, VAL_KEY)
    if skipped is not None:
        skipped.poll()
    return val


def build_target_data(cfg: DataConfig, skipped: Optional[SkipRecorder] = None) -> tuple[Dataset, Dataset]:
    """Domain adaptation's target (``target_data``): its train split as images only, with the
    train pipeline (masks are neither listed as needed nor opened, and may be absent), and its
    val split with the val pipeline. Samples dropped under skip are recorded in ``skipped``."""
    check_config(cfg)
    train_tf = build_transform(cfg.train_transforms, cfg.mean, cfg.std, "target_data.train_transforms",
                               ignore_index=cfg.ignore_index)
    try:
        if cfg.kind == "synthetic":
            images: Dataset = _ImagesOnly(synthetic_split(cfg, "train", train_tf))
        else:
            samples = checked_split(cfg, "train", with_masks=False, skipped=skipped, split_name="target")
            images = UnlabeledImages("target", samples, train_tf, cfg.on_error)
            if skipped is not None:
                skipped.watch(images)
        val = build_val_dataset(cfg, skipped, "target_val")
    except UserError as err:
        raise UserError(f"target_data: {err}") from None
    log.info("target data: %s; train %d images (labels not read), val %d", cfg.kind, len(images), len(val))
    return images, val


def build_datasets(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    """``(train, val)`` datasets with the train and val augmentation pipelines attached."""
    bundle = build_data(cfg)
    return bundle.train, bundle.val

