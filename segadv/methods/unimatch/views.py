"""UniMatch's random parts, as its references make them: the strong views of an unlabeled image,
the CutMix boxes pasted into them, and the feature scales of its perturbation streams.

The references (LiheYoung/UniMatch and UniMatch-V2, ``dataset/semi.py`` and ``dataset/transform.py``,
identical in both) make each strong view in the data pipeline from the weak view's crop, on a PIL
image: ``ColorJitter(0.5, 0.5, 0.5, 0.25)`` with probability 0.8, ``RandomGrayscale(p=0.2)``, a
Gaussian blur (PIL's, radius ~ U(0.1, 2.0)) with probability 0.5, and a CutMix box with probability
0.5 (``obtain_cutmix_box``). Here the views are made on G's device from the weak view's normalised
tensor, in float, with draws from the method's own ``torch.Generator`` (on the host: its draws are
copied to the images' device pinned and non_blocking, no host sync); docs/methods.md ("UniMatch")
lists what differs.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from segadv.methods import mixing

JITTER = dict(brightness=0.5, contrast=0.5, saturation=0.5, hue=0.25, p=0.8, grayscale_p=0.2)  # semi.py 46-47
BLUR_P, BLUR_SIGMA = 0.5, (0.1, 2.0)  # transform.py blur(): p 0.5, sigma ~ U(0.1, 2.0)
BOX_P, BOX_AREA, BOX_RATIO = 0.5, (0.02, 0.4), (0.3, 1 / 0.3)  # transform.py obtain_cutmix_box()
DROPOUT = 0.5  # V1: nn.Dropout2d(0.5) on the features' copy (deeplabv3plus.py 41-42); V2: dropout_prob (dpt.py)


def gaussian_blur(images: torch.Tensor, generator: torch.Generator, *, p: float = BLUR_P,
                  sigma_range: tuple[float, float] = BLUR_SIGMA) -> torch.Tensor:
    """Each image blurred with probability ``p`` by a Gaussian of sigma ~ U(``sigma_range``) (PIL's
    ``GaussianBlur(radius=sigma)``: its radius is the standard deviation), on a kernel of
    ``2 * ceil(3 * max sigma) + 1`` taps with reflected borders. The blur is linear, so it is applied
    to the normalised image directly (normalising is per channel and affine). Draws: the coins (B),
    then the sigmas (B)."""
    batch, channels, height, width = images.shape
    device = images.device
    coin = mixing.uniform((batch,), generator, device).view(-1, 1, 1, 1)
    lo, hi = sigma_range
    sigma = lo + (hi - lo) * mixing.uniform((batch,), generator, device).to(images.dtype)
    size = 2 * math.ceil(3 * hi) + 1
    pad = min(size // 2, height - 1, width - 1)  # reflect padding needs fewer pixels than the side
    offsets = torch.arange(size, device=device, dtype=images.dtype) - size // 2
    kernel = torch.exp(-(offsets * offsets) / (2.0 * sigma.view(-1, 1) ** 2))[:, size // 2 - pad:size // 2 + pad + 1]
    kernel = (kernel / kernel.sum(dim=1, keepdim=True)).repeat_interleave(channels, dim=0)
    taps = kernel.shape[1]
    planes = images.reshape(1, batch * channels, height, width)
    padded = F.pad(planes, (pad, pad, pad, pad), mode="reflect")
    blurred = F.conv2d(padded, kernel.view(batch * channels, 1, taps, 1), groups=batch * channels)
    blurred = F.conv2d(blurred, kernel.view(batch * channels, 1, 1, taps), groups=batch * channels)
    return torch.where(coin < p, blurred.view_as(images), images)


def strong_view(images: torch.Tensor, generator: torch.Generator, *, mean: Sequence[float],
                std: Sequence[float]) -> torch.Tensor:
    """A strong view of each normalised weak view (semi.py 45-48): colour jitter (80 %), grayscale
    (20 %), blur (50 %), each decided per image; the jitter is torchvision's, as
    ``mixing.french_color_jitter`` makes it, at UniMatch's strengths."""
    jittered = mixing.french_color_jitter(images, generator, mean=mean, std=std, **JITTER)
    return gaussian_blur(jittered, generator)


TRIES = 64  # candidate (aspect, corner) draws per box: the reference's loop, without a host read


def cutmix_boxes(batch: int, shape: tuple[int, int], generator: torch.Generator, device: torch.device, *,
                 p: float = BOX_P, area: tuple[float, float] = BOX_AREA,
                 ratio: tuple[float, float] = BOX_RATIO) -> torch.Tensor:
    """(B, H, W) bool: each image's CutMix box (``obtain_cutmix_box``), with probability ``p``. A
    box covers ~ U(``area``) of the image at an aspect ~ U(``ratio``) (width ``int(sqrt(s / r))``,
    height ``int(sqrt(s * r))``) and a corner drawn uniformly over the image; a draw that does not
    fit is drawn again (aspect and corner), as the reference's loop. The reference crops squares;
    on an H x W crop the area is of H x W and each side fits its own.

    Sync-free: ``TRIES`` candidates per image are drawn at once and the first that fits is taken
    (the reference's loop stops at the same one); if none of them fits (for the largest boxes about
    one in 10^10), the last is moved inside the image. Draws (float64 on the generator's device):
    the coins (B), the areas (B), the aspects (B, TRIES), the corners' x then y (B, TRIES) in [0, 1).
    """
    height, width = shape
    gen = generator.device
    f64 = torch.float64
    coin = torch.rand(batch, generator=generator, device=gen, dtype=f64)
    size = (area[0] + (area[1] - area[0]) * torch.rand(batch, 1, generator=generator, device=gen, dtype=f64)) \
        * (height * width)
    r = ratio[0] + (ratio[1] - ratio[0]) * torch.rand(batch, TRIES, generator=generator, device=gen, dtype=f64)
    box_w = torch.sqrt(size / r).floor()
    box_h = torch.sqrt(size * r).floor()
    x = (torch.rand(batch, TRIES, generator=generator, device=gen, dtype=f64) * width).floor()  # randint(0, W)
    y = (torch.rand(batch, TRIES, generator=generator, device=gen, dtype=f64) * height).floor()
    fits = (x + box_w <= width) & (y + box_h <= height)
    fits[:, -1] = True  # the fallback: the last candidate, moved inside below
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)
    box_w, box_h, x, y = (t.gather(1, first).squeeze(1) for t in (box_w, box_h, x, y))
    box_w, box_h = box_w.clamp(max=width), box_h.clamp(max=height)
    x, y = torch.minimum(x, width - box_w), torch.minimum(y, height - box_h)
    box_w = torch.where(coin <= p, box_w, torch.zeros_like(box_w))  # no box: the reference's `random() > p`
    boxes = mixing._to_device(torch.stack([y, y + box_h, x, x + box_w], dim=1).long(), torch.device(device))
    rows = torch.arange(height, device=device).view(1, -1, 1)
    cols = torch.arange(width, device=device).view(1, 1, -1)
    b = boxes.view(batch, 4, 1, 1)
    return (rows >= b[:, 0]) & (rows < b[:, 1]) & (cols >= b[:, 2]) & (cols < b[:, 3])


def dropout_scales(batch: int, channels: Sequence[int], generator: torch.Generator, device: torch.device, *,
                   p: float = DROPOUT) -> list[torch.Tensor]:
    """V1's feature perturbation: ``nn.Dropout2d(p)`` on each feature map, as (B, C) scales (0, or
    1 / (1 - p) where a channel is kept), each map its own draw."""
    scales = []
    for width in channels:
        kept = mixing.uniform((batch, width), generator, device) >= p
        scales.append(kept.to(torch.float32) / (1.0 - p))
    return scales


def complementary_scales(pairs: int, channels: Sequence[int], generator: torch.Generator, device: torch.device, *,
                         p: float = DROPOUT) -> list[torch.Tensor]:
    """V2's complementary dropout (dpt.py ``comp_drop``) for a batch of ``2 * pairs`` images, the
    two strong views of image i at i and ``pairs + i``: each channel kept at 2 in one view and
    dropped in the other (a fair coin per image and channel), except for ``int(pairs * (1 - p))``
    pairs drawn at random, which keep every channel at 1. The reference draws one mask for its
    four token maps of one width; here each width gets its own (the DeepLab G's maps differ).
    Returns a (2 * pairs, C) scale per feature map."""
    keep_whole = torch.zeros(pairs, dtype=torch.bool)
    keep_whole[torch.randperm(pairs, generator=generator)[:int(pairs * (1 - p))]] = True
    keep_whole = mixing._to_device(keep_whole, torch.device(device)).view(-1, 1)
    by_width: dict[int, torch.Tensor] = {}
    for width in channels:
        if width not in by_width:
            first = (mixing.uniform((pairs, width), generator, device) < 0.5).to(torch.float32) * 2.0
            first = torch.where(keep_whole, torch.ones_like(first), first)
            second = torch.where(keep_whole, torch.ones_like(first), 2.0 - first)
            by_width[width] = torch.cat((first, second))
    return [by_width[width] for width in channels]
