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

# "exported": a torch.export program (.pt2), TorchScript's successor upstream.
FORMATS = ("onnx", "exported", "torchscript")
FORMAT_NAMES = {"onnx": "ONNX", "exported": "torch.export", "torchscript": "TorchScript"}
SUFFIX_FORMATS = {".onnx": "onnx", ".pt2": "exported", ".pt": "torchscript", ".pth": "torchscript",
                  ".ts": "torchscript", ".torchscript": "torchscript", ".jit": "torchscript"}
FALLBACK_INPUT_SIZE = 512


# The file a hint suggests for each format (its suffix one resolve_format reads as that format).
EXAMPLE_FILES = {"onnx": "model.onnx", "exported": "model.pt2", "torchscript": "model.pt"}


def example_outputs(fmt: Optional[str], folder: Path) -> str:
    """A file to name in ``folder`` for ``fmt`` (None: one of each format)."""
    if fmt is not None:
        return str(folder / EXAMPLE_FILES[fmt])
    hints = [f"{folder / name} for {FORMAT_NAMES[kind]}" for kind, name in EXAMPLE_FILES.items()]
    return ", ".join(hints[:-1]) + " or " + hints[-1]


def resolve_format(fmt: Optional[str], output: Path) -> str:
    """``fmt``, or the one the output's suffix names. A suffix that names another format than
    ``fmt`` is refused (``model.pt`` is TorchScript's, ``model.pt2`` torch.export's: one letter
    apart, and a reader would pick the wrong loader); a suffix that names none takes ``fmt``."""
    implied = SUFFIX_FORMATS.get(output.suffix.lower())
    if fmt is None:
        if implied is None:
            raise UserError(
                f"--format not given and the output suffix {output.suffix or '(none)'!r} does not say which: "
                "pass --format onnx, --format exported or --format torchscript"
            )
        return implied
    if implied is not None and implied != fmt:
        suffix = "." + EXAMPLE_FILES[fmt].rpartition(".")[2]
        raise UserError(
            f"--format {fmt} but the output suffix {output.suffix!r} is {FORMAT_NAMES[implied]}'s "
            f"(--format {implied}): name the file {output.with_suffix(suffix).name} or pass --format {implied}"
        )
    return fmt


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
                        divisor: int, *, least: int = 1, static_what: Optional[str] = None) -> list[list[int]]:
    """The input shapes an export is verified at: ``verify_sizes`` (--verify-size) or the input
    size and, for a dynamic export, a larger non-square one at batch 2. ``least``: the smallest
    side a dynamic export takes (a torch.export program's); ``static_what``: what fixed the shape
    of a static export other than --no-dynamic, for the message (its warning was logged already)."""
    if verify_sizes:
        sizes = [tuple(s) for s in verify_sizes]
        for vh, vw in sizes:
            check_size(vh, vw, divisor, "--verify-size")
            if dynamic and min(vh, vw) < least:
                raise UserError(f"--verify-size {vh} {vw}: a dynamic program takes heights and widths from {least} "
                                f"(twice the network's stride), e.g. {max(vh, least)} {max(vw, least)}")
        if not dynamic and any(s != (h, w) for s in sizes):
            raise UserError(f"{static_what or '--no-dynamic exports'} take only their input size {h} {w}; "
                            "drop --verify-size")
        return [[1 if i == 0 or not dynamic else 2, 3, vh, vw] for i, (vh, vw) in enumerate(sizes)]
    if not dynamic:
        if static_what is None:
            log.warning("a --no-dynamic export takes one shape only, so it is verified at 1x3x%dx%d only", h, w)
        return [[1, 3, h, w]]
    return [[1, 3, h, w], [2, 3, h + 2 * divisor, w + divisor]]


def tolerances(half: bool, atol: Optional[float], rtol: Optional[float],
               min_agreement: Optional[float]) -> tuple[float, float, float]:
    """The verification's ``(atol, rtol, min_agreement)``: each given one, else its precision's default."""
    from segadv.export.verify import DEFAULT_TOLERANCES

    defaults = DEFAULT_TOLERANCES["float16" if half else "float32"]
    return tuple(d if v is None else v for d, v in zip(defaults, (atol, rtol, min_agreement)))  # type: ignore[return-value]
