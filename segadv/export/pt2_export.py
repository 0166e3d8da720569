"""torch.export: the generator as an ``ExportedProgram`` in a ``.pt2`` archive (``torch.export.export``
then ``torch.export.save``), upstream's successor to TorchScript: ``torch.export.load(path).module()``
runs it, and AOTInductor compiles it.

Dynamic shapes. The batch is ``Dim("batch", min=1)``; height and width are ``step * Dim(...)``, from
twice the step up (:func:`program_grid`). The step is the network's stride (its encoder's output
stride, else its input divisor): smp checks an input's divisibility in its forward, and DeepLab-v2's
Caffe ResNet pools with ``ceil_mode``, whose output sizes torch.export can prove consistent only for
sides that are multiples of the stride (a derived dim says they are). torch.export treats a dynamic
size of 1 as a special case it will not cover (0/1 specialisation): an example batch of 1, or a
feature map the network shrinks to one pixel, would pin that size. So the example is exported at
batch 2, and sides start at two strides.

Where the network fixes a size all the same (DINOv2 checks its input's size and resamples its
position embedding to the input's grid with Python integers), the dynamic export fails and the
program is exported static at the example's shape, as ONNX is for such a network; the log and the
sidecar say so and why.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from segadv.errors import UserError
from segadv.export.sidecar import EMBED_FILE
from segadv.fsutil import write_new
from segadv.parallel import unwrap

log = logging.getLogger(__name__)

# strict=True, named because the default changed between the supported releases: TorchDynamo captures
# the forward's bytecode, so Python the trace would bake in unseen is refused rather than exported.
EXPORTER = "torch.export.export(strict=True)"


@dataclass
class Program:
    """What :func:`export_program` made: ``dynamic`` False with ``static_because`` when the
    dynamic export was not possible; a dynamic program takes sides that are multiples of ``step``
    from ``least_size`` up."""

    program: Any  # torch.export.ExportedProgram
    dynamic: bool
    step: Optional[int] = None
    least_size: Optional[int] = None
    static_because: Optional[str] = None

    def section(self) -> dict[str, Any]:
        """The metadata's ``exported`` section (embedded in the file too: segadv-predict reads
        the sides a dynamic program takes from it)."""
        return {
            "exporter": EXPORTER,
            "torch_version": torch.__version__,
            "dynamic": self.dynamic,
            "size_step": self.step,  # a dynamic program's sides: multiples of it (the input's size_divisor) ...
            "least_size": [self.least_size, self.least_size] if self.dynamic else None,  # ... from this up
            "static_because": self.static_because,
        }


def program_grid(generator: nn.Module, divisor: int) -> tuple[int, int]:
    """``(step, least)``: a dynamic program's sides are multiples of ``step``, the network's stride
    (its encoder's output stride where that is a multiple of ``divisor``, else ``divisor``), from
    ``least``, two steps, up (the module's docstring says why)."""
    encoder = getattr(unwrap(generator), "encoder", None)
    stride = int(getattr(encoder, "output_stride", 0) or 0)
    step = stride if stride > divisor and stride % divisor == 0 else divisor
    return step, 2 * step


def dynamic_shapes(step: int, least: int) -> tuple[dict[int, Any]]:
    """``dynamic_shapes`` for the one NCHW input: dynamic batch, and height and width multiples of
    ``step`` from ``least`` up."""
    from torch.export import Dim

    if step == 1:
        height, width = Dim("height", min=least), Dim("width", min=least)
    else:
        height, width = (step * Dim(f"{side}_steps", min=least // step) for side in ("height", "width"))
    return ({0: Dim("batch", min=1), 2: height, 3: width},)


def _reason(err: BaseException) -> str:
    """torch.export's error in a line: its first, less the pointer to TORCH_LOGS, and the first
    sentence of the first constraint it names (the rest is advice on torch's own options)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    text = lines[0].split(" For more information")[0]
    if len(lines) > 1 and lines[1].startswith("- "):
        text += " " + lines[1][2:].split(". ")[0].rstrip(".")
    return text if len(text) <= 400 else text[:397] + "..."


def _export(model: nn.Module, example: torch.Tensor, shapes: Any) -> Any:
    with torch.inference_mode(False), torch.no_grad():
        return torch.export.export(model, (example,), dynamic_shapes=shapes, strict=True)


def export_program(model: nn.Module, example: torch.Tensor, *, dynamic: bool, step: int, least: int,
                   name: str) -> Program:
    """``model`` exported at ``example`` (batch 1): with a dynamic batch, height and width (sides
    multiples of ``step`` from ``least``) where ``dynamic`` and the network allows, else static
    at the example's shape. ``name``: the network's, for the log."""
    h, w = (int(v) for v in example.shape[-2:])
    because = None
    if dynamic and (h % step or w % step or min(h, w) < least):
        up = lambda v: max(least, -(-v // step) * step)  # noqa: E731
        because = (f"a dynamic program's sides are multiples of {step} (the network's stride) from {least}, and the "
                   f"input size {h}x{w} is not; --input-size {up(h)} {up(w)} would be")
    elif dynamic:
        try:
            # batch 2: an example of batch 1 would pin the batch to 1 (the module's docstring)
            program = _export(model, torch.cat([example, example]), dynamic_shapes(step, least))
            return Program(program, True, step, least)
        except Exception as err:  # noqa: BLE001 - whatever pins a size, the static export is the answer
            because = f"torch.export could not keep the sizes dynamic: {_reason(err)}"
    if because:
        log.warning("%s: its exported program takes one input size (%s): exported and verified at %dx%d only, "
                    "as --no-dynamic", name, because, h, w)
    try:
        program = _export(model, example, None)
    except Exception as err:  # noqa: BLE001 - a network torch.export cannot trace: another format can
        raise UserError(f"torch.export cannot export {name}: {type(err).__name__}: {_reason(err)}; export it with "
                        "--format onnx or --format torchscript") from None
    return Program(program, False, static_because=because)


def save_program(made: Program, path: Path, *, embed: str) -> dict[str, Any]:
    """Write ``made``'s program to ``path`` with ``embed`` as the extra file ``segadv.json``; the
    sidecar's ``exported`` section."""
    buffer = io.BytesIO()  # then a plain write: a failing disk is an OSError naming the file
    torch.export.save(made.program, buffer, extra_files={EMBED_FILE: embed})
    write_new(path, buffer.getvalue())
    log.info("torch.export: %s program, written", "dynamic" if made.dynamic else "static")
    return made.section()


def load_program(path: Path, device: str | torch.device = "cpu",
                 extra_files: Optional[dict[str, str]] = None) -> nn.Module:
    """``torch.export.load(path).module()`` on ``device``; ``extra_files`` (name -> "") is filled
    with the files' contents. Read through a file object: torch.export.load refuses a path whose
    name does not end in .pt2, such as a temp file's."""
    loaded: dict = {} if extra_files is None else extra_files
    with open(path, "rb") as fh:
        program = torch.export.load(fh, extra_files=loaded)
    for key, value in loaded.items():
        if isinstance(value, bytes):
            loaded[key] = value.decode("utf-8")
    if torch.device(device).type != "cpu":
        from torch.export.passes import move_to_device_pass

        # the graph's own device arguments move too, which Module.to would leave on the CPU
        program = move_to_device_pass(program, torch.device(device))
    return program.module()
