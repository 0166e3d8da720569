"""Mean teacher's primitives: the mixing masks, the mix, the strong augmentation of the mixed image,
the teacher's confidence weights and the EMA update of the teacher (issue 47, item 1).

Two references, each read at one commit (docs/methods.md, "Mean teacher: the references' defaults"):

- DACS (Tranheden et al., WACV 2021; vikolss/DACS ``trainUDA.py``, ``utils/transformmasks.py``,
  ``utils/transformsgpu.py``): ClassMix of a source/labeled image with a target/unlabeled one, colour
  jitter (kornia's ``ColorJitter``) and Gaussian blur on the mixed image, the pseudo labels' weight
  (the share of the teacher's pixels whose top probability is at least 0.968) and the EMA update
  with its warm-up ``min(1 - 1/(step+1), 0.99)``.
- French et al. (BMVC 2020; Britefury/cutmix-semisup-seg ``mask_gen.py``,
  ``train_seg_semisup_mask_mt.py``, ``optim_weight_ema.py``): the CutMix box mask, torchvision's
  colour jitter on the student's images, the confidence mask (0.97) on the consistency loss.

Pure functions on tensors, no config, no networks. Every function takes tensors on any device and,
on the hot path, makes no host sync: no ``.item()``, ``.cpu()`` or ``.tolist()``, no Python branch on
a tensor's value. Where a reference decides on the host (DACS's ``if colorJitter > 0.2``), the
decision here is a ``torch.where`` on the drawn value.

Randomness comes from an explicit ``torch.Generator`` argument, never from the global RNGs, so the
trainer can seed it and save/restore its state (``generator.get_state()``) for an exact resume. The
references draw from numpy's and Python's global RNGs (``np.random.choice``, ``random.uniform``,
``np.random.uniform``) and from torch's global RNG inside kornia: the same distributions here, not the
same numbers. The draws happen on the generator's own device: a CPU generator gives host draws that
are copied to the data's device without a sync (pinned, ``non_blocking``); a generator on the data's
device draws there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F

IGNORE_INDEX = 255

# DACS's defaults (vikolss/DACS trainUDA.py, transformsgpu.py); French et al.'s (train_seg_semisup_mask_mt.py)
DACS_CONFIDENCE = 0.968
DACS_EMA_DECAY = 0.99
DACS_JITTER_STRENGTH = 0.25
DACS_JITTER_SKIP = 0.2
DACS_BLUR_SKIP = 0.5
DACS_BLUR_SIGMA = (0.15, 1.15)
FRENCH_CONFIDENCE = 0.97
FRENCH_BOX_PROP = 0.5


# ---------------------------------------------------------------------------------------------------
# random draws


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` with no host sync: pinned and non_blocking from the CPU; a copy to the
    CPU from an accelerator is blocking by nature (and correct only that way)."""
    device = torch.device(device)
    if tensor.device == device:
        return tensor
    if tensor.device.type == "cpu" and device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device, non_blocking=device.type != "cpu")


def uniform(shape: Sequence[int], generator: torch.Generator, device: torch.device | str,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """U[0, 1) draws of ``shape`` from ``generator`` (on its device), handed to ``device``."""
    draws = torch.rand(tuple(shape), generator=generator, device=generator.device, dtype=dtype)
    return _to_device(draws, torch.device(device))


# ---------------------------------------------------------------------------------------------------
# the masks and the mix


def class_mix_mask(labels: torch.Tensor, generator: torch.Generator, num_classes: int,
                   ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """DACS's ClassMix mask: for each (H, W) label map of ``labels`` (B, H, W), half of the classes
    present in it, chosen at random, and the (B, H, W) bool mask of their pixels.

    As DACS (trainUDA.py 425-435): the classes are those of ``torch.unique(label)``, the ignore value
    counted as one of them (its exclusion is commented out, line 427), and ``ceil(n / 2)`` of the
    ``n`` present ones are drawn without replacement (``int((n + n % 2) / 2)``); the mask is
    ``generate_class_mask`` (transformmasks.py 56-59), 1 where the label is a chosen class.

    Sync-free: one U[0, 1) key per class and image (``(B, num_classes + 1)`` draws, the ignore value
    last); the chosen classes are the present ones with the smallest keys, which is a uniform draw
    of ``ceil(n / 2)`` of them without replacement, as ``np.random.choice(n, k, replace=False)``.
    Labels must be in ``[0, num_classes)`` or ``ignore_index`` (others fail in the scatter).
    """
    if labels.dim() != 3:
        raise ValueError(f"labels must be (B, H, W), got {tuple(labels.shape)}")
    batch = labels.shape[0]
    slots = num_classes + 1  # the ignore value is one more class, as in DACS
    ids = torch.where(labels == ignore_index, num_classes, labels).long().flatten(1)
    present = torch.zeros(batch, slots, dtype=torch.bool, device=labels.device)
    present.scatter_(1, ids, True)
    keys = uniform((batch, slots), generator, labels.device)
    keys = torch.where(present, keys, 2.0)  # absent classes sort last
    rank = torch.argsort(torch.argsort(keys, dim=1, stable=True), dim=1, stable=True)
    half = (present.sum(dim=1, keepdim=True) + 1) // 2
    chosen = present & (rank < half)
    return chosen.gather(1, ids).view_as(labels)


def box_mask(batch_size: int, shape: tuple[int, int], generator: torch.Generator, *,
             prop_range: float | tuple[float, float] = FRENCH_BOX_PROP, n_boxes: int = 1,
             random_aspect_ratio: bool = True, prop_by_area: bool = True, within_bounds: bool = True,
             invert: bool = True, device: torch.device | str | None = None) -> torch.Tensor:
    """French et al.'s CutMix mask (``BoxMaskGenerator.generate_params``, mask_gen.py 46-117):
    (B, H, W) bool, True inside the boxes (with ``invert``, the training script's default: its
    ``--boxmask_no_invert`` is off, so the masks start at 0 and each box flips its pixels to 1).

    As the reference, per image and box, in float64: with ``prop_by_area`` the box's share of the
    image ``p ~ U(prop_range)``; with ``random_aspect_ratio`` its height share ``p ** u`` (``u ~ U[0,
    1)``, so within ``[p, 1]``) and width share ``p / that``, else ``sqrt(p)`` both; both times
    ``sqrt(1 / n_boxes)``; sizes ``round(share * (H, W))``; within bounds the corner
    ``round(((H, W) - size) * U[0, 1))``, else the centre ``round((H, W) * U[0, 1))``. Boxes flip the
    mask where they cover it (two overlapping boxes cancel), as the reference's ``1 - masks[...]``.

    Deliberate differences: with a fixed aspect ratio and several boxes the reference scales one
    aliased array twice (``y_props = x_props = ...; y_props *= fac; x_props *= fac``, lines 84-87
    and 96-99), so each side is ``1/n`` of its share instead of ``sqrt(1/n)``; here it is scaled
    once (the published runs use one box, where the two agree). Outside the bounds the reference
    slices with negative starts, which numpy wraps around (a box past the top edge becomes empty or
    lands at the bottom); here a box is clipped to the image. The draws come from ``generator``, in
    the reference's order (shares, aspect, positions); the reference's from ``np.random`` in the
    DataLoader's collate function.
    """
    if isinstance(prop_range, (int, float)):
        prop_range = (float(prop_range), float(prop_range))
    lo, hi = prop_range
    height, width = shape
    gen_device = generator.device
    out_device = torch.device(device) if device is not None else gen_device
    f64 = torch.float64
    draw = (batch_size, n_boxes)
    fac = math.sqrt(1.0 / n_boxes)
    if prop_by_area:
        props = lo + (hi - lo) * torch.rand(draw, generator=generator, device=gen_device, dtype=f64)
        zero = props == 0.0
        if random_aspect_ratio:
            u = torch.rand(draw, generator=generator, device=gen_device, dtype=f64)
            y_props = torch.exp(u * torch.log(props))
            x_props = props / y_props
        else:
            y_props = x_props = torch.sqrt(props)
        y_props = torch.where(zero, 0.0, y_props * fac)
        x_props = torch.where(zero, 0.0, x_props * fac)
    else:
        if random_aspect_ratio:
            y_props = lo + (hi - lo) * torch.rand(draw, generator=generator, device=gen_device, dtype=f64)
            x_props = lo + (hi - lo) * torch.rand(draw, generator=generator, device=gen_device, dtype=f64)
        else:
            y_props = x_props = lo + (hi - lo) * torch.rand(draw, generator=generator, device=gen_device, dtype=f64)
        y_props = y_props * fac
        x_props = x_props * fac
    dims = torch.tensor([height, width], dtype=f64, device=gen_device)
    sizes = torch.round(torch.stack([y_props, x_props], dim=2) * dims)
    u = torch.rand(sizes.shape, generator=generator, device=gen_device, dtype=f64)
    if within_bounds:
        starts = torch.round((dims - sizes) * u)
        ends = starts + sizes
    else:
        centres = torch.round(dims * u)
        starts = centres - sizes * 0.5
        ends = centres + sizes * 0.5
    # the reference's int(): truncation toward zero; (B, n, 2) each, (y, x)
    starts = _to_device(torch.trunc(starts).long(), out_device)
    ends = _to_device(torch.trunc(ends).long(), out_device)
    rows = torch.arange(height, device=out_device)
    cols = torch.arange(width, device=out_device)
    in_rows = (rows >= starts[..., 0:1]) & (rows < ends[..., 0:1])  # (B, n, H)
    in_cols = (cols >= starts[..., 1:2]) & (cols < ends[..., 1:2])  # (B, n, W)
    covered = (in_rows.unsqueeze(-1) & in_cols.unsqueeze(-2)).sum(dim=1)  # (B, H, W)
    flipped = covered % 2 == 1
    return flipped if invert else ~flipped


def mix(mask: torch.Tensor, foreground: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    """``foreground`` where ``mask``, ``background`` elsewhere; a (B, H, W) mask applies to every
    channel of (B, C, H, W) tensors.

    DACS's ``oneMix`` (transformsgpu.py 66-74) is ``mask * source + (1 - mask) * target`` (source =
    labeled image, mask from its label), French et al.'s mix ``x0 * (1 - m) + x1 * m`` (x1 = inside
    the box; train_seg_semisup_mask_mt.py 350-351, 363): for a 0/1 mask and finite values the same
    numbers as this select, which also keeps the labels' integer dtype (DACS mixes them in float and
    casts back with ``.long()``).
    """
    mask = mask.bool()
    if foreground.dim() == mask.dim() + 1:
        mask = mask.unsqueeze(1)
    return torch.where(mask, foreground, background)


# ---------------------------------------------------------------------------------------------------
# colour: HSV in turns ([0, 1)), shared by both jitters


def _rgb_to_hsv(rgb: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, 3, H, W) RGB in [0, 1] -> hue in turns [0, 1), saturation, value, each (B, 1, H, W).

    kornia's formula (its saturation has ``+ eps`` in the denominator; its hue picks the first
    channel holding the max)."""
    r, g, b = rgb[:, 0:1], rgb[:, 1:2], rgb[:, 2:3]
    value, argmax = rgb.max(dim=1, keepdim=True)
    delta = value - rgb.min(dim=1, keepdim=True).values
    saturation = torch.where(delta == 0, 0.0, delta / (value + eps))
    safe = torch.where(delta == 0, torch.ones_like(delta), delta)
    hue_r = (g - b) / safe
    hue_g = 2.0 + (b - r) / safe
    hue_b = 4.0 + (r - g) / safe
    hue = torch.where(argmax == 0, hue_r, torch.where(argmax == 1, hue_g, hue_b))
    hue = torch.remainder(hue / 6.0, 1.0)
    return hue, saturation, value


def _hsv_to_rgb(hue: torch.Tensor, saturation: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Hue in turns (any real: taken modulo 1), saturation, value -> (B, 3, H, W) RGB."""
    h6 = torch.remainder(hue * 6.0, 6.0)
    # A hue a hair below 0 (or below 1) makes remainder round up to exactly 6.0 in float32: that is
    # hue 0, sector 0 (else its floor, 6, indexes past the table's six sectors).
    h6 = torch.where(h6 >= 6.0, torch.zeros_like(h6), h6)
    sector = torch.floor(h6)
    frac = h6 - sector
    p = value * (1.0 - saturation)
    q = value * (1.0 - frac * saturation)
    t = value * (1.0 - (1.0 - frac) * saturation)
    sector = sector.long()
    table = torch.stack([
        torch.cat([value, q, p, p, t, value], dim=1),
        torch.cat([t, value, value, q, p, p], dim=1),
        torch.cat([p, p, t, value, value, q], dim=1),
    ], dim=1)  # (B, 3, 6, H, W): each channel's value per sector
    index = sector.unsqueeze(1).expand(-1, 3, 1, -1, -1)
    return table.gather(2, index).squeeze(2)


def _per_image(values: torch.Tensor) -> torch.Tensor:
    return values.view(-1, 1, 1, 1)


def _channel_stats(mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor,
                   like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = torch.as_tensor(mean, dtype=like.dtype).view(1, -1, 1, 1)
    std = torch.as_tensor(std, dtype=like.dtype).view(1, -1, 1, 1)
    return _to_device(mean, like.device), _to_device(std, like.device)


def _coin(batch: int, generator: torch.Generator, device: torch.device, shared: bool) -> torch.Tensor:
    draws = uniform((1 if shared else batch,), generator, device)
    return _per_image(draws.expand(batch))


def _select(order_column: torch.Tensor, candidates: Sequence[torch.Tensor]) -> torch.Tensor:
    out = candidates[-1]
    for index in range(len(candidates) - 2, -1, -1):
        out = torch.where(order_column == index, candidates[index], out)
    return out


def dacs_color_jitter(images: torch.Tensor, generator: torch.Generator, *,
                      mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor,
                      strength: float = DACS_JITTER_STRENGTH, skip_prob: float = DACS_JITTER_SKIP,
                      shared_coin: bool = True) -> torch.Tensor:
    """DACS's colour jitter of the mixed images (transformsgpu.py 7-18; kornia 0.5's
    ``ColorJitter(brightness=s, contrast=s, saturation=s, hue=s)``, s = 0.25).

    ``images`` (B, 3, H, W) are normalised, ``unit = images * std + mean`` in [0, 1] (DACS: BGR minus
    its mean on the 0-255 scale, i.e. ``std = 1/255``, ``mean = IMG_MEAN / 255``). Applied when a
    U[0, 1) draw exceeds ``skip_prob`` (0.2: 80 % of the time); DACS draws that once per iteration
    for both of its images (``shared_coin``). Each applied image gets kornia's factors (kornia
    augmentation.py 234-257 and random_generator.py at 0.5.8): brightness ``b ~ U(1-s, 1+s)`` *added*
    as ``b - 1``; contrast ``c ~ U(max(0, 1-s), 1+s)`` *multiplied*; saturation ``~ U(max(0, 1-s),
    1+s)`` multiplying HSV saturation; hue ``~ U(-s, s)`` turns added to HSV hue; each step clamped to
    [0, 1]; in a random order (kornia's ``randperm(4)``), per image.

    Draws from ``generator``, in this order: the coin(s) (1 or B), the factors (B, 4: brightness,
    contrast, saturation, hue), the order keys (B, 4; an image's order is the argsort of its keys).
    """
    batch = images.shape[0]
    device = images.device
    coin = _coin(batch, generator, device, shared_coin)
    factors = uniform((batch, 4), generator, device).to(images.dtype)
    keys = uniform((batch, 4), generator, device)
    order = torch.argsort(keys, dim=1, stable=True)

    def span(low: float, high: float, column: int) -> torch.Tensor:  # kornia's _range_bound ranges
        return _per_image(low + (high - low) * factors[:, column])

    low = max(0.0, 1.0 - strength)
    brightness = span(low, min(2.0, 1.0 + strength), 0)
    contrast = span(low, 1.0 + strength, 1)
    saturation = span(low, 1.0 + strength, 2)
    hue = span(max(-0.5, -strength), min(0.5, strength), 3)

    mean_t, std_t = _channel_stats(mean, std, images)
    unit = images * std_t + mean_t

    def adjust_brightness(x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x + (brightness - 1.0), 0.0, 1.0)

    def adjust_contrast(x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x * contrast, 0.0, 1.0)

    def adjust_saturation(x: torch.Tensor) -> torch.Tensor:
        h, s, v = _rgb_to_hsv(x)
        return _hsv_to_rgb(h, torch.clamp(s * saturation, 0.0, 1.0), v)

    def adjust_hue(x: torch.Tensor) -> torch.Tensor:
        h, s, v = _rgb_to_hsv(x)
        return _hsv_to_rgb(h + hue, s, v)

    steps = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
    out = unit
    for position in range(4):
        out = _select(_per_image(order[:, position]), [step(out) for step in steps])
    jittered = (out - mean_t) / std_t
    return torch.where(coin > skip_prob, jittered, images)


def dacs_blur_kernel_size(length: int) -> int:
    """DACS's kernel size along a side of ``length`` pixels (transformsgpu.py 25-26): the largest odd
    integer not above ``ceil(0.1 * length)``, float rounding included (``0.1 * 30`` is just above 3)."""
    n = math.ceil(0.1 * length)
    return int(math.floor(n - 0.5 + n % 2))


def _gaussian_kernels(size: int, sigma: torch.Tensor) -> torch.Tensor:
    """(B,) sigmas -> (B, size) normalised Gaussians on the integer offsets (kornia's ``gaussian``)."""
    x = torch.arange(size, device=sigma.device, dtype=sigma.dtype) - size // 2
    if size % 2 == 0:
        x = x + 0.5
    kernel = torch.exp(-(x * x) / (2.0 * sigma.view(-1, 1) ** 2))
    return kernel / kernel.sum(dim=1, keepdim=True)


def dacs_gaussian_blur(images: torch.Tensor, generator: torch.Generator, *,
                       sigma_range: tuple[float, float] = DACS_BLUR_SIGMA, skip_prob: float = DACS_BLUR_SKIP,
                       shared_coin: bool = True) -> torch.Tensor:
    """DACS's Gaussian blur of the mixed images (transformsgpu.py 20-30; kornia's ``GaussianBlur2d``,
    reflect border): applied when a U[0, 1) draw exceeds ``skip_prob`` (0.5), drawn once for the
    batch as DACS (``shared_coin``); sigma ``~ U(0.15, 1.15)`` per image, the same along both axes;
    the kernel ``dacs_blur_kernel_size`` of each side (51 x 51 on DACS's 512 x 512 crops).

    Separable (a row pass and a column pass: kornia convolves the outer product, the same sum up
    to float rounding). Draws: the coin(s) (1 or B), then the sigmas (B).
    """
    batch, channels, height, width = images.shape
    device = images.device
    coin = _coin(batch, generator, device, shared_coin)
    lo, hi = sigma_range
    sigma = lo + (hi - lo) * uniform((batch,), generator, device).to(images.dtype)
    size_y, size_x = dacs_blur_kernel_size(height), dacs_blur_kernel_size(width)
    kernel_y = _gaussian_kernels(size_y, sigma).repeat_interleave(channels, dim=0)
    kernel_x = _gaussian_kernels(size_x, sigma).repeat_interleave(channels, dim=0)
    planes = images.reshape(1, batch * channels, height, width)
    padded = F.pad(planes, (size_x // 2, size_x // 2, size_y // 2, size_y // 2), mode="reflect")
    blurred = F.conv2d(padded, kernel_y.view(batch * channels, 1, size_y, 1), groups=batch * channels)
    blurred = F.conv2d(blurred, kernel_x.view(batch * channels, 1, 1, size_x), groups=batch * channels)
    blurred = blurred.view(batch, channels, height, width)
    return torch.where(coin > skip_prob, blurred, images)


def _grayscale(rgb: torch.Tensor) -> torch.Tensor:
    """torchvision's ``rgb_to_grayscale`` weights (ITU-R 601-2 luma), (B, 1, H, W)."""
    return (0.2989 * rgb[:, 0:1] + 0.587 * rgb[:, 1:2] + 0.114 * rgb[:, 2:3])


def _blend(a: torch.Tensor, b: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    return (ratio * a + (1.0 - ratio) * b).clamp(0.0, 1.0)


def french_color_jitter(images: torch.Tensor, generator: torch.Generator, *,
                        mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor,
                        brightness: float = 0.4, contrast: float = 0.4, saturation: float = 0.4,
                        hue: float = 0.1, p: float = 0.8, grayscale_p: float = 0.2) -> torch.Tensor:
    """French et al.'s colour augmentation (``--aug_strong_colour``, train_seg_semisup_mask_mt.py
    170-179): torchvision's ``RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8)`` then
    ``RandomGrayscale(p=0.2)``, per image, on the *student's* copy of each unlabeled image, before
    the mix (the teacher sees the image without it); French et al. blur nothing.

    torchvision's semantics (``transforms.functional`` on tensors): brightness, contrast, saturation
    factors ``~ U(1-x, 1+x)`` blending with black, with the image's mean grey, with its grey; hue
    ``~ U(-0.1, 0.1)`` turns; random order; each clamped to [0, 1]. ``images`` normalised as in
    ``dacs_color_jitter``. The reference jitters uint8 PIL images in its data pipeline, rounding to
    8 bits after each step; this works in float.

    Draws: the jitter coins (B; applied where ``u < p``, as ``RandomApply``), the factors (B, 4:
    brightness, contrast, saturation, hue), the order keys (B, 4), the grey coins (B; ``u < grayscale_p``).
    """
    batch = images.shape[0]
    device = images.device
    jitter_coin = _per_image(uniform((batch,), generator, device))
    factors = uniform((batch, 4), generator, device).to(images.dtype)
    keys = uniform((batch, 4), generator, device)
    grey_coin = _per_image(uniform((batch,), generator, device))
    order = torch.argsort(keys, dim=1, stable=True)

    def span(width: float, column: int) -> torch.Tensor:
        low = max(0.0, 1.0 - width)
        return _per_image(low + (1.0 + width - low) * factors[:, column])

    b_factor, c_factor, s_factor = span(brightness, 0), span(contrast, 1), span(saturation, 2)
    h_factor = _per_image(-hue + 2.0 * hue * factors[:, 3])

    mean_t, std_t = _channel_stats(mean, std, images)
    unit = images * std_t + mean_t

    def adjust_brightness(x: torch.Tensor) -> torch.Tensor:
        return _blend(x, torch.zeros_like(x), b_factor)

    def adjust_contrast(x: torch.Tensor) -> torch.Tensor:
        return _blend(x, _grayscale(x).mean(dim=(1, 2, 3), keepdim=True), c_factor)

    def adjust_saturation(x: torch.Tensor) -> torch.Tensor:
        return _blend(x, _grayscale(x), s_factor)

    def adjust_hue(x: torch.Tensor) -> torch.Tensor:
        h, s, v = _rgb_to_hsv(x, eps=0.0)
        return _hsv_to_rgb(h + h_factor, s, v)

    steps = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
    out = unit
    for position in range(4):
        out = _select(_per_image(order[:, position]), [step(out) for step in steps])
    out = torch.where(jitter_coin < p, out, unit)
    out = torch.where(grey_coin < grayscale_p, _grayscale(out).expand_as(out), out)
    return torch.where((jitter_coin < p) | (grey_coin < grayscale_p), (out - mean_t) / std_t, images)


# ---------------------------------------------------------------------------------------------------
# the teacher's confidence


def teacher_confidence(teacher_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top softmax probability and its argmax, each (B, H, W) (DACS trainUDA.py
    421-422: ``max_probs, targets_u_w = torch.max(torch.softmax(logits, dim=1), dim=1)``)."""
    return torch.max(torch.softmax(teacher_logits.detach(), dim=1), dim=1)


def dacs_pseudo_weight(confidence: torch.Tensor, threshold: float = DACS_CONFIDENCE, *,
                       per_image: bool = False) -> torch.Tensor:
    """DACS's weight of the pseudo-labeled pixels (``pixel_weight: threshold_uniform``, trainUDA.py
    466-468): the share of pixels whose top probability is at least ``threshold`` (0.968), one value
    for all the pixels, (B, H, W) like ``confidence``.

    DACS counts that share over the whole batch, not per image (``torch.sum(...) /
    np.size(targets_u)``, both over B x H x W; DAFormer's dacs.py 274-278 the same): that is the
    default. ``per_image=True`` gives each image its own share. Computed in float64 and cast, as the
    reference's Python division.
    """
    passed = confidence >= threshold
    if per_image:
        count = passed.flatten(1).sum(dim=1).to(torch.float64)
        share = (count / passed[0].numel()).view(-1, 1, 1)
    else:
        share = passed.sum().to(torch.float64) / passed.numel()
    return share.to(confidence.dtype).expand_as(confidence)


def dacs_mixed_pixel_weight(mask: torch.Tensor, pseudo_weight: torch.Tensor) -> torch.Tensor:
    """The mixed image's pixel weights (trainUDA.py 474-479): 1 on the pasted source pixels (their
    labels are ground truth), the pseudo labels' weight elsewhere."""
    return mix(mask, torch.ones_like(pseudo_weight), pseudo_weight)


def pixel_weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, pixel_weight: torch.Tensor,
                                 ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """DACS's loss on the mixed image (``CrossEntropyLoss2dPixelWiseWeighted``, loss.py 35-43): per
    pixel CE times the pixel weight, averaged over *all* B x H x W pixels, ignored ones included
    (they count 0 in the sum but 1 in the denominator)."""
    loss = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="none")
    return torch.mean(loss * pixel_weight)


def french_confidence_mask(teacher_probs: torch.Tensor, threshold: float = FRENCH_CONFIDENCE, *,
                           per_pixel: bool = False) -> torch.Tensor:
    """French et al.'s confidence mask (train_seg_semisup_mask_mt.py 406-418): 1 where the teacher's
    top probability is at least ``threshold`` (0.97), (B, 1, H, W); without ``--conf_per_pixel``
    (the default, and the published runs') its mean over the whole batch, a 0-dim tensor."""
    confident = (teacher_probs.max(dim=1)[0] >= threshold).float()[:, None, :, :]
    return confident if per_pixel else confident.mean()


def french_consistency_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                            loss_mask: torch.Tensor, confidence_mask: torch.Tensor) -> torch.Tensor:
    """French et al.'s consistency loss (``--cons_loss_fn var``, the default; lines 401-451): the
    squared difference of the student's and the teacher's softmax, summed over classes, times
    ``loss_mask * confidence_mask``, averaged over pixels and images. ``loss_mask`` is the mixed
    valid-pixel mask (B, 1, H, W); ``teacher_logits`` the teacher's logits on the two unmixed
    images mixed with the same box mask."""
    delta = torch.softmax(student_logits, dim=1) - torch.softmax(teacher_logits, dim=1)
    per_pixel = (delta * delta).sum(dim=1, keepdim=True)
    return (per_pixel * (loss_mask * confidence_mask)).mean()


# ---------------------------------------------------------------------------------------------------
# the teacher


def ema_decay(step: int, alpha: float = DACS_EMA_DECAY, *, warmup: bool = True) -> float:
    """The EMA's decay after optimizer step ``step`` (0 for the first). DACS (trainUDA.py 111-113,
    called with its 0-based iteration at line 511): ``min(1 - 1 / (step + 1), alpha)``, so the first
    update copies the student and the teacher is the true mean until ``1 - 1/(step+1)`` passes
    ``alpha`` (step 99 for 0.99). French et al. (optim_weight_ema.py 21-25): ``alpha`` from the start
    (``warmup=False``), the teacher initialised as a copy of the student."""
    return min(1.0 - 1.0 / (step + 1), alpha) if warmup else alpha


@torch.no_grad()
def ema_update_(teacher: Iterable[torch.Tensor], student: Iterable[torch.Tensor], decay: float) -> None:
    """``teacher = decay * teacher + (1 - decay) * student``, in place, tensor by tensor (DACS
    trainUDA.py 117/121: ``alpha * ema + (1 - alpha) * param``, the same operations in the same
    order, so the same numbers).

    What to pass: DACS averages ``parameters()`` only (the teacher's BatchNorm statistics are its
    own, from its forward passes in train mode); French et al. every float tensor of the state dict
    (parameters and BatchNorm's running mean and variance). Only floating tensors; ``decay`` a
    Python float (``ema_decay``), so nothing is read back from a device.

    Teacher and student may live on different devices: the student's tensors are copied to each
    teacher tensor's device (and dtype) with ``non_blocking`` copies (blocking only into the CPU from
    an accelerator, where non_blocking would be unsafe), then one ``torch._foreach`` multiply and
    add per (device, dtype) group. No host sync.
    """
    teacher = list(teacher)
    student = list(student)
    if len(teacher) != len(student):
        raise ValueError(f"teacher has {len(teacher)} tensors, student {len(student)}")
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for ema, live in zip(teacher, student):
        if not ema.is_floating_point() or not live.is_floating_point():
            raise TypeError(f"EMA of a non-floating tensor ({ema.dtype} <- {live.dtype}): leave integer buffers out")
        if ema.shape != live.shape:
            raise ValueError(f"teacher tensor {tuple(ema.shape)} against student {tuple(live.shape)}")
        live = live.detach()
        if live.device != ema.device or live.dtype != ema.dtype:
            live = live.to(ema.device, ema.dtype, non_blocking=ema.device.type != "cpu")
        targets, sources = groups.setdefault((ema.device, ema.dtype), ([], []))
        targets.append(ema)
        sources.append(live)
    for targets, sources in groups.values():
        scaled = torch._foreach_mul(sources, 1.0 - decay)
        torch._foreach_mul_(targets, decay)
        torch._foreach_add_(targets, scaled)
