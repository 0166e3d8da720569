"""A procedurally generated segmentation dataset: coloured shapes on a textured background.

It exists so that the whole pipeline (training, evaluation, checkpoints) can be exercised and
demonstrated without downloading anything. Every sample is a pure function of
``(seed, split, index)``, so runs are reproducible and train/val never share a sample.

Design choices that keep the task honest but learnable:

* the class is the *shape kind*, never the colour: each shape gets a fresh random colour, so a
  network has to look at geometry rather than hue;
* the background has smooth gradients, low-frequency blobs, a faint stripe texture and
  per-pixel noise, so "anything not flat is foreground" does not work;
* shapes are 12%..40% of the image side and their colour is pushed away from the local
  background colour, so they stay clearly visible;
* later shapes paint over earlier ones in both image and mask, so image and mask always agree.

Drawing uses numpy only (no OpenCV) and costs well under 2 ms for a 128x128 sample.

A second domain, ``domain="target"``, draws the same classes and shapes with another look (for
domain adaptation): a strong checkerboard over the background (edges a source-trained network
takes for shapes), a colour cast with less saturation, uneven lighting, slight blur and more
noise. Its samples are drawn from their own random streams (not restyled copies of the source's).

A third, ``domain="pretext"``, is another task for pretraining an encoder (a warm start like the
references' ImageNet weights): the source look, but other shape classes (``PRETEXT_CLASSES``: a
cross, a star, a hexagon, a crescent), none of which 5-class source or target data draw (the
experiments'), and its own random streams, so it shares no image and no label with them.
"""

from __future__ import annotations

import math
import zlib
from typing import Callable, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

SHAPE_CLASSES: tuple[str, ...] = ("background", "circle", "square", "triangle", "ring", "cross")
# The pretext domain's classes: shapes the experiments' data (5 classes: background to ring) never draws.
PRETEXT_CLASSES: tuple[str, ...] = ("background", "cross", "star", "hexagon", "crescent")

MIN_SHAPES = 1
MAX_SHAPES = 3
MIN_SIZE_FRAC = 0.25  # shape extent as a fraction of the image side
MAX_SIZE_FRAC = 0.50
MIN_CONTRAST = 90.0  # minimum L2 distance (0..255 RGB) between a shape and the background under it
_COLOUR_TRIES = 8

Transform = Callable[..., dict]


def split_id(split: str) -> int:
    """A stable integer for a split name (``hash()`` is salted per process, crc32 is not)."""
    return zlib.crc32(split.encode("utf-8"))


# --------------------------------------------------------------------------------------------
# Background


def _upsample_matrix(out_size: int, grid: int) -> np.ndarray:
    """Linear-interpolation weights ``(out_size, grid)`` that stretch ``grid`` knots to a side."""
    pos = np.linspace(0.0, grid - 1.0, out_size, dtype=np.float32)
    lo = np.clip(np.floor(pos).astype(np.int64), 0, grid - 2)
    frac = pos - lo
    weights = np.zeros((out_size, grid), dtype=np.float32)
    rows = np.arange(out_size)
    weights[rows, lo] = 1.0 - frac
    weights[rows, lo + 1] = frac
    return weights


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A float32 HxWx3 textured background: base colour + gradient + blobs + stripes.

    Each component is random in strength and direction so the background never has a single
    recognisable look; per-pixel noise is added later over the whole image (shapes included).
    Base colour, gradient and blobs all live on a coarse knot grid that is bilinearly stretched
    over the image in one product (a linear ramp survives bilinear interpolation exactly), which
    keeps the per-pixel work to a handful of passes.
    """
    grid = int(rng.integers(3, 7))
    knot_coords = np.linspace(-0.5, 0.5, grid, dtype=np.float32)

    base = rng.uniform(30.0, 225.0, size=3).astype(np.float32)
    # Smooth linear gradient in a random direction, independent amplitude per channel.
    angle = rng.uniform(0.0, 2.0 * math.pi)
    ramp = knot_coords[None, :] * math.cos(angle) + knot_coords[:, None] * math.sin(angle)
    amplitude = rng.uniform(-60.0, 60.0, size=3).astype(np.float32)
    # Low-frequency blobs: random knot values.
    blobs = rng.normal(0.0, 22.0, size=(grid, grid, 3)).astype(np.float32)
    knots = base + ramp[..., None] * amplitude + blobs  # (grid, grid, 3)

    up = _upsample_matrix(size, grid)  # (size, grid)
    image = np.tensordot(up, np.tensordot(up, knots, axes=([1], [1])), axes=([1], [1]))

    # Faint oriented stripes: a mid-frequency texture that is not a shape. The 2D sinusoid is
    # separable: sin(a + b) = sin(a) cos(b) + cos(a) sin(b).
    coords = np.linspace(-0.5, 0.5, size, dtype=np.float32)
    freq = rng.uniform(4.0, 14.0) * 2.0 * math.pi
    s_angle = rng.uniform(0.0, math.pi)
    phase = rng.uniform(0.0, 2.0 * math.pi)
    along_x = freq * math.cos(s_angle) * coords
    along_y = freq * math.sin(s_angle) * coords + phase
    stripes = np.outer(np.cos(along_y), np.sin(along_x))
    stripes += np.outer(np.sin(along_y), np.cos(along_x))
    stripes *= np.float32(rng.uniform(0.0, 14.0))
    image += stripes[..., None]
    return image


# --------------------------------------------------------------------------------------------
# Shapes: each returns a boolean mask over a local patch, given rotated patch coordinates.


def _circle(u: np.ndarray, v: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    return u * u + v * v <= r * r


def _square(u: np.ndarray, v: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    half = 0.8 * r  # rotated corners reach ~1.13 r, about the other shapes' extent
    return np.maximum(np.abs(u), np.abs(v)) <= half


def _triangle(u: np.ndarray, v: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    # Equilateral, circumradius ~1.1 r: inside iff within the inradius along all three normals.
    inradius = 0.55 * r
    inside = np.ones(u.shape, dtype=bool)
    for k in range(3):
        a = 2.0 * math.pi * k / 3.0
        inside &= u * math.cos(a) + v * math.sin(a) <= inradius
    return inside


def _ring(u: np.ndarray, v: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    inner = r * rng.uniform(0.45, 0.62)
    d2 = u * u + v * v
    return (d2 <= r * r) & (d2 >= inner * inner)


def _cross(u: np.ndarray, v: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    half_width = r * rng.uniform(0.25, 0.34)
    au, av = np.abs(u), np.abs(v)
    return ((au <= r) & (av <= half_width)) | ((av <= r) & (au <= half_width))


def _star(u: np.ndarray, v: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    # Five points: the radius swings between r and an inner radius with the angle.
    inner = rng.uniform(0.4, 0.55)
    phase = np.mod(np.arctan2(v, u), 2.0 * math.pi / 5) / (2.0 * math.pi / 5)  # 0..1 within a point
    reach = r * (inner + (1.0 - inner) * np.abs(1.0 - 2.0 * phase))
    return u * u + v * v <= reach * reach


def _hexagon(u: np.ndarray, v: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    apothem = 0.9 * r
    inside = np.ones(u.shape, dtype=bool)
    for k in range(3):
        a = math.pi * k / 3.0
        inside &= np.abs(u * math.cos(a) + v * math.sin(a)) <= apothem
    return inside


def _crescent(u: np.ndarray, v: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    # A disc minus a shifted disc of the same size.
    shift = r * rng.uniform(0.45, 0.7)
    return (u * u + v * v <= r * r) & ((u - shift) ** 2 + v * v > r * r)


_SHAPE_DRAWERS = {
    "circle": _circle,
    "square": _square,
    "triangle": _triangle,
    "ring": _ring,
    "cross": _cross,
    "star": _star,
    "hexagon": _hexagon,
    "crescent": _crescent,
}
assert set(_SHAPE_DRAWERS) == set(SHAPE_CLASSES[1:] + PRETEXT_CLASSES[1:]), "every shape class needs a drawer"


def _shape_colour(rng: np.random.Generator, under: np.ndarray) -> np.ndarray:
    """A random colour at least ``MIN_CONTRAST`` away from ``under`` (the local background).

    The colour is random per shape so it never encodes the class; the contrast constraint only
    keeps the shape visible. After a few misses (only likely on a mid-grey background) we fall
    back to the RGB complement pushed towards the nearest extreme, which is always far away.
    """
    for _ in range(_COLOUR_TRIES):
        colour = rng.uniform(0.0, 255.0, size=3).astype(np.float32)
        if float(np.linalg.norm(colour - under)) >= MIN_CONTRAST:
            return colour
    complement = 255.0 - under
    bright = complement >= 127.5
    return np.where(bright, np.maximum(complement, 200.0), np.minimum(complement, 55.0))


def _paint_shape(
    rng: np.random.Generator, image: np.ndarray, mask: np.ndarray, class_id: int, name: str
) -> None:
    """Draw one randomly placed, sized, rotated and coloured shape into ``image`` and ``mask``."""
    size = image.shape[0]
    r = 0.5 * size * rng.uniform(MIN_SIZE_FRAC, MAX_SIZE_FRAC)
    cy, cx = rng.uniform(r, size - r, size=2)
    theta = rng.uniform(0.0, 2.0 * math.pi)

    # Work on the bounding box only: cost scales with the shape, not the image.
    reach = 1.2 * r + 1.0
    y0, y1 = max(int(cy - reach), 0), min(int(cy + reach) + 1, size)
    x0, x1 = max(int(cx - reach), 0), min(int(cx + reach) + 1, size)
    dy = (np.arange(y0, y1, dtype=np.float32) + 0.5 - cy)[:, None]
    dx = (np.arange(x0, x1, dtype=np.float32) + 0.5 - cx)[None, :]
    cos_t, sin_t = math.cos(theta), math.sin(theta)
    u = dx * cos_t + dy * sin_t
    v = -dx * sin_t + dy * cos_t
    inside = _SHAPE_DRAWERS[name](u, v, r, rng)

    under = image[int(cy), int(cx)]
    colour = _shape_colour(rng, under)
    # Gentle shading across the shape so it is not a perfectly flat fill.
    shade = (u * np.float32(rng.uniform(-0.6, 0.6)) + v * np.float32(rng.uniform(-0.6, 0.6)))
    patch = image[y0:y1, x0:x1]
    patch[inside] = colour + shade[inside][:, None]
    mask[y0:y1, x0:x1][inside] = class_id


DOMAINS = ("source", "target", "pretext")


def domain_classes(domain: str) -> tuple[str, ...]:
    """The class names a domain draws from, index = class id."""
    return PRETEXT_CLASSES if domain == "pretext" else SHAPE_CLASSES


def _checker_texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """The target domain's background texture: a rotated checkerboard of random cell size."""
    coords = np.arange(size, dtype=np.float32)
    cell = rng.uniform(3.0, 8.0)
    angle = rng.uniform(0.0, math.pi / 2)
    u = (coords[None, :] * math.cos(angle) + coords[:, None] * math.sin(angle)) / cell
    v = (-coords[None, :] * math.sin(angle) + coords[:, None] * math.cos(angle)) / cell
    checker = (np.floor(u) + np.floor(v)) % 2 * 2.0 - 1.0
    return (checker * np.float32(rng.uniform(25.0, 45.0))).astype(np.float32)


def _blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of an HxWx3 float image (edges replicated)."""
    radius = max(1, int(math.ceil(2.5 * sigma)))
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1, dtype=np.float32) / sigma) ** 2)
    taps /= taps.sum()
    padded = np.pad(image, ((radius, radius), (radius, radius), (0, 0)), mode="edge")
    rows = sum(w * padded[i : i + image.shape[0]] for i, w in enumerate(taps))
    return sum(w * rows[:, i : i + image.shape[1]] for i, w in enumerate(taps)).astype(np.float32)


def _restyle_target(rng: np.random.Generator, image: np.ndarray) -> np.ndarray:
    """The target domain's camera: colour cast and less saturation, uneven lighting, blur."""
    size = image.shape[0]
    grey = image.mean(axis=2, keepdims=True)
    saturation = np.float32(rng.uniform(0.5, 0.8))
    image = grey + saturation * (image - grey)
    image = image * rng.uniform(0.75, 1.15, size=3).astype(np.float32) + rng.uniform(-15.0, 15.0, size=3).astype(
        np.float32)
    # Lighting: a bright spot somewhere, falling off to a darker rim.
    coords = np.linspace(-1.0, 1.0, size, dtype=np.float32)
    cy, cx = rng.uniform(-0.8, 0.8, size=2)
    dist2 = (coords[:, None] - cy) ** 2 + (coords[None, :] - cx) ** 2
    light = np.float32(rng.uniform(1.0, 1.2)) - np.float32(rng.uniform(0.1, 0.3)) * dist2
    image = image * np.clip(light, 0.5, 1.5)[..., None]
    return _blur(image, float(rng.uniform(0.4, 0.7)))


def generate_sample(
    rng: np.random.Generator, image_size: int, num_classes: int, domain: str = "source"
) -> tuple[np.ndarray, np.ndarray]:
    """Draw one ``(image uint8 HxWx3, mask uint8 HxW)`` pair from ``rng``."""
    image = _background(rng, image_size)
    if domain == "target":
        image += _checker_texture(rng, image_size)[..., None]
    mask = np.zeros((image_size, image_size), dtype=np.uint8)
    n_shapes = int(rng.integers(MIN_SHAPES, MAX_SHAPES + 1))
    names = domain_classes(domain)
    for class_id in rng.integers(1, num_classes, size=n_shapes):
        _paint_shape(rng, image, mask, int(class_id), names[int(class_id)])
    if domain == "target":
        image = _restyle_target(rng, image)
    noise = rng.standard_normal(image.shape, dtype=np.float32)
    noise *= np.float32(rng.uniform(8.0, 16.0) if domain == "target" else rng.uniform(4.0, 14.0))
    image += noise
    np.clip(image, 0.0, 255.0, out=image)
    return image.astype(np.uint8), mask


# --------------------------------------------------------------------------------------------
# Dataset


class SyntheticShapes(Dataset):
    """Shapes-on-texture segmentation samples, generated on the fly and fully deterministic.

    Sample ``i`` of ``split`` depends only on ``(seed, split, i)``, not on access order or worker,
    so shuffling and multi-process loading cannot change the data.
    """

    def __init__(
        self,
        split: str,
        length: int,
        image_size: int,
        num_classes: int,
        seed: int,
        transform: Optional[Transform] = None,
        domain: str = "source",
    ) -> None:
        if domain not in DOMAINS:
            raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")
        names = domain_classes(domain)
        if not 2 <= num_classes <= len(names):
            raise ValueError(
                f"num_classes must be in [2, {len(names)}] for synthetic shapes ({domain} domain), "
                f"got {num_classes}"
            )
        if length <= 0:
            raise ValueError(f"length must be > 0, got {length}")
        if image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {image_size}")
        self.split = split
        self.length = length
        self.image_size = image_size
        self.num_classes = num_classes
        self.seed = seed
        self.transform = transform
        self.domain = domain
        # numpy seeds must be non-negative; wrapping keeps distinct int64 seeds distinct. The
        # target and pretext domains draw from their own streams; the source keeps the original ones.
        self._entropy = (seed % 2**64, split_id(split)) + ((split_id(domain),) if domain != "source" else ())

    @property
    def class_names(self) -> list[str]:
        return list(domain_classes(self.domain)[: self.num_classes])

    def __len__(self) -> int:
        return self.length

    def _index(self, i: int) -> int:
        i = int(i)
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError(f"index {i} out of range for {self.split} split of {self.length}")
        return i

    def raw(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The untransformed ``(image uint8 HxWx3, mask uint8 HxW)`` pair for sample ``i``."""
        i = self._index(i)
        rng = np.random.default_rng([*self._entropy, i])
        return generate_sample(rng, self.image_size, self.num_classes, self.domain)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = self.raw(i)
        if self.transform is None:
            return _as_tensor(image, channels_last=True), torch.from_numpy(mask).long()
        out = self.transform(image=image, mask=mask)
        return _as_tensor(out["image"], channels_last=True), _as_tensor(out["mask"]).long()

    def __repr__(self) -> str:
        return (
            f"SyntheticShapes(split={self.split!r}, length={self.length}, "
            f"image_size={self.image_size}, num_classes={self.num_classes}, seed={self.seed}"
            + (f", domain={self.domain!r})" if self.domain != "source" else ")")
        )


def _as_tensor(x: object, channels_last: bool = False) -> torch.Tensor:
    """Accept a transform's output whether or not it ended with ``ToTensorV2``."""
    if isinstance(x, torch.Tensor):
        return x
    arr = np.ascontiguousarray(x)
    tensor = torch.from_numpy(arr)
    if channels_last and tensor.ndim == 3:
        tensor = tensor.permute(2, 0, 1).contiguous()
    return tensor
