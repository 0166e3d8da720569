"""Stand-in batches: each stream's batch shape from the config, no file read.

A stream's batch is what its loader would hand out: ``(images, labels)`` from the labeled pool,
images alone from the unlabeled pool and the target (segadv/data/streams.py ``StreamSpec``). The image size is what the
configured train pipeline makes: it is run once on blank images of two sizes, and must give one
size for both (the fixed-size step every batched pipeline ends with); synthetic data is
``data.synthetic.image_size`` through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from segadv.config import Config
from segadv.config.schema import DataConfig
from segadv.data.augment import build_transform
from segadv.data.streams import StreamSpec
from segadv.errors import UserError
from segadv.methods import method_class

# Blank inputs of two unrelated sizes (H, W): a pipeline that ends in a fixed size maps both to it.
PROBE_SIZES = ((375, 500), (1024, 2048))


@dataclass(frozen=True)
class BatchShape:
    batch_size: int
    height: int
    width: int
    labeled: bool
    # The labels' (H, W) where it is not the images' (a val batch under data.val_input_size).
    label_size: tuple[int, int] | None = None


def crop_size(data: DataConfig, key: str) -> tuple[int, int]:
    """The (H, W) the train pipeline of ``data`` produces."""
    transform = build_transform(data.train_transforms, data.input_normalization, key, ignore_index=data.ignore_index)
    sizes = [(data.synthetic.image_size,) * 2] if data.kind == "synthetic" else PROBE_SIZES
    out = set()
    for h, w in sizes:
        image = transform(image=np.zeros((h, w, 3), np.uint8), mask=np.zeros((h, w), np.uint8))["image"]
        out.add(tuple(image.shape[-2:]))
    if len(out) > 1:
        raise UserError(f"{key}: the batch size in pixels depends on each image's size ({sorted(out)} from "
                        f"{sorted(sizes)}); end the pipeline with a fixed-size step (RandomCrop / Resize) to plan it")
    return out.pop()


# The largest image of each dataset whose val pipeline keeps the files' own sizes (VOC's are at
# most 500 px a side; Cityscapes' 1024x2048; GTA5's 1052x1914). Other kinds: the larger probe.
LARGEST_IMAGE = {"voc": (500, 500), "cityscapes": (1024, 2048), "gta5": (1052, 1914)}


def val_size(data: DataConfig) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (H, W) of a val batch's images and of its labels: the val pipeline's fixed size, or,
    where it keeps each image's own size, the largest image the dataset kind has (the evaluation's
    worst batch). They differ under ``data.val_input_size`` (the image alone resized: G's input is
    smaller, its logits upsampled to the label's size)."""
    transform = build_transform(data.val_transforms, data.input_normalization, "data.val_transforms",
                                ignore_index=data.ignore_index, image_size=data.val_input_size)
    h, w = (data.synthetic.image_size,) * 2 if data.kind == "synthetic" else LARGEST_IMAGE.get(data.kind, PROBE_SIZES[-1])
    out = transform(image=np.zeros((h, w, 3), np.uint8), mask=np.zeros((h, w), np.uint8))
    return tuple(out["image"].shape[-2:]), tuple(out["mask"].shape[-2:])


def stream_shapes(cfg: Config, streams: tuple[StreamSpec, ...]) -> dict[str, BatchShape]:
    sizes = method_class(cfg.method.name).stream_batch_sizes(cfg)
    shapes = {}
    for spec in streams:
        data, key = (cfg.target_data, "target_data.train_transforms") if spec.pool == "target" else (
            cfg.data, "data.train_transforms")
        if data is None:
            raise UserError(f"target_data: the {cfg.method.name} method draws a target stream; give target_data")
        h, w = crop_size(data, key)
        shapes[spec.name] = BatchShape(sizes.get(spec.name, cfg.data.batch_size), h, w, spec.pool == "labeled")
    return shapes


def make_batch(shape: BatchShape, num_classes: int, seed: int = 0) -> Any:
    """Normalised images and class ids (a few ignored) on the CPU, as a loader yields them."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(shape.batch_size, 3, shape.height, shape.width, generator=gen)
    if not shape.labeled:
        return images
    label_size = shape.label_size or (shape.height, shape.width)
    labels = torch.randint(0, num_classes, (shape.batch_size, *label_size), generator=gen)
    return images, labels


class FixedStream:
    """A stream that hands out the same batch every time (what a method calls: ``next()``)."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def next(self) -> Any:
        return self.batch
