"""Augmentation pipelines built from config: a list of albumentations steps by class name.

Config writes ``[{name: HorizontalFlip, p: 0.5}, {name: RandomScale, scale_limit: 0.2}]``; this
module turns that into an ``albumentations.Compose`` and appends ``Normalize`` and
``ToTensorV2``. It is strict on purpose: albumentations 2.x only *warns* about unknown keyword
arguments, so a typo would silently do nothing; ``Compose(strict=True)`` rejects them instead,
and that becomes a ``UserError`` naming the config key, the transform and the argument.

Masks are only ever resampled with nearest-neighbour interpolation: any other
``mask_interpolation`` would invent class ids on boundaries. Resize-based steps default to the
pixel-centre-aligned ``INTER_NEAREST_EXACT`` (see ``_with_exact_nearest``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import os
import random
import typing
import warnings
from typing import Any, Mapping, Optional, Sequence

# albumentations asks the package registry for a newer release when imported, and warns on stderr
# where one exists: segadv makes no network calls of its own, and a user on an older release (the
# floor) would see the warning before every command's output.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import albumentations as A  # noqa: E402 - after the variable it reads
import numpy as np
from albumentations.core.transforms_interface import BasicTransform
from albumentations.pytorch import ToTensorV2

from segadv.config.normalization import Normalization
from segadv.errors import UserError

log = logging.getLogger(__name__)

# cv2.INTER_NEAREST and cv2.INTER_NEAREST_EXACT: the only mask interpolations that keep ids.
_INTER_NEAREST, _INTER_NEAREST_EXACT = 0, 6
_NEAREST_INTERPOLATIONS = {
    _INTER_NEAREST: "INTER_NEAREST",
    _INTER_NEAREST_EXACT: "INTER_NEAREST_EXACT",
}

# Not usable as a config step: abstract bases, 3D-only, or appended by us already.
_EXCLUDED = {
    "BasicTransform",
    "DualTransform",
    "ImageOnlyTransform",
    "Transform3D",
    "ToTensor3D",
    "Normalize",
    "ToTensorV2",
}
_APPENDED = {"Normalize", "ToTensorV2"}

# albumentations' warning, and Compose(strict=True)'s error, for arguments a transform lacks.
_UNKNOWN_ARGUMENTS = r"Argument\(s\) .* are not valid for transform"

# Steps whose numeric ``fill_mask`` marks removed *content* as background on purpose, rather
# than padding; these keep their own default instead of ``ignore_index``.
_FILL_MASK_IS_CONTENT = {"MaskDropout"}


@functools.lru_cache(maxsize=1)
def transform_names() -> tuple[str, ...]:
    """Names of albumentations transform classes that a config step may use."""
    names = []
    for name in dir(A):
        obj = getattr(A, name)
        if not (inspect.isclass(obj) and issubclass(obj, BasicTransform)):
            continue
        if name in _EXCLUDED or name.startswith("_") or name.endswith("3D"):
            continue
        names.append(name)
    return tuple(sorted(names))


# Spatial steps that keep an image's size whatever their settings; every pixel-level step
# (albumentations' ImageOnlyTransform) keeps it too.
_SIZE_KEEPING = frozenset({"HorizontalFlip", "VerticalFlip", "CoarseDropout", "GridDropout", "XYMasking", "MaskDropout",
                           "PixelDropout", "ElasticTransform", "GridDistortion", "OpticalDistortion"})
_PAD_DEFAULT = 1024  # PadIfNeeded's min_height and min_width where a step leaves them out


def pipeline_size(steps: Sequence[Any], size: tuple[int, int]) -> Optional[tuple[int, int]]:
    """The ``(height, width)`` a pipeline of config ``steps`` makes of an image of ``size``, where
    their settings say: a step with an integer ``height`` and ``width`` makes that size (Resize,
    the crops), PadIfNeeded pads up to its minimum or to a multiple of its divisor, and a step
    that keeps a size keeps it. None where a step's output depends on more than its settings
    (RandomScale, LongestMaxSize, a rotation that fits its output, ...)."""
    height, width = size
    for step in steps:
        if not isinstance(step, Mapping):
            return None
        name, h, w = step.get("name"), step.get("height"), step.get("width")
        if _is_side(h) and _is_side(w):
            height, width = h, w
        elif name == "PadIfNeeded":
            height = _padded(height, step.get("min_height", _PAD_DEFAULT), step.get("pad_height_divisor"))
            width = _padded(width, step.get("min_width", _PAD_DEFAULT), step.get("pad_width_divisor"))
        elif not _keeps_size(name):
            return None
    return height, width


def _is_side(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _padded(side: int, minimum: Any, divisor: Any) -> int:
    """PadIfNeeded's side: up to ``minimum`` where it is given, else to a multiple of ``divisor``."""
    if _is_side(minimum):
        return max(side, minimum)
    if _is_side(divisor):
        return -(-side // divisor) * divisor
    return side


def _keeps_size(name: Any) -> bool:
    if name in _SIZE_KEEPING:
        return True
    cls = getattr(A, name, None) if isinstance(name, str) and name in transform_names() else None
    return cls is not None and issubclass(cls, A.ImageOnlyTransform)


def _suggest(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean 'X'?"`` for the closest choice, or ``""`` when nothing is close."""
    close = difflib.get_close_matches(word, choices, n=1)
    if not close:
        # Case slips ("horizontalflip") are common in hand-written YAML.
        lowered = {c.lower(): c for c in choices}
        close = difflib.get_close_matches(word.lower(), list(lowered), n=1)
        close = [lowered[c] for c in close]
    return f"; did you mean '{close[0]}'?" if close else ""


def one_line(err: BaseException) -> str:
    """A compact single-line message, using pydantic's per-field errors when there are any.

    albumentations re-raises its pydantic ``ValidationError`` as a plain ``ValueError`` whose
    text spans several lines with documentation links, so look for the original in the chain.
    """
    seen: set[int] = set()
    cause: Optional[BaseException] = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        errors = getattr(cause, "errors", None)
        if callable(errors):
            try:
                parts = [_pydantic_part(e) for e in errors()]
            except Exception:  # something else with an ``errors`` attribute
                parts = []
            if parts:
                return "; ".join(parts)
        cause = cause.__cause__ or cause.__context__
    lines = [ln for ln in str(err).splitlines() if "errors.pydantic.dev" not in ln]
    return " ".join(" ".join(lines).split()) or type(err).__name__


def _pydantic_part(error: Mapping[str, Any]) -> str:
    loc = ".".join(str(x) for x in error.get("loc", ()))
    return f"{loc}: {error['msg']}" if loc else str(error["msg"])


def _resolve(step: Any, where: str, i: int) -> tuple[str, type, dict[str, Any]]:
    """Check one step's shape and name; return ``(name, class, kwargs)``."""
    key = f"{where}[{i}]"
    if not isinstance(step, Mapping):
        raise UserError(
            f"{key}: expected a mapping like {{name: HorizontalFlip, p: 0.5}}, "
            f"got {type(step).__name__} {step!r}"
        )
    if "name" not in step:
        raise UserError(f"{key}: missing 'name' (an albumentations transform, e.g. HorizontalFlip)")
    name = step["name"]
    if not isinstance(name, str):
        raise UserError(f"{key}.name: expected a transform class name, got {name!r}")
    if name in _APPENDED:
        raise UserError(
            f"{key}.name: {name} is appended automatically; set data.normalization (data.mean/data.std) instead"
        )
    if name not in transform_names():
        raise UserError(
            f"{key}.name: unknown albumentations transform '{name}'"
            f"{_suggest(name, transform_names())}"
        )
    kwargs = {k: v for k, v in step.items() if k != "name"}
    return name, getattr(A, name), kwargs


def _check_mask_interpolation(name: str, kwargs: dict[str, Any], key: str) -> None:
    """Reject a non-nearest mask interpolation."""
    chosen = kwargs.get("mask_interpolation", _INTER_NEAREST)
    is_int = isinstance(chosen, int) and not isinstance(chosen, bool)
    if not is_int or chosen not in _NEAREST_INTERPOLATIONS:
        allowed = " or ".join(f"{v}={k}" for k, v in _NEAREST_INTERPOLATIONS.items())
        raise UserError(
            f"{key} ({name}): mask_interpolation must be nearest ({allowed}) so masks keep "
            f"valid class ids, got {chosen!r}"
        )


def _with_mask_fill(
    cls: type, name: str, kwargs: dict[str, Any], ignore_index: Optional[int]
) -> dict[str, Any]:
    """Pad masks with ``ignore_index`` (not background) unless the step says otherwise.

    Padding invented by a crop/rotate is not background; labelling it ``ignore_index`` keeps the
    loss and metrics from learning or scoring pixels that never existed.
    """
    if ignore_index is None or "fill_mask" in kwargs or name in _FILL_MASK_IS_CONTENT:
        return kwargs
    param = inspect.signature(cls.__init__).parameters.get("fill_mask")
    if param is None or not isinstance(param.default, (int, float)):
        return kwargs  # absent, or None meaning "leave the mask alone" (e.g. CoarseDropout)
    if not 0 <= ignore_index <= 255:
        log.warning(
            "%s pads masks with 0 (background): ignore_index %d does not fit a uint8 mask",
            name,
            ignore_index,
        )
        return kwargs
    return {**kwargs, "fill_mask": ignore_index}


def _accepts_nearest_exact(cls: type) -> bool:
    """Whether the step's schema allows ``mask_interpolation=INTER_NEAREST_EXACT``.

    Resize-based steps do; warp-based ones (Affine, Rotate, ...) only allow 0..4.
    """
    schema = getattr(cls, "InitSchema", None)
    field = getattr(schema, "model_fields", {}).get("mask_interpolation")
    return field is not None and _INTER_NEAREST_EXACT in typing.get_args(field.annotation)


def _with_exact_nearest(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Default resize-based steps to ``INTER_NEAREST_EXACT`` for masks.

    albumentations' default mask interpolation, ``cv2.INTER_NEAREST``, samples with a half-pixel
    offset relative to the ``INTER_LINEAR`` used for the image, so an upscaled mask is shifted
    against its image by up to half a source pixel. ``INTER_NEAREST_EXACT`` is still nearest
    (no invented ids) but pixel-centre aligned. An explicit user choice is kept.
    """
    if "mask_interpolation" in kwargs or not _accepts_nearest_exact(cls):
        return kwargs
    return {**kwargs, "mask_interpolation": _INTER_NEAREST_EXACT}


def build_step(
    step: Any, where: str, i: int, ignore_index: Optional[int] = None
) -> BasicTransform:
    """Build the ``i``-th step of ``where``, turning every user mistake into a ``UserError``
    (but unknown arguments, which the strict ``Compose`` of ``build_transform`` rejects)."""
    name, cls, kwargs = _resolve(step, where, i)
    key = f"{where}[{i}]"
    _check_mask_interpolation(name, kwargs, key)
    kwargs = _with_mask_fill(cls, name, kwargs, ignore_index)
    kwargs = _with_exact_nearest(cls, kwargs)
    try:
        with warnings.catch_warnings():
            # Unknown arguments: the strict Compose of build_transform raises for them instead.
            warnings.filterwarnings("ignore", message=_UNKNOWN_ARGUMENTS, category=UserWarning)
            return cls(**kwargs)
    except (TypeError, ValueError) as err:  # pydantic's ValidationError is a ValueError
        raise UserError(f"{key} ({name}): {one_line(err)}") from err


def _strict_compose(built: Sequence[BasicTransform], tail: Sequence[BasicTransform], where: str) -> A.Compose:
    """``Compose(strict=True)``: albumentations rejects arguments a step does not take (it
    checks the steps in order); the error names the first such entry of ``where`` and suggests
    the closest argument the transform takes."""
    try:
        return A.Compose([*built, *tail], strict=True)
    except ValueError as err:
        i, step = next((i, t) for i, t in enumerate(built) if getattr(t, "invalid_args", None))
        valid = [p for p in inspect.signature(type(step).__init__).parameters if p != "self"]
        hint = _suggest(step.invalid_args[0], valid) if len(step.invalid_args) == 1 else ""
        raise UserError(f"{where}[{i}]: {one_line(err)}{hint}") from err  # err names the transform


class ReverseChannels(A.ImageOnlyTransform):
    """RGB to BGR (a BGR ``data.normalization``): the image's channels in reverse order."""

    def __init__(self) -> None:
        super().__init__(p=1.0)

    def apply(self, img: np.ndarray, **params: Any) -> np.ndarray:
        return np.ascontiguousarray(img[..., ::-1])

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ()


class ResizeImageOnly(A.ImageOnlyTransform):
    """The image alone resized to ``(width, height)`` with PIL's BICUBIC, as AdaptSegNet's and
    ADVENT's val datasets resize it (``image.resize(size, Image.BICUBIC)`` on the uint8 RGB image,
    before the mean is taken off): PIL's bicubic widens its kernel when shrinking (antialiased),
    which cv2's INTER_CUBIC does not, so PIL is what gives their inputs. The mask keeps its size:
    the prediction is upsampled to it and scored at full resolution (``data.val_input_size``)."""

    def __init__(self, width: int, height: int) -> None:
        super().__init__(p=1.0)
        self.width, self.height = int(width), int(height)

    def apply(self, img: np.ndarray, **params: Any) -> np.ndarray:
        from PIL import Image

        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise UserError(f"data.val_input_size: resizes uint8 RGB images as the references do; a "
                            f"data.val_transforms step made a {img.dtype} image of shape {img.shape}")
        return np.asarray(Image.fromarray(img).resize((self.width, self.height), Image.BICUBIC))

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("width", "height")


def build_transform(
    steps: list[dict],
    normalization: Normalization,
    where: str,
    *,
    ignore_index: Optional[int] = None,
    image_size: Optional[Sequence[int]] = None,
) -> A.Compose:
    """The configured steps, then ``normalization`` (the channels reversed for a BGR one,
    ``Normalize(mean, std)``) and ``ToTensorV2``, as one ``Compose``.

    ``where`` is the config key path of ``steps`` (e.g. ``"data.train_transforms"``) so errors
    name the exact entry at fault. With ``ignore_index``, geometric steps that pad the mask pad
    it with ``ignore_index`` unless the step sets ``fill_mask`` itself. Resize-based steps
    resample masks with ``INTER_NEAREST_EXACT`` unless the step sets ``mask_interpolation``.
    ``image_size`` ([W, H], ``data.val_input_size``): after the steps, the image alone resized to
    it (:class:`ResizeImageOnly`); the mask keeps the steps' size.
    """
    if not isinstance(steps, (list, tuple)):
        raise UserError(f"{where}: expected a list of steps, got {type(steps).__name__}")
    built = [build_step(step, where, i, ignore_index) for i, step in enumerate(steps)]
    mean, std = normalization.mean, normalization.std
    try:
        normalize = A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0)
    except (TypeError, ValueError) as err:
        raise UserError(f"{where}: Normalize(mean={mean}, std={std}): {one_line(err)}") from err
    order = (ReverseChannels(),) if normalization.bgr else ()
    # Before the channel order and Normalize: the references resize the RGB uint8 image.
    resize = () if image_size is None else (ResizeImageOnly(*image_size),)
    return _strict_compose(built, (*resize, *order, normalize, ToTensorV2()), where)


def seed_transform(transform: Any, seed: int) -> None:
    """Make a pipeline's randomness reproducible from ``seed``.

    albumentations 2.x keeps its own RNG per ``Compose`` (global numpy/random seeds do nothing),
    and ``Compose(seed=s)`` / ``set_random_seed(s)`` give *every* step the same seed, so e.g.
    HorizontalFlip and VerticalFlip with equal ``p`` would always fire together. Sharing one
    generator pair across all steps keeps them reproducible but independent.
    """
    if hasattr(transform, "set_random_state"):
        seed = int(seed) % 2**32
        transform.set_random_state(np.random.default_rng(seed), random.Random(seed))
