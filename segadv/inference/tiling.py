"""An image as model inputs and back: whole and padded to the network's size multiple, shrunk to
fit (``resize``), or cut into overlapping windows whose logits are averaged (``slide``); the
windows of many images batched by size through a backend. numpy and Pillow only."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
from PIL import Image

from segadv.export.sidecar import prepare_input
from segadv.inference.backends import Backend

MODES = ("slide", "resize")


@dataclass
class TilePlan:
    """How one image becomes model inputs and how the outputs go back together."""

    height: int
    width: int
    canvas: np.ndarray  # 3 x Hc x Wc uint8: the (resized and) padded image the windows come from
    windows: list[tuple[int, int]]  # top-left corners of the windows, each ``tile`` in size
    tile: tuple[int, int]
    scaled: Optional[tuple[int, int]] = None  # resize mode: the size the image was resized to
    outputs: list[np.ndarray] = field(default_factory=list)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _pad(chw: np.ndarray, height: int, width: int) -> np.ndarray:
    ph, pw = height - chw.shape[1], width - chw.shape[2]
    if ph == 0 and pw == 0:
        return chw
    mode = "reflect" if min(chw.shape[1:]) >= 2 else "edge"
    return np.pad(chw, ((0, 0), (0, ph), (0, pw)), mode=mode)


def _starts(length: int, tile: int, stride: int) -> list[int]:
    starts = list(range(0, max(length - tile, 0) + 1, stride))
    if starts[-1] + tile < length:
        starts.append(length - tile)
    return starts


def plan_image(image: np.ndarray, *, mode: str, max_size: int, overlap: float, divisor: int,
               fixed: Optional[tuple[int, int]]) -> TilePlan:
    h, w = image.shape[:2]
    chw = np.ascontiguousarray(image.transpose(2, 0, 1))
    limit = fixed or (max(divisor, max_size // divisor * divisor),) * 2
    if h <= limit[0] and w <= limit[1]:
        size = fixed or (_round_up(h, divisor), _round_up(w, divisor))
        return TilePlan(h, w, _pad(chw, *size), [(0, 0)], size)
    if mode == "resize":
        scale = min(limit[0] / h, limit[1] / w)
        rh, rw = min(limit[0], max(1, round(h * scale))), min(limit[1], max(1, round(w * scale)))
        small = np.asarray(Image.fromarray(image).resize((rw, rh), Image.BILINEAR)).transpose(2, 0, 1)
        size = fixed or (_round_up(rh, divisor), _round_up(rw, divisor))
        return TilePlan(h, w, _pad(np.ascontiguousarray(small), *size), [(0, 0)], size, scaled=(rh, rw))
    tile = limit
    canvas = _pad(chw, max(h, tile[0]), max(w, tile[1]))
    strides = [max(divisor, int(t * (1.0 - overlap)) // divisor * divisor) for t in tile]
    ys = _starts(canvas.shape[1], tile[0], strides[0])
    xs = _starts(canvas.shape[2], tile[1], strides[1])
    return TilePlan(h, w, canvas, [(y, x) for y in ys for x in xs], tile)


def _resize_plane(plane: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    return np.asarray(Image.fromarray(plane).resize((width, height), resample))


def assemble(plan: TilePlan, class_ids: bool, num_classes: int) -> np.ndarray:
    """The ``H x W`` class-id map of one image from its window outputs."""
    th, tw = plan.tile
    hc, wc = plan.canvas.shape[1:]
    if len(plan.windows) == 1 and plan.scaled is None:
        out = plan.outputs[0]
        labels = out if class_ids else out.argmax(axis=0)
        return labels[: plan.height, : plan.width]
    if plan.scaled is not None:
        rh, rw = plan.scaled
        out = plan.outputs[0]
        if class_ids:
            small = out[:rh, :rw].astype(np.int32)
            return _resize_plane(small, plan.height, plan.width, Image.NEAREST)
        planes = [_resize_plane(np.ascontiguousarray(out[c, :rh, :rw], dtype=np.float32), plan.height, plan.width,
                                Image.BILINEAR) for c in range(out.shape[0])]
        return np.stack(planes).argmax(axis=0)
    total = np.zeros((num_classes, hc, wc), dtype=np.float32)
    count = np.zeros((hc, wc), dtype=np.float32)
    for (y, x), out in zip(plan.windows, plan.outputs):
        if class_ids:  # each window votes for its class at each pixel
            for c in range(num_classes):
                total[c, y:y + th, x:x + tw] += out == c
        else:
            total[:, y:y + th, x:x + tw] += out
            count[y:y + th, x:x + tw] += 1
    if not class_ids:
        total /= np.maximum(count, 1)[None]
    return total.argmax(axis=0)[: plan.height, : plan.width]


# ----------------------------------------------------------------------------------- running


def run_windows(backend: Backend, plans: Sequence[TilePlan], batch_size: int) -> None:
    """Run every window of ``plans``, batching windows of the same size together."""
    meta = backend.meta
    kind, dtype = meta["input"]["kind"], meta["input"]["dtype"]
    norm = meta["normalization"]
    groups: dict[tuple[int, int], list[tuple[TilePlan, int]]] = defaultdict(list)
    for plan in plans:
        plan.outputs = [None] * len(plan.windows)  # type: ignore[list-item]
        for i in range(len(plan.windows)):
            groups[plan.tile].append((plan, i))
    step = backend.fixed_batch or batch_size
    for (th, tw), items in groups.items():
        for start in range(0, len(items), step):
            chunk = items[start:start + step]
            pixels = np.stack([p.canvas[:, y:y + th, x:x + tw] for p, i in chunk for (y, x) in [p.windows[i]]])
            if backend.fixed_batch and len(chunk) < backend.fixed_batch:
                fill = np.repeat(pixels[-1:], backend.fixed_batch - len(chunk), axis=0)
                pixels = np.concatenate([pixels, fill])
            out = backend.run(prepare_input(pixels, kind, dtype, norm["mean"], norm["std"], norm.get("channels", "RGB")))
            for (plan, i), result in zip(chunk, out):
                plan.outputs[i] = result
