"""What an export is made and checked at, decided before it runs: its format (from the output's
suffix where not given), its example input size (the training crop), the verification shapes and
tolerances. No torch."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Sequence

from segadv.errors import UserError

if TYPE_CHECKING:
    from pathlib import Path

    from segadv.checkpoint.inference import LoadedGenerator

log = logging.getLogger("segadv.export")

FORMATS = ("onnx", "torchscript")
SUFFIX_FORMATS = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript", ".ts": "torchscript",
                  ".torchscript": "torchscript", ".jit": "torchscript"}
FALLBACK_INPUT_SIZE = 512


# The file a hint suggests for each format (its suffix one resolve_format reads as that format).
EXAMPLE_FILES = {"onnx": "model.onnx", "torchscript": "model.pt"}


def example_outputs(fmt: Optional[str], folder: Path) -> str:
    """A file to name in ``folder`` for ``fmt`` (None: one of each format)."""
    if fmt is not None:
        return str(folder / EXAMPLE_FILES[fmt])
    return " or ".join(f"{folder / name} for {'TorchScript' if kind == 'torchscript' else 'ONNX'}"
                       for kind, name in EXAMPLE_FILES.items())


def resolve_format(fmt: Optional[str], output: Path) -> str:
    if fmt is not None:
        return fmt
    try:
        return SUFFIX_FORMATS[output.suffix.lower()]
    except KeyError:
        raise UserError(
            f"--format not given and the output suffix {output.suffix or '(none)'!r} does not say which: "
            "pass --format onnx or --format torchscript"
        ) from None


def default_input_size(loaded: LoadedGenerator, divisor: int) -> tuple[int, int]:
    """The training crop: synthetic data's image size, else the last train transform with an
    integer height and width (RandomCrop, Resize, ...), else 512 x 512; rounded up to ``divisor``."""
    data = loaded.cfg.data
    size: tuple[int, int] = (FALLBACK_INPUT_SIZE, FALLBACK_INPUT_SIZE)
    if data.kind == "synthetic":
        size = (data.synthetic.image_size, data.synthetic.image_size)
    else:
        for step in reversed(data.train_transforms):
            h, w = step.get("height"), step.get("width")
            if isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0:
                size = (h, w)
                break
    return -(-size[0] // divisor) * divisor, -(-size[1] // divisor) * divisor


def check_size(h: int, w: int, divisor: int, what: str) -> None:
    if h <= 0 or w <= 0 or h % divisor or w % divisor:
        up = lambda v: max(divisor, -(-v // divisor) * divisor)  # noqa: E731
        raise UserError(
            f"{what} {h} {w}: height and width must be positive multiples of {divisor} (the encoder's "
            f"output stride); e.g. {up(h)} {up(w)}"
        )


def verification_shapes(verify_sizes: Optional[Sequence[Sequence[int]]], dynamic: bool, h: int, w: int,
                        divisor: int) -> list[list[int]]:
    """The input shapes an export is verified at: ``verify_sizes`` (--verify-size) or the input
    size and, for a dynamic export, a larger non-square one at batch 2."""
    if verify_sizes:
        sizes = [tuple(s) for s in verify_sizes]
        for vh, vw in sizes:
            check_size(vh, vw, divisor, "--verify-size")
        if not dynamic and any(s != (h, w) for s in sizes):
            raise UserError(f"--no-dynamic exports take only their input size {h} {w}; drop --verify-size")
        return [[1 if i == 0 or not dynamic else 2, 3, vh, vw] for i, (vh, vw) in enumerate(sizes)]
    if not dynamic:
        log.warning("a --no-dynamic export takes one shape only, so it is verified at 1x3x%dx%d only", h, w)
        return [[1, 3, h, w]]
    return [[1, 3, h, w], [2, 3, h + 2 * divisor, w + divisor]]


def tolerances(half: bool, atol: Optional[float], rtol: Optional[float],
               min_agreement: Optional[float]) -> tuple[float, float, float]:
    """The verification's ``(atol, rtol, min_agreement)``: each given one, else its precision's default."""
    from segadv.export.verify import DEFAULT_TOLERANCES

    defaults = DEFAULT_TOLERANCES["float16" if half else "float32"]
    return tuple(d if v is None else v for d, v in zip(defaults, (atol, rtol, min_agreement)))  # type: ignore[return-value]
