"""A sampler whose position can be saved and restored, with augmentation seeded per sample.

The epoch's order is a pure function of ``(seed, epoch)`` and each sample's augmentation seed of
``(seed, epoch, index)``. So a run resumed mid-epoch sees exactly the samples, in the order and
with the augmentations, that the uninterrupted run would have, whatever the number of workers.
Sharding across ranks follows ``DistributedSampler`` (rank r takes every world_size-th sample).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from segadv.data.augment import seed_transform


def derived_seed(*words: int) -> int:
    """A well-mixed 63-bit seed from non-negative integers (numpy's SeedSequence hashing)."""
    return int(np.random.SeedSequence([w % 2**63 for w in words]).generate_state(1, np.uint64)[0] % 2**63)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return derived_seed(seed, epoch, index + 1)  # + 1: word 0 is the epoch's shuffle


class ResumableSampler(Sampler[tuple[int, int]]):
    """Yields ``(index, augmentation_seed)`` for this rank's share of the epoch."""

    def __init__(
        self, length: int, *, seed: int, shuffle: bool = True, rank: int = 0, world_size: int = 1
    ) -> None:
        self.length = length
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._skip = 0
        # Every rank gets the same number of samples: the tail that does not divide is dropped.
        self.per_rank = length // world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip_next(self, samples: int) -> None:
        """Skip this many of this rank's samples at the start of the next iteration (resume)."""
        self._skip = samples

    def __len__(self) -> int:
        return self.per_rank

    def __iter__(self) -> Iterator[tuple[int, int]]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(derived_seed(self.seed, self.epoch, 0))
            order = torch.randperm(self.length, generator=gen).tolist()
        else:
            order = list(range(self.length))
        shard = order[: self.per_rank * self.world_size][self.rank :: self.world_size]
        start, self._skip = self._skip, 0
        for index in shard[start:]:
            yield index, sample_seed(self.seed, self.epoch, index)


class PerSampleSeeded(Dataset):
    """Takes ``(index, seed)`` keys: reseeds the dataset's augmentation, then fetches ``index``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, seed = key
        transform = getattr(self.dataset, "transform", None)
        if transform is not None:
            seed_transform(transform, seed)
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:
        # Dataset attributes (class_names, transform, ...) stay reachable through the wrapper, but
        # no protocol hook: a forwarded ``Subset.__getitems__`` would make the DataLoader hand the
        # inner dataset ``(index, seed)`` keys and skip the per-sample seeding above.
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)
