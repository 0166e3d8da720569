"""The scan and pools stages of the data path (``catalog.py`` lists; this reads): from a
``Catalog``, the labeled train set, val, the unlabeled pool and a domain adaptation target's
images and val, each with its augmentation pipeline attached.

``build_pools`` runs a cheap header scan of every listed file (``listing.py``) and applies
``data.on_error``: ``raise`` stops with every problem named, ``skip`` drops the bad samples and
lists them in ``RUN/skipped.json``. Decoding errors and bad label values are found when a sample
is read (``dataset.py``) and follow the same rule. ``segadv-data check`` runs the full check up
front.

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
from segadv.data.batch_checks import Pool
from segadv.data.catalog import Catalog
from segadv.data.config_checks import check_config
from segadv.data.dataset import SegmentationFiles, UnlabeledImages
from segadv.data.files import Listing, Sample, SampleError, probe_image
from segadv.data.layouts import LABEL_SPECS
from segadv.data.listing import Listed, empty_split_message, list_eval_split, raise_problems, scan_headers
from segadv.data.skips import SkipRecorder
from segadv.data.synthetic import SyntheticShapes
from segadv.errors import UserError
from segadv.fsutil import atomic_write_text

__all__ = [
    "TRAIN_KEY",
    "VAL_KEY",
    "DataBundle",
    "build_data",
    "build_datasets",
    "build_pools",
    "build_val_dataset",
    "synthetic_split",
    "val_transform",
]

log = logging.getLogger(__name__)

TRAIN_KEY = "data.train_transforms"
VAL_KEY = "data.val_transforms"
SIZE_KEY = "data.val_input_size"
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
    """Every pool ``build_pools`` makes: the labeled train set, val, the unlabeled pool, and with
    a target its images and its val."""

    train: Dataset
    val: Dataset  # the source's val (``val_source/*`` under domain adaptation)
    unlabeled: Optional[Dataset]  # None when every training sample is labeled
    split: dict  # what RUN/data_split.json holds
    skipped: SkipRecorder = field(default_factory=SkipRecorder)
    target: Optional[Dataset] = None  # the target's train images (no target: None)
    target_val: Optional[Dataset] = None

    def pools(self) -> dict[str, Optional[Pool]]:
        """Each pool a stream may draw from, as scanned (``check_stream_pools``' ``pools``)."""
        pools = {"labeled": Pool.counted("labeled", len(self.train)),
                 "unlabeled": Pool.counted("unlabeled", len(self.unlabeled)) if self.unlabeled is not None else None}
        if self.target is not None:
            pools["target"] = Pool.counted("target", len(self.target))
        return pools


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


def _probe(dataset: Any, key: str, image_size: Optional[list[int]] = None) -> None:
    """Run the first good sample through the pipeline now, so a broken step fails at startup by
    config key rather than later inside a DataLoader worker with a long traceback, and check what
    the pipeline promises: image and mask of one size, or with ``image_size`` ([W, H], a val
    pipeline under ``data.val_input_size``) the image at that size and the mask at its own (the
    prediction is upsampled to it). The files' image and mask agree in size either way: their
    headers and pixels are checked before any pipeline runs (``check_sizes``)."""
    try:
        item = next((item for item in map(dataset.__getitem__, range(len(dataset))) if item is not None), None)
    except UserError:
        raise
    except Exception as err:
        raise UserError(f"{key}: pipeline failed on {_describe(dataset)}: {one_line(err)}") from err
    if item is None:  # an evaluation set under data.on_error=skip whose every sample failed to load
        raise UserError(f"data: {empty_split_message(dataset.split, 'its files', len(dataset))}")
    image, mask = item
    if image_size is None:
        if image.ndim != 3 or mask.ndim != 2 or tuple(image.shape[1:]) != tuple(mask.shape):
            raise UserError(
                f"{key}: pipeline produced image {tuple(image.shape)} and mask {tuple(mask.shape)}; "
                "expected a 3xHxW image and an HxW mask of the same size"
            )
        return
    width, height = image_size
    if image.ndim != 3 or mask.ndim != 2 or tuple(image.shape[1:]) != (height, width):
        raise UserError(
            f"{SIZE_KEY}: pipeline produced image {tuple(image.shape)} and mask {tuple(mask.shape)}; "
            f"expected a 3x{height}x{width} image ([{width}, {height}]) and an HxW mask at its own size"
        )


def synthetic_split(cfg: DataConfig, split: str, transform: Any) -> SyntheticShapes:
    """The embedded dataset's ``train``, ``val`` or ``test`` split as ``data.synthetic``
    describes it: the test split is generated as the split ``data.test`` names."""
    syn = cfg.synthetic
    name, size = (cfg.test, syn.test_size) if split == "test" else (split, getattr(syn, f"{split}_size"))
    return SyntheticShapes(name, size, transform=transform, image_size=syn.image_size, num_classes=cfg.num_classes,
                           seed=syn.seed, domain=syn.domain)


def _synthetic(listed: Listed, train_tf: Any, val_tf: Any) -> DataBundle:
    cfg = listed.cfg
    train, val = synthetic_split(cfg, "train", train_tf), synthetic_split(cfg, "val", val_tf)
    if listed.problems:
        raise_problems(listed.problems)  # a labeled_list naming ids that do not exist: no file to skip
    if not listed.unlabeled_idx:
        return DataBundle(train, val, None, dict(listed.split_record))
    return DataBundle(_Subset(train, listed.labeled_idx), val, _ImagesOnly(_Subset(train, listed.unlabeled_idx)),
                      dict(listed.split_record))


def _files(listed: Listed, train_tf: Any, val_tf: Any, recorder: SkipRecorder) -> DataBundle:
    cfg = listed.cfg
    if listed.shared:
        log.warning("data: %s", listed.shared)
    t0 = time.perf_counter()
    labeled_listed, unlabeled_listed = listed.labeled, listed.unlabeled
    labeled, bad_labeled = scan_headers(labeled_listed, "train", with_masks=True)
    unlabeled, bad_unlabeled = scan_headers(unlabeled_listed, "unlabeled", with_masks=False)
    val, bad_val = scan_headers(listed.val.samples, "val", with_masks=True)
    problems = [*listed.problems, *bad_labeled, *bad_unlabeled, *bad_val]
    log.info(
        "data: checked the headers of %d samples in %.1f s",
        len(labeled_listed) + len(unlabeled_listed) + len(listed.val.samples), time.perf_counter() - t0,
    )
    if problems and cfg.on_error == "raise":
        raise_problems(problems)
    recorder.add(problems)
    for split, samples, listing, dropped in (
        ("train", labeled, listed.train, len(bad_labeled)),
        ("val", val, listed.val, len(bad_val)),
    ):
        if not samples:
            if split == "train" and listed.train.samples and not labeled_listed:
                raise UserError("data.labeled_list: no training sample is labeled")
            raise UserError(f"data: {empty_split_message(split, listing.source, dropped)}")
    return DataBundle(
        SegmentationFiles("train", labeled, listed.spec, train_tf, cfg.on_error),
        SegmentationFiles("val", val, listed.spec, val_tf, cfg.on_error, drop_bad=True),
        UnlabeledImages("unlabeled", unlabeled, train_tf, cfg.on_error) if unlabeled else None,
        dict(listed.split_record),
        recorder,
    )


def build_pools(catalog: Catalog, *, run_dir: Optional[Path | str] = None) -> DataBundle:
    """The catalog's splits scanned and made datasets with their pipelines: the training data's
    (see the module docstring), then the target's. With ``run_dir`` the split is saved as
    ``data_split.json`` there, and (file kinds) the samples dropped under ``data.on_error=skip``
    as ``skipped.json``."""
    if catalog.survey is not None:  # in the training log: the start surveyed them before it was opened
        for warning in catalog.survey.warnings():
            log.warning("data: %s", warning)
    bundle = _source_pools(catalog.source, run_dir)
    if catalog.target is not None:
        bundle.target, bundle.target_val = _target_pools(catalog.target, bundle.skipped)
    return bundle


def _source_pools(listed: Listed, run_dir: Optional[Path | str]) -> DataBundle:
    cfg = listed.cfg
    train_tf = build_transform(
        cfg.train_transforms, cfg.input_normalization, TRAIN_KEY, ignore_index=cfg.ignore_index
    )
    val_tf = val_transform(cfg)
    recorder = SkipRecorder(Path(run_dir) if run_dir is not None else None)
    recorder.follow(cfg.on_error)
    if cfg.kind == "synthetic":
        bundle = _synthetic(listed, train_tf, val_tf)
        bundle.skipped = recorder
    else:
        bundle = _files(listed, train_tf, val_tf, recorder)
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
    _probe(bundle.val, VAL_KEY, cfg.val_input_size)
    recorder.poll()
    log.debug("datasets: %r, %r", bundle.train, bundle.val)
    return bundle


def _target_pools(listed: Listed, skipped: SkipRecorder) -> tuple[Dataset, Dataset]:
    """Domain adaptation's target: its train split as images only, with the train pipeline
    (masks are neither needed nor opened), and its val split with the val pipeline. Samples
    dropped under skip are recorded in ``skipped``."""
    cfg = listed.cfg
    skipped.follow(cfg.on_error)
    train_tf = build_transform(cfg.train_transforms, cfg.input_normalization, "target_data.train_transforms",
                               ignore_index=cfg.ignore_index)
    try:
        if cfg.kind == "synthetic":
            images: Dataset = _ImagesOnly(synthetic_split(cfg, "train", train_tf))
        else:
            samples = _scanned(cfg, listed.train, with_masks=False, skipped=skipped)
            images = UnlabeledImages("target", samples, train_tf, cfg.on_error)
            skipped.watch(images)
        val = _val_dataset(cfg, listed.val, skipped)
    except UserError as err:
        raise UserError(f"target_data: {err}") from None
    log.info("target data: %s; train %d images (labels not read), val %d", cfg.kind, len(images), len(val))
    return images, val


def _scanned(cfg: DataConfig, listing: Listing, with_masks: bool, skipped: Optional[SkipRecorder]) -> list[Sample]:
    """One listed split's header-checked samples; bad samples follow ``data.on_error`` and are
    recorded in ``skipped`` (or only logged)."""
    samples, bad = scan_headers(listing.samples, listing.split, with_masks=with_masks)
    problems = [*listing.problems, *bad]
    if problems and cfg.on_error == "raise":
        raise_problems(problems)
    (skipped if skipped is not None else SkipRecorder()).add(problems)
    if not samples:
        raise UserError(f"data: {empty_split_message(listing.split, listing.source, len(bad))}")
    return samples


def _val_dataset(cfg: DataConfig, listing: Optional[Listing], skipped: Optional[SkipRecorder],
                 split: str = "val") -> Dataset:
    """A scored split (val, or ``split`` test) with the val pipeline, its listing scanned (None:
    synthetic, generated). Bad samples follow ``data.on_error``; under skip they are left out of
    the scores and recorded in ``skipped`` (watched: the ones found bad as they are read too)."""
    val_tf = val_transform(cfg)
    if listing is None:
        val = synthetic_split(cfg, split, val_tf)
    else:
        samples = _scanned(cfg, listing, with_masks=True, skipped=skipped)
        val = SegmentationFiles(listing.split, samples, LABEL_SPECS[cfg.kind](cfg), val_tf, cfg.on_error,
                                drop_bad=True)
        if skipped is not None:
            skipped.watch(val)
    _probe(val, VAL_KEY, cfg.val_input_size)
    if skipped is not None:
        skipped.poll()
    return val


def val_transform(cfg: DataConfig) -> Any:
    """The val pipeline: ``data.val_transforms`` on image and mask, then, with
    ``data.val_input_size``, the image alone resized to it. Here, in the loader's workers, rather
    than on G's device: the references resize the uint8 image with PIL's bicubic before the mean is
    taken off, which only the host reproduces exactly, and the smaller image is what crosses to the
    device. The mask keeps its size; evaluation upsamples G's logits to it."""
    return build_transform(cfg.val_transforms, cfg.input_normalization, VAL_KEY, ignore_index=cfg.ignore_index,
                           image_size=cfg.val_input_size)


def build_data(cfg: DataConfig, *, run_dir: Optional[Path | str] = None) -> DataBundle:
    """The training data's pools (no target): its catalog opened, then ``build_pools``."""
    return build_pools(Catalog.open(cfg), run_dir=run_dir)


def build_val_dataset(cfg: DataConfig, skipped: Optional[SkipRecorder] = None, split: str = "val") -> Dataset:
    """The split segadv-eval scores alone, ``val`` or ``test`` (``data.test``'s; None there is a
    UserError naming it), with the val pipeline: the same transforms whichever is scored. The train
    split is not opened (listed only for a test split of a layout whose splits are disjoint:
    ``list_eval_split``), so evaluating needs only the scored split's files; see ``_val_dataset``."""
    check_config(cfg)
    if split == "test" and cfg.test is None:
        raise UserError("data.test is null: the data section has no test split to score")
    listing = None if cfg.kind == "synthetic" else list_eval_split(cfg, split)
    return _val_dataset(cfg, listing, skipped, split)


def build_datasets(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    """``(train, val)`` datasets with the train and val augmentation pipelines attached."""
    bundle = build_data(cfg)
    return bundle.train, bundle.val
