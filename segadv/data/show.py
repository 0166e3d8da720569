"""segadv-data show's samples: the first labeled training samples as training's datasets deliver
them (data.train_transforms applied, seeded as training seeds them, so the same command draws the
same picture), and the files they come from (which the picture may never replace)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def sample_files(dataset: Any) -> list[tuple[str, Path]]:
    """Each sample's image and mask, as inputs nothing may replace (none for generated data)."""
    return [(what, path) for s in getattr(dataset, "samples", ())
            for what, path in (("an image", s.image), ("a mask", s.mask)) if path is not None]


def first_samples(dataset: Any, num: int, seed: int) -> list[tuple[Any, Any]]:
    """The first ``num`` ``(image, mask)`` pairs the dataset delivers, its transform seeded with
    ``seed``; a sample left out (``data.on_error: skip``) is not replaced by another."""
    from segadv.data.augment import seed_transform

    seed_transform(getattr(dataset, "transform", None), seed)
    picked = [dataset[i] for i in range(min(num, len(dataset)))]
    return [item for item in picked if item is not None]
