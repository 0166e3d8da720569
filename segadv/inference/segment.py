"""Images to masks on a backend: each batch of inputs read, tiled, run and put back together, and
written as a palette PNG (pixel values class ids) with, on request, an overlay. numpy and Pillow
only: the ONNX path segments with it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from segadv.data.masks import overlay_png, palette_png
from segadv.errors import UserError
from segadv.fsutil import atomic_write_bytes, make_dir
from segadv.inference.backends import Backend
from segadv.inference.inputs import chunks, read_image, unreadable_error
from segadv.inference.outputs import OVERLAY_DIR
from segadv.inference.tiling import assemble, plan_image, run_windows

MAX_CLASSES = 256  # a palette PNG's pixel is one byte


@dataclass(frozen=True)
class MaskFormat:
    """What a model's metadata says its masks are: class names, colours, the output's form and the
    size multiple its inputs are padded to."""

    classes: list[str]
    palette: np.ndarray
    class_ids: bool  # the model outputs class ids (argmax in the graph), not logits
    divisor: int

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @classmethod
    def of(cls, meta: dict[str, Any]) -> MaskFormat:
        num_classes = len(meta["classes"])
        if num_classes > MAX_CLASSES:
            raise UserError(f"{num_classes} classes do not fit a palette PNG (at most {MAX_CLASSES})")
        return cls(list(meta["classes"]), np.asarray(meta["palette"], dtype=np.uint8).reshape(-1, 3),
                   meta["output"]["kind"] == "class_ids", int(meta["input"].get("size_divisor", 1)))


@dataclass(frozen=True)
class Tiling:
    """How images larger than ``max_size`` run (docs/inference.md) and how many go per forward."""

    mode: str = "slide"
    max_size: int = 1024
    overlap: float = 0.25
    batch_size: int = 4


@dataclass
class Segmented:
    """What a run of :func:`segment_images` did."""

    written: int = 0
    windows: int = 0  # forward windows over all images
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # pixels per class
    problems: list[str] = field(default_factory=list)  # inputs whose pixels did not decode (left out)
    seconds: float = 0.0


def segment_images(backend: Backend, masks: MaskFormat, images: Sequence[Path], out_dir: Path, tiling: Tiling, *,
                   overlay_alpha: float | None = None, skip_unreadable: bool = False) -> Segmented:
    """Write ``out_dir/<stem>.png`` for each of ``images`` (checked by outputs.check_outputs) and,
    with ``overlay_alpha``, ``out_dir/overlay/<stem>.png``. An image whose pixels do not decode
    stops the run after its batch's readable images are written, unless ``skip_unreadable``."""
    make_dir(out_dir)
    if overlay_alpha is not None:
        make_dir(out_dir / OVERLAY_DIR)
    done = Segmented(counts=np.zeros(masks.num_classes, dtype=np.int64))
    t0 = time.perf_counter()
    for batch in chunks(images, tiling.batch_size):
        readable: list[tuple[Path, np.ndarray]] = []
        failed = []
        for path in batch:
            try:
                readable.append((path, read_image(path)))
            except UserError as err:  # pixel data that does not decode (a truncated file)
                failed.append(str(err))
        plans = [plan_image(img, mode=tiling.mode, max_size=tiling.max_size, overlap=tiling.overlap,
                            divisor=masks.divisor, fixed=backend.fixed_size) for _, img in readable]
        run_windows(backend, plans, tiling.batch_size)
        for (path, picture), plan in zip(readable, plans):
            labels = assemble(plan, masks.class_ids, masks.num_classes).astype(np.uint8)
            done.windows += len(plan.windows)
            done.counts += np.bincount(labels.reshape(-1), minlength=masks.num_classes)[:masks.num_classes]
            atomic_write_bytes(out_dir / f"{path.stem}.png", palette_png(labels, masks.palette))
            if overlay_alpha is not None:
                atomic_write_bytes(out_dir / OVERLAY_DIR / f"{path.stem}.png",
                                   overlay_png(picture, labels, masks.palette, overlay_alpha))
            done.written += 1
        if failed and not skip_unreadable:  # the batch's readable images are written first
            raise unreadable_error(failed, done.written)
        done.problems += failed
    done.seconds = time.perf_counter() - t0
    return done
