"""Datasets and data loaders from a ``DataConfig``, with config and data errors reported by name.

``build_data`` lists the configured dataset, splits the training set into labeled / unlabeled,
runs a cheap header scan of every file (exists, readable header, image and mask sizes agree) and
applies ``data.on_error``: ``raise`` stops with every problem named, ``skip`` drops the bad
samples and lists them in ``RUN/skipped.json``. Decoding errors and bad label values are found
when a sample is read (``dataset.py``) and follow the same rule. ``segadv-data check`` runs the
full check up front.

Reproducibility: synthetic data is a pure function of ``(data.synthetic.seed, split, index)``;
the labeled split of ``data.labeled_seed``; the shuffle order, the worker seeds and the
augmentation RNGs of the ``seed`` given to ``build_dataloaders`` (the training seed) and the
rank, never of global RNG state. Iterating the val loader does not consume the global torch RNG.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, default_collate, get_worker_info

from segadv.config.schema import DataConfig
from segadv.data.augment import build_transform, one_line, seed_transform
from segadv.data.dataset import SegmentationFiles, UnlabeledImages
from segadv.data.files import (
    LabelSpec,
    Listing,
    Problem,
    Sample,
    SampleError,
    check_sizes,
    display,
    probe_image,
    probe_mask,
)
from segadv.data.layouts import FIXED_CLASSES, LABEL_SPECS, LISTERS, folder_class_names
from segadv.data.resumable import PerSampleSeeded, ResumableSampler, derived_seed
from segadv.data.splits import split_labeled
from segadv.data.synthetic import SHAPE_CLASSES, SyntheticShapes, palette
from segadv.errors import UserError
from segadv.fsutil import atomic_write_text

__all__ = [
    "DataBundle",
    "build_data",
    "build_datasets",
    "build_dataloaders",
    "build_stream_loaders",
    "build_val_dataset",
    "build_val_loader",
    "check_config",
    "class_names",
    "collect",
    "palette",
    "seed_worker",
]

log = logging.getLogger(__name__)

_TRAIN_KEY = "data.train_transforms"
_VAL_KEY = "data.val_transforms"
SPLIT_FILE = "data_split.json"
SKIPPED_FILE = "skipped.json"
_MAX_SHOWN = 10


# --------------------------------------------------------------------------------------- config


def check_config(cfg: DataConfig) -> None:
    """Cross-field checks the schema cannot express, each naming the key at fault."""
    kind = cfg.kind
    if kind == "synthetic" and cfg.num_classes > len(SHAPE_CLASSES):
        raise UserError(
            f"data.num_classes: synthetic shapes have at most {len(SHAPE_CLASSES)} classes "
            f"({', '.join(SHAPE_CLASSES)}), got {cfg.num_classes}"
        )
    if kind in FIXED_CLASSES and cfg.num_classes != len(FIXED_CLASSES[kind]):
        raise UserError(
            f"data.num_classes: data.kind={kind} has {len(FIXED_CLASSES[kind])} classes; set "
            f"data.num_classes={len(FIXED_CLASSES[kind])} (got {cfg.num_classes})"
        )
    names = cfg.folder.class_names
    if kind == "folder" and names is not None and len(names) != cfg.num_classes:
        raise UserError(
            f"data.folder.class_names: {len(names)} names for data.num_classes={cfg.num_classes}"
        )
    if 0 <= cfg.ignore_index < cfg.num_classes:
        raise UserError(
            f"data.ignore_index: {cfg.ignore_index} is a real class id "
            f"(classes are 0..{cfg.num_classes - 1}); use e.g. 255"
        )
    if kind != "synthetic" and not cfg.num_classes <= cfg.ignore_index <= 255:
        raise UserError(
            f"data.ignore_index: masks on disk are 8-bit, so it must be in "
            f"{cfg.num_classes}..255 for data.kind={kind}, got {cfg.ignore_index}"
        )
    for key, values in (("data.mean", cfg.mean), ("data.std", cfg.std)):
        if len(values) != 3:
            raise UserError(f"{key}: expected 3 values (one per RGB channel), got {len(values)}")
    if any(s <= 0 for s in cfg.std):
        raise UserError(f"data.std: every value must be > 0, got {cfg.std}")


def class_names(cfg: DataConfig) -> list[str]:
    """The class names for ``cfg``, index = class id."""
    check_config(cfg)
    if cfg.kind == "synthetic":
        return list(SHAPE_CLASSES[: cfg.num_classes])
    if cfg.kind == "folder":
        return list(folder_class_names(cfg))
    return list(FIXED_CLASSES[cfg.kind])


def data_root(cfg: DataConfig) -> Path:
    if cfg.root is None:
        raise UserError(
            f"data.root: required for data.kind={cfg.kind} (the dataset directory; "
            "see README 'Datasets')"
        )
    root = Path(cfg.root).expanduser()
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise UserError(f"data.root: {display(root)} {what}")
    return root


# --------------------------------------------------------------------------------------- listing


@dataclass
class Collected:
    """A file dataset as listed and split, before any file is opened."""

    kind: str
    root: Path
    spec: LabelSpec
    train: Listing
    val: Listing
    labeled: list[Sample]
    unlabeled: list[Sample]
    problems: list[Problem]  # from listing (list files naming missing ids, duplicate ids)
    split_record: dict


def collect(cfg: DataConfig) -> Collected:
    """List both splits of a file dataset and split train into labeled / unlabeled."""
    check_config(cfg)
    root = data_root(cfg)
    spec = LABEL_SPECS[cfg.kind](cfg)
    train = LISTERS[cfg.kind](cfg, root, "train")
    val = LISTERS[cfg.kind](cfg, root, "val")
    labeled_idx, unlabeled_idx, split_problems, record = split_labeled(
        [s.id for s in train.samples], cfg, root
    )
    return Collected(
        cfg.kind, root, spec, train, val,
        labeled=[train.samples[i] for i in labeled_idx],
        unlabeled=[train.samples[i] for i in unlabeled_idx],
        problems=[*train.problems, *split_problems, *val.problems],
        split_record=record,
    )


def scan_headers(
    samples: Sequence[Sample], split: str, with_masks: bool
) -> tuple[list[Sample], list[Problem]]:
    """Open every file's header (no decoding): missing or unreadable files, colour masks and
    image / mask size mismatches. Returns ``(good samples, problems)``."""
    good, problems = [], []
    for sample in samples:
        try:
            size = probe_image(sample.image)
            if with_masks:
                check_sizes(size, probe_mask(sample.mask), sample)
        except SampleError as err:
            files = sample.files() if with_masks else (str(sample.image),)
            problems.append(Problem(split, sample.id, files, str(err)))
        else:
            good.append(sample)
    return good, problems


def raise_problems(problems: Sequence[Problem]) -> None:
    """One UserError naming every problem (the first few, with a count of the rest)."""
    hint = "data.on_error=skip drops bad samples; `segadv-data check` lists every problem"
    if len(problems) == 1:
        p = problems[0]
        raise UserError(f"{p.message} ({p.split} split; {hint})")
    lines = [f"  {p.split}: {p.message}" for p in problems[:_MAX_SHOWN]]
    if len(problems) > _MAX_SHOWN:
        lines.append(f"  ... and {len(problems) - _MAX_SHOWN} more")
    raise UserError(f"{len(problems)} bad samples ({hint}):\n" + "\n".join(lines))


def empty_split_message(split: str, listing_source: str, dropped: int) -> str:
    if dropped:
        return (f"the {split} split has no usable samples: all {dropped} were dropped as bad "
                f"(data.on_error=skip; see {SKIPPED_FILE} in the run dir)")
    return f"the {split} split is empty: no samples in {listing_source}"


# --------------------------------------------------------------------------------------- skips


class SkipRecorder:
    """Samples dropped under ``data.on_error=skip``: counted, logged, listed in the run dir.

    Start-up problems are added directly; samples that fail later, when read (possibly in a
    worker process), are picked up from the datasets' shared flags by :meth:`poll`, which the
    loaders call after every batch (a few microseconds when nothing changed).
    """

    def __init__(self, run_dir: Optional[Path] = None) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.problems: list[Problem] = []
        self._watched: list[list[Any]] = []  # [dataset, flags seen]

    @property
    def count(self) -> int:
        return len(self.problems)

    def add(self, problems: Sequence[Problem]) -> None:
        for p in problems:
            log.warning("skipping %s sample '%s': %s", p.split, p.id, p.message)
        self.problems.extend(problems)
        self.write()

    def watch(self, dataset: Any) -> None:
        if getattr(dataset, "on_error", None) == "skip" and hasattr(dataset, "bad"):
            self._watched.append([dataset, 0])

    def poll(self) -> None:
        for entry in self._watched:
            dataset, seen = entry
            flagged = int(torch.count_nonzero(dataset.bad))
            if flagged == seen:
                continue
            entry[1] = flagged
            known = {(p.split, p.id) for p in self.problems}
            new = [dataset.problem(i) for i in dataset.flagged()
                   if (dataset.split, dataset.samples[i].id) not in known]
            self.add(new)
            log.warning("%d samples skipped so far (data.on_error=skip)", self.count)

    def write(self) -> None:
        if self.run_dir is None:
            return
        data = {"count": self.count, "samples": [p.as_dict() for p in self.problems]}
        atomic_write_text(self.run_dir / SKIPPED_FILE, json.dumps(data, indent=1) + "\n")


# --------------------------------------------------------------------------------------- datasets


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

    @property
    def transform(self) -> Any:
        # Reachable, so PerSampleSeeded seeds the augmentation of each unlabeled sample too.
        return getattr(self.dataset, "transform", None)


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
    """Run sample 0 through the pipeline now, so a broken step fails at startup by config key
    rather than later inside a DataLoader worker with a long traceback."""
    try:
        image, mask = dataset[0]
    except UserError:
        raise
    except Exception as err:
        raise UserError(f"{key}: pipeline failed on {_describe(dataset)}: {one_line(err)}") from err
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
        SegmentationFiles("val", val, found.spec, val_tf, cfg.on_error),
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
        cfg.train_transforms, cfg.mean, cfg.std, _TRAIN_KEY, ignore_index=cfg.ignore_index
    )
    val_tf = build_transform(
        cfg.val_transforms, cfg.mean, cfg.std, _VAL_KEY, ignore_index=cfg.ignore_index
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
    _probe(bundle.train, _TRAIN_KEY)
    _probe(bundle.val, _VAL_KEY)
    recorder.poll()
    log.debug("datasets: %r, %r", bundle.train, bundle.val)
    return bundle


def build_val_dataset(cfg: DataConfig) -> Dataset:
    """The val split alone, with the val pipeline (segadv-eval): the train split is neither listed
    nor opened, so evaluating needs only the val files. Bad val samples follow ``data.on_error``."""
    check_config(cfg)
    val_tf = build_transform(cfg.val_transforms, cfg.mean, cfg.std, _VAL_KEY, ignore_index=cfg.ignore_index)
    if cfg.kind == "synthetic":
        val = synthetic_split(cfg, "val", val_tf)
    else:
        samples = _checked_split(cfg, "val", with_masks=True)
        val = SegmentationFiles("val", samples, LABEL_SPECS[cfg.kind](cfg), val_tf, cfg.on_error)
    _probe(val, _VAL_KEY)
    return val


def _checked_split(cfg: DataConfig, split: str, with_masks: bool) -> list[Sample]:
    """One split of a file dataset, listed and header-checked on its own (the other split is not
    opened); bad samples follow ``data.on_error`` (logged: no run dir to list them in)."""
    listing = LISTERS[cfg.kind](cfg, data_root(cfg), split)
    samples, bad = scan_headers(listing.samples, split, with_masks=with_masks)
    problems = [*listing.problems, *bad]
    if problems and cfg.on_error == "raise":
        raise_problems(problems)
    SkipRecorder().add(problems)
    if not samples:
        raise UserError(f"data: {empty_split_message(split, listing.source, len(bad))}")
    return samples


def build_target_data(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    """Domain adaptation's target (``target_data``): its train split as images only, with the
    train pipeline (masks are neither listed as needed nor opened, and may be absent), and its
    val split with the val pipeline."""
    check_config(cfg)
    train_tf = build_transform(cfg.train_transforms, cfg.mean, cfg.std, "target_data.train_transforms",
                               ignore_index=cfg.ignore_index)
    try:
        if cfg.kind == "synthetic":
            images: Dataset = _ImagesOnly(synthetic_split(cfg, "train", train_tf))
        else:
            samples = _checked_split(cfg, "train", with_masks=False)
            images = UnlabeledImages("target", samples, train_tf, cfg.on_error)
        val = build_val_dataset(cfg)
    except UserError as err:
        raise UserError(f"target_data: {err}") from None
    log.info("target data: %s; train %d images (labels not read), val %d", cfg.kind, len(images), len(val))
    return images, val


def build_datasets(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    """``(train, val)`` datasets with the train and val augmentation pipelines attached."""
    bundle = build_data(cfg)
    return bundle.train, bundle.val


# --------------------------------------------------------------------------------------- loaders


def seed_worker(worker_id: int) -> None:
    """Per-worker seeding: numpy/random from torch's per-worker seed, plus the augmentation RNG.

    torch's per-worker seed is the loader generator's draw (seeded from the training seed and
    the rank) plus the worker id. Without the last part every forked worker would inherit the
    same albumentations RNG state and apply identical augmentation sequences.
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
        # A sample is (image, mask), or an image alone (the unlabeled stream).
        shapes = {tuple((sample[0] if isinstance(sample, (tuple, list)) else sample).shape) for sample in batch}
        if len(shapes) > 1:
            raise UserError(
                f"{self.key}: samples in one batch have different sizes {sorted(shapes)}; "
                "end the pipeline with a fixed-size step (e.g. RandomCrop / PadIfNeeded / Resize)"
            )
        return default_collate(batch)


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*: (.*)$")


def _short(err: UserError) -> UserError:
    """A UserError raised in a worker process comes back with the worker's traceback in its
    message; keep only the original message (user errors print without a traceback)."""
    text = str(err)
    if "Original Traceback" not in text:
        return err
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    match = _EXCEPTION_LINE.match(lines[-1]) if lines else None
    return type(err)(match.group(1) if match else lines[-1])


class SegLoader(DataLoader):
    """A ``DataLoader`` whose iteration keeps user errors short and records skipped samples."""

    def __init__(self, *args: Any, skipped: Optional[SkipRecorder] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skipped = skipped

    def __iter__(self) -> Iterator[Any]:
        return self._checked(super().__iter__())

    def _checked(self, batches: Iterator[Any]) -> Iterator[Any]:
        poll = self.skipped.poll if self.skipped is not None else None
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except UserError as err:
                raise _short(err) from None
            if poll is not None:
                poll()
            yield batch


class ShardSampler(Sampler[int]):
    """Rank ``r`` of ``n`` takes samples ``r, r + n, ...``: every sample once, none twice (val)."""

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, length, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _generator(seed: int, rank: int = 0) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed((int(seed) + 1_000_003 * int(rank)) % 2**63)
    return gen


def build_dataloaders(
    cfg: DataConfig,
    *,
    seed: int,
    pin_memory: bool,
    run_dir: Optional[Path | str] = None,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[DataLoader, DataLoader]:
    """``(train, val)`` loaders: the labeled stream of ``build_stream_loaders`` and val."""
    streams, val = build_stream_loaders(
        cfg, ("labeled",), seed=seed, pin_memory=pin_memory, run_dir=run_dir, rank=rank, world_size=world_size
    )
    return streams["labeled"], val


# Each stream's shuffle and augmentation seeds derive from the training seed and its own word, so
# the streams are independent of each other; labeled keeps the training seed itself.
# Domain adaptation's source stream is the labeled stream under another name.
STREAM_SEED_WORDS = {"labeled": None, "unlabeled": 1, "gt": 2, "source": None, "target": 3}


def stream_seed(seed: int, stream: str) -> int:
    word = STREAM_SEED_WORDS[stream]
    return seed if word is None else derived_seed(seed, word)


def build_stream_loaders(
    cfg: DataConfig,
    streams: Sequence[str],
    *,
    seed: int,
    pin_memory: bool,
    run_dir: Optional[Path | str] = None,
    rank: int = 0,
    world_size: int = 1,
    batch_sizes: Optional[dict[str, int]] = None,
    target: Optional[DataConfig] = None,
) -> tuple[dict[str, DataLoader], DataLoader]:
    """A training loader per named stream, and the val loader.

    Streams: ``labeled`` (images and masks of the labeled split), ``unlabeled`` (images of the
    unlabeled pool; their masks are never read), ``gt`` (the labeled split again, in its own
    order: the labels D sees as real), and for domain adaptation ``source`` (the labeled split)
    and ``target`` (``target``'s train images, labels never read). With ``target`` the val loader
    is the target's val split. Each shuffles deterministically from its own seed, is
    sharded per rank and (with ``data.drop_last``) drops its last partial batch (D and BatchNorm
    prefer full batches). ``batch_sizes``: per stream, default ``data.batch_size``.

    ``pin_memory``: whether a CUDA device will consume the batches (and ``data.pin_memory``
    allows it). With ``world_size`` > 1 each rank gets its shard of train and of val, and only
    rank 0 writes ``data_split.json`` / ``skipped.json`` (other ranks log their skips).
    """
    bundle = build_data(cfg, run_dir=run_dir if rank == 0 else None)
    sources = {"labeled": bundle.train, "gt": bundle.train, "unlabeled": bundle.unlabeled, "source": bundle.train}
    val = bundle.val
    if target is not None:
        sources["target"], val = build_target_data(target)
    elif "target" in streams:
        raise UserError("target_data: the method adapts to a target domain; give target_data (README "
                        "\"Domain adaptation\")")
    loaders: dict[str, DataLoader] = {}
    for name in streams:
        if name not in sources:
            raise KeyError(f"unknown data stream {name!r}; streams: {', '.join(sources)}")
        dataset = sources[name]
        if dataset is None:
            raise UserError(
                "data.labeled_fraction: the method draws unlabeled images but every training sample "
                "is labeled; set data.labeled_fraction below 1 or give data.labeled_list"
            )
        batch_size = (batch_sizes or {}).get(name, cfg.batch_size)
        _check_batch_size(cfg, dataset, name, batch_size, world_size)
        stream_seed_ = stream_seed(seed, name)
        # Seed the in-process pipeline too: with num_workers = 0 no worker_init_fn runs.
        seed_transform(getattr(dataset, "transform", None), stream_seed_)
        workers = _worker_options(cfg, pin_memory, [dataset])
        # Order from (seed, epoch) and augmentation seeded per sample: resumable mid-epoch, and
        # the same whatever the number of workers (segadv/data/resumable.py).
        loaders[name] = SegLoader(
            PerSampleSeeded(dataset),
            batch_size=batch_size,
            sampler=ResumableSampler(len(dataset), seed=stream_seed_, shuffle=True, rank=rank,
                                     world_size=world_size),
            drop_last=cfg.drop_last,
            generator=_generator(stream_seed_, rank),
            collate_fn=SameSizeCollate(_TRAIN_KEY),
            skipped=bundle.skipped,
            **workers,
        )
    seed_transform(getattr(val, "transform", None), seed + 1)
    workers = _worker_options(cfg, pin_memory, [val])
    return loaders, _val_loader(val, cfg, seed, rank, world_size, workers, bundle.skipped)


def _check_batch_size(cfg: DataConfig, dataset: Dataset, stream: str, batch_size: int, world_size: int) -> None:
    if not cfg.drop_last or batch_size <= len(dataset) // world_size:
        return
    if stream == "unlabeled":
        key, source = "method.advsemiseg.unlabeled_batch_size", f"{len(dataset)} unlabeled samples"
    elif stream == "target":
        key, source = "method.<name>.target_batch_size", f"{len(dataset)} target images"
    else:
        key = "data.batch_size"
        source = (f"data.synthetic.train_size = {len(dataset)}" if isinstance(dataset, SyntheticShapes)
                  else f"{len(dataset)} labeled samples")
    ranks = f" over {world_size} ranks" if world_size > 1 else ""
    raise UserError(
        f"{key}: {batch_size} is larger than the {stream} set ({source}{ranks}), so no full batch exists"
    )


def build_val_loader(cfg: DataConfig, *, seed: int, pin_memory: bool) -> DataLoader:
    """The val loader alone (see ``build_val_dataset``), exactly as training builds it."""
    val = build_val_dataset(cfg)
    seed_transform(getattr(val, "transform", None), seed + 1)
    return _val_loader(val, cfg, seed, 0, 1, _worker_options(cfg, pin_memory, [val]), None)


def _worker_options(cfg: DataConfig, pin_memory: bool, datasets: Sequence[Dataset]) -> dict[str, Any]:
    workers: dict[str, Any] = dict(
        num_workers=cfg.num_workers,
        worker_init_fn=seed_worker,
        pin_memory=bool(pin_memory and cfg.pin_memory),
    )
    if cfg.num_workers > 0:
        workers["persistent_workers"] = cfg.persistent_workers
        workers["prefetch_factor"] = cfg.prefetch_factor
        for dataset in datasets:
            if hasattr(dataset, "bad"):
                dataset.bad.share_memory_()  # workers flag skipped samples for the main process
    return workers


def _val_loader(
    val: Dataset, cfg: DataConfig, seed: int, rank: int, world_size: int, workers: dict[str, Any],
    skipped: Optional[SkipRecorder],
) -> DataLoader:
    return SegLoader(
        val,
        batch_size=cfg.val_batch_size,
        sampler=ShardSampler(len(val), rank, world_size) if world_size > 1 else None,
        shuffle=False,
        drop_last=False,
        # Own generator: worker seeds come from it, not from the global torch RNG.
        generator=_generator(seed + 1, rank),
        collate_fn=SameSizeCollate(_VAL_KEY),
        skipped=skipped,
        **workers,
    )
