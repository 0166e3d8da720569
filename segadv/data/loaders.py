"""DataLoaders, the loaders stage of the data path: a training loader per stream a method
declares over its pool (``bundle.py``), and the val loaders.

Reproducibility: the shuffle order, the worker seeds and the augmentation RNGs derive from the
``seed`` given here (the training seed), each stream's ``seed_word`` and the rank, never from
global RNG state. Iterating the val loader does not consume the global torch RNG.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info

from segadv.config.schema import DataConfig
from segadv.data.augment import seed_transform
from segadv.data.batch_checks import Pool, check_stream_pools
from segadv.data.bundle import TRAIN_KEY, DataBundle, build_pools, build_val_dataset
from segadv.data.catalog import Catalog, listed_pools
from segadv.data.files import Problem
from segadv.data.resumable import PerSampleSeeded, ResumableSampler, derived_seed
from segadv.data.skips import SkipRecorder
from segadv.data.streams import StreamSpec
from segadv.errors import UserError
from segadv.signals import ignore_stop_signals

__all__ = ["RunLoaders", "build_dataloaders", "build_run_loaders", "build_stream_loaders", "build_val_loader",
           "left_out", "seed_worker"]


def seed_worker(worker_id: int) -> None:
    """A worker's start: SIGTERM and SIGINT left to the main process (segadv/signals.py), then
    per-worker seeding: numpy/random from torch's per-worker seed, plus the augmentation RNG.

    torch's per-worker seed is the loader generator's draw (seeded from the training seed and
    the rank) plus the worker id. Without the last part every forked worker would inherit the
    same albumentations RNG state and apply identical augmentation sequences.
    """
    ignore_stop_signals()
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


class SizeGroups(list):
    """One val batch as same-size sub-batches, each handed out by the loader as a batch of its own."""


class ValCollate:
    """Val batches: samples left out under ``data.on_error=skip`` (None) are dropped, and samples
    of different sizes (a val pipeline may keep each image's own size) are collated in same-size
    groups, each scored as a batch: the scores never depend on the batching. None when every
    sample of the batch was left out. A class (not a closure) so it pickles into worker processes."""

    def __call__(self, batch: Sequence[Any]) -> Any:
        kept = [sample for sample in batch if sample is not None]
        if not kept:
            return None
        groups: dict[tuple, list[Any]] = {}
        for sample in kept:
            # The label's size too: with data.val_input_size every image has one size, the labels their own.
            groups.setdefault((tuple(sample[0].shape), tuple(sample[1].shape)), []).append(sample)
        if len(groups) == 1:
            return default_collate(kept)
        return SizeGroups(default_collate(group) for group in groups.values())


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

    def close(self) -> None:
        """End the workers now rather than at garbage collection (persistent workers included),
        so none outlives the run (the end of the process would wait for them)."""
        iterator, self._iterator = getattr(self, "_iterator", None), None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

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
            if batch is None:  # every sample of it left out (val, data.on_error=skip)
                continue
            if isinstance(batch, SizeGroups):
                yield from batch
            else:
                yield batch


def left_out(loader: Any) -> list[Problem]:
    """The samples of ``loader``'s split left out under ``data.on_error=skip`` so far (at start-up
    and as they were read); none for a loader that keeps no record."""
    recorder = getattr(loader, "skipped", None)
    split = getattr(getattr(loader, "dataset", None), "split", None)
    return recorder.in_split(split) if recorder is not None and split is not None else []


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
    """``(train, val)`` loaders: the labeled split as ``build_stream_loaders`` streams it, and val."""
    labeled = StreamSpec("labeled", "labeled")
    streams, val = build_stream_loaders(
        cfg, (labeled,), seed=seed, pin_memory=pin_memory, run_dir=run_dir, rank=rank, world_size=world_size
    )
    return streams[labeled.name], val


def build_stream_loaders(
    cfg: DataConfig,
    streams: Sequence[StreamSpec],
    *,
    seed: int,
    pin_memory: bool,
    run_dir: Optional[Path | str] = None,
    rank: int = 0,
    world_size: int = 1,
    batch_sizes: Optional[dict[str, int]] = None,
    target: Optional[DataConfig] = None,
) -> tuple[dict[str, DataLoader], DataLoader]:
    """A training loader per declared stream, by stream name, and the val loader (the target's
    with ``target``): ``build_run_loaders``' without the source val loader."""
    loaders = build_run_loaders(cfg, streams, seed=seed, pin_memory=pin_memory, run_dir=run_dir, rank=rank,
                                world_size=world_size, batch_sizes=batch_sizes, target=target)
    return loaders.streams, loaders.val


@dataclass
class RunLoaders:
    streams: dict[str, DataLoader]  # by stream name
    val: DataLoader  # val/*: the target's under domain adaptation
    source_val: Optional[DataLoader] = None  # val_source/*: the source's val, whole on every rank


def build_run_loaders(
    cfg: DataConfig,
    streams: Sequence[StreamSpec],
    *,
    seed: int,
    pin_memory: bool,
    run_dir: Optional[Path | str] = None,
    rank: int = 0,
    world_size: int = 1,
    batch_sizes: Optional[dict[str, int]] = None,
    target: Optional[DataConfig] = None,
    catalog: Optional[Catalog] = None,
    source_val: bool = False,
    val_samples: Optional[int] = None,
) -> RunLoaders:
    """A training loader per declared stream and the val loaders, from ``catalog`` (the start's,
    checked against these streams: segadv/training/preflight.py) or, given none, from ``cfg`` and
    ``target`` checked and listed here.

    Each stream draws its pool (``StreamSpec.pool``): the labeled split, the unlabeled pool or
    the target's train images. With a target the val loader is the target's val split, and
    ``source_val`` adds the source's (every rank evaluates all of it). Each stream shuffles
    deterministically from its own seed, is sharded per rank and (with ``data.drop_last``) drops
    its last partial batch (D and BatchNorm prefer full batches). ``batch_sizes``: per stream
    name, default ``data.batch_size``.

    ``pin_memory``: whether a CUDA device will consume the batches (and ``data.pin_memory``
    allows it). With ``world_size`` > 1 each rank gets its shard of train and of val, and only
    rank 0 writes ``data_split.json`` / ``skipped.json`` (other ranks log their skips).
    ``val_samples``: each val loader scores at most its first that many samples (a smoke run's
    evaluation, ``train.smoke``); None: all of them.
    """
    sizes = {spec.name: (batch_sizes or {}).get(spec.name, cfg.batch_size) for spec in streams}
    if catalog is None:
        catalog = Catalog.for_streams(cfg, target, streams, sizes, world_size)
    bundle = build_pools(catalog, run_dir=run_dir if rank == 0 else None)
    pools = _drawn_pools(bundle)
    _check_shrunk_pools(catalog, bundle, streams, sizes, world_size)
    loaders: dict[str, DataLoader] = {}
    for spec in streams:
        dataset = pools[spec.pool]
        stream_seed = seed if spec.seed_word is None else derived_seed(seed, spec.seed_word)
        # Seed the in-process pipeline too: with num_workers = 0 no worker_init_fn runs.
        seed_transform(getattr(dataset, "transform", None), stream_seed)
        workers = _worker_options(cfg, pin_memory, [dataset])
        # Order from (seed, epoch) and augmentation seeded per sample: resumable mid-epoch, and
        # the same whatever the number of workers (segadv/data/resumable.py).
        loaders[spec.name] = SegLoader(
            PerSampleSeeded(dataset),
            batch_size=sizes[spec.name],
            sampler=ResumableSampler(len(dataset), seed=stream_seed, shuffle=True, rank=rank,
                                     world_size=world_size),
            drop_last=cfg.drop_last,
            generator=_generator(stream_seed, rank),
            collate_fn=SameSizeCollate(TRAIN_KEY),
            skipped=bundle.skipped,
            **workers,
        )
    val = bundle.target_val if bundle.target_val is not None else bundle.val
    seed_transform(getattr(val, "transform", None), seed + 1)
    workers = _worker_options(cfg, pin_memory, [val])
    run = RunLoaders(loaders, _val_loader(val, cfg, seed, rank, world_size, workers, bundle.skipped, val_samples))
    if source_val and bundle.target_val is not None:
        # The source's val, scanned once with the rest; no pinned memory (a side evaluation).
        seed_transform(getattr(bundle.val, "transform", None), seed + 1)
        run.source_val = _val_loader(bundle.val, cfg, seed, 0, 1, _worker_options(cfg, False, [bundle.val]),
                                     bundle.skipped, val_samples)
    return run


def _drawn_pools(bundle: DataBundle) -> dict[str, Optional[Dataset]]:
    pools = {"labeled": bundle.train, "unlabeled": bundle.unlabeled}
    if bundle.target is not None:
        pools["target"] = bundle.target
    return pools


def _check_shrunk_pools(catalog: Catalog, bundle: DataBundle, streams: Sequence[StreamSpec],
                        sizes: Mapping[str, int], world_size: int) -> None:
    """The streams whose pool the scan left samples out of (``data.on_error=skip``) against the
    pool as scanned; the others were checked against their pool as listed, with the catalog."""
    listed, scanned = listed_pools(catalog), bundle.pools()
    shrunk = [spec for spec in streams if _count(scanned.get(spec.pool)) != _count(listed.get(spec.pool))]
    check_stream_pools(shrunk, scanned, sizes, catalog.data.drop_last, world_size)


def _count(pool: Optional[Pool]) -> int:
    return pool.count if pool is not None else 0


def build_val_loader(
    cfg: DataConfig, *, seed: int, pin_memory: bool, skipped: Optional[SkipRecorder] = None, split: str = "val"
) -> DataLoader:
    """The loader of the split segadv-eval scores alone, ``val`` or ``test`` (see
    ``build_val_dataset``), exactly as training builds its val loader. Samples left out under
    ``data.on_error=skip`` are recorded in ``skipped`` (default: a recorder of its own, logging
    only), reachable as the loader's ``skipped``."""
    skipped = skipped if skipped is not None else SkipRecorder()
    val = build_val_dataset(cfg, skipped, split)
    seed_transform(getattr(val, "transform", None), seed + 1)
    return _val_loader(val, cfg, seed, 0, 1, _worker_options(cfg, pin_memory, [val]), skipped)


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
    skipped: Optional[SkipRecorder], samples: Optional[int] = None,
) -> DataLoader:
    """``samples``: only the first that many of ``val`` are scored (None: all)."""
    length = len(val) if samples is None else min(samples, len(val))
    return SegLoader(
        val,
        batch_size=cfg.val_batch_size,
        sampler=ShardSampler(length, rank, world_size) if world_size > 1 or length < len(val) else None,
        shuffle=False,
        drop_last=False,
        # Own generator: worker seeds come from it, not from the global torch RNG.
        generator=_generator(seed + 1, rank),
        collate_fn=ValCollate(),
        skipped=skipped,
        **workers,
    )
