"""Datasets over files on disk: labeled image/mask pairs and the unlabeled image pool.

Labels are checked as they are read (values that are neither a class id nor the ignore value are
an error naming the file and the values), so a bad mask never reaches the loss, where it would be
a CUDA device-side assert.

With ``data.on_error: skip`` a sample that fails to load is flagged in a small shared-memory
array; a training set replaces it by the next good sample (batches stay full), an evaluation set
(``drop_bad``) hands out None instead, which the val loader leaves out, so no sample is scored
twice. The flags are visible to the main process, which lists the dropped samples in the run dir
(``skips.SkipRecorder``). Samples that fail the cheap start-up scan (missing files, unreadable
headers, size mismatches) never get here.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from segadv.data.files import (
    LabelSpec,
    Problem,
    Sample,
    SampleError,
    check_sizes,
    read_image,
    read_mask,
)
from segadv.data.synthetic import _as_tensor

log = logging.getLogger(__name__)

Transform = Callable[..., dict]


def load_pair(sample: Sample, spec: LabelSpec) -> tuple[np.ndarray, np.ndarray]:
    """``(image HxWx3 uint8, train-id mask HxW uint8)``; SampleError naming the file at fault."""
    assert sample.mask is not None, f"sample {sample.id} has no mask"
    image = read_image(sample.image)
    raw = read_mask(sample.mask)
    check_sizes(image.shape[:2], raw.shape, sample)
    return image, spec.to_train_ids(raw, sample.mask)


class _Skippable(Dataset):
    """Shared ``on_error`` handling: raise, or flag the sample and use the next good one (or,
    with ``drop_bad``, None: the sample is left out)."""

    split: str
    samples: list[Sample]
    on_error: str
    drop_bad: bool = False

    def _init_flags(self) -> None:
        # Created small and in normal memory; loaders.py moves it to shared memory when worker
        # processes will load samples.
        self.bad = torch.zeros(len(self.samples), dtype=torch.uint8)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.samples]

    def _load(self, i: int) -> Any:
        raise NotImplementedError

    def _load_good(self, i: int) -> Any:
        if self.on_error == "raise":
            try:
                return self._load(i)
            except SampleError as err:
                raise SampleError(
                    f"{err} ({self.split} split; data.on_error=skip drops bad samples; "
                    "`segadv-data check` lists every problem)"
                ) from None
        if self.drop_bad:
            if self.bad[i]:
                return None
            try:
                return self._load(i)
            except SampleError:
                self.bad[i] = 1
                return None
        n = len(self.samples)
        for k in range(n):
            j = (i + k) % n
            if self.bad[j]:
                continue
            try:
                return self._load(j)
            except SampleError:
                self.bad[j] = 1
        raise SampleError(f"every sample of the {self.split} split failed to load (data.on_error=skip)")

    def problem(self, i: int) -> Problem:
        """What is wrong with sample ``i`` (re-reads it; for the main process's skip list)."""
        sample = self.samples[i]
        try:
            self._load(i)
            message = "failed to load in a worker process (reads fine now)"
        except SampleError as err:
            message = str(err)
        return Problem(self.split, sample.id, sample.files(), message)

    def flagged(self) -> list[int]:
        return torch.nonzero(self.bad).flatten().tolist()


class SegmentationFiles(_Skippable):
    """Labeled ``(image, mask)`` pairs from files, with a joint albumentations pipeline.

    Items are ``(float image 3xHxW, int64 mask HxW)`` like ``SyntheticShapes``; the mask holds
    train ids and ``spec.ignore_index``. ``drop_bad`` (evaluation sets): under
    ``on_error="skip"`` a sample that fails to load is None, never another sample.
    """

    def __init__(
        self, split: str, samples: Sequence[Sample], spec: LabelSpec,
        transform: Optional[Transform] = None, on_error: str = "raise", drop_bad: bool = False,
    ) -> None:
        self.split = split
        self.samples = list(samples)
        self.spec = spec
        self.transform = transform
        self.on_error = on_error
        self.drop_bad = drop_bad
        self._init_flags()

    @property
    def class_names(self) -> list[str]:
        return list(self.spec.class_names)

    def raw(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The untransformed ``(image, train-id mask)`` of sample ``i``; SampleError if bad."""
        return load_pair(self.samples[i], self.spec)

    _load = raw

    def __getitem__(self, i: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        loaded = self._load_good(int(i))
        if loaded is None:  # left out (drop_bad)
            return None
        image, mask = loaded
        if self.transform is None:
            return _as_tensor(image, channels_last=True), torch.from_numpy(mask).long()
        out = self.transform(image=image, mask=mask)
        return _as_tensor(out["image"], channels_last=True), _as_tensor(out["mask"]).long()

    def __repr__(self) -> str:
        return f"SegmentationFiles(split={self.split!r}, samples={len(self.samples)})"


class UnlabeledImages(_Skippable):
    """The unlabeled pool: images only (their masks are never read), for semi-supervised use."""

    def __init__(
        self, split: str, samples: Sequence[Sample], transform: Optional[Transform] = None,
        on_error: str = "raise",
    ) -> None:
        self.split = split
        self.samples = [Sample(s.id, s.image, None) for s in samples]
        self.transform = transform
        self.on_error = on_error
        self._init_flags()

    def _load(self, i: int) -> np.ndarray:
        return read_image(self.samples[i].image)

    def __getitem__(self, i: int) -> torch.Tensor:
        image = self._load_good(int(i))
        if self.transform is not None:
            image = self.transform(image=image)["image"]
        return _as_tensor(image, channels_last=True)

    def __repr__(self) -> str:
        return f"UnlabeledImages(split={self.split!r}, samples={len(self.samples)})"
