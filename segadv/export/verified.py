"""An export from a loaded generator to a verified file: the wrapped model written to a temp file
next to the output, run against PyTorch eager at several shapes, renamed into place only when the
check passes, then its sidecar written. torch loads when an export runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from segadv.data.palette import palette
from segadv.export.deps import import_extra
from segadv.export.settings import check_size, default_input_size, verification_shapes
from segadv.export.sidecar import to_json, write_sidecar
from segadv.fsutil import file_sha256, make_dir, staged
from segadv.signals import interrupted_note

if TYPE_CHECKING:
    import numpy as np
    import torch

    from segadv.checkpoint.inference import LoadedGenerator
    from segadv.export.pt2_export import Program

log = logging.getLogger("segadv.export")

CPU_HALF_NOTE = (
    "onnxruntime's CPU provider (x86) has no float16 kernels for most of this graph (Conv included): "
    "it converts the float16 weights and inserts casts to compute in float32. The check measures "
    "float16 rounding of weights and activations, not float16 arithmetic; float16 speed needs a "
    "GPU provider (CUDAExecutionProvider)."
)


@dataclass(frozen=True)
class ExportOptions:
    """How to export (segadv-export's options, docs/inference.md)."""

    input_size: Optional[tuple[int, int]] = None  # None: the training crop
    dynamic: bool = True
    opset: int = 17
    preprocess: Optional[str] = None  # None, "uint8" or "unit": normalisation in the graph
    argmax: bool = False
    half: bool = False
    atol: float = 1e-4
    rtol: float = 1e-4
    min_agreement: float = 0.999
    verify_sizes: Optional[Sequence[Sequence[int]]] = None


@dataclass
class Exported:
    """What :func:`export_verified` did. ``passed`` False: nothing was written (``report`` says by
    how much the export missed)."""

    passed: bool
    report: list[str]
    notes: list[str]
    meta: dict[str, Any]
    precision: str
    kind: str
    dtype: str
    divisor: int
    sidecar: Optional[Path] = None


def make_runner(fmt: str, path: Path) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
    import torch

    if fmt == "onnx":
        ort = import_extra("onnxruntime", "verifying an ONNX export")

        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()  # the same CPU budget as the eager side
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return (lambda x: session.run(None, {name: x})[0]), f"onnxruntime {ort.__version__} (CPUExecutionProvider)"
    if fmt == "exported":
        from segadv.export.pt2_export import load_program

        module, runtime = load_program(path), "torch.export.load (cpu)"
    else:
        from segadv.export.torchscript_export import load_torchscript

        module, runtime = load_torchscript(path), "torch.jit.load (cpu)"

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    return run, runtime


def write_export(fmt: str, model: torch.nn.Module, example: torch.Tensor, path: Path, *, argmax: bool,
                 dynamic: bool, embed: str, opset: int, program: Optional[Program] = None) -> dict:
    """Write the file; the sidecar's section for its format. ``program``: an exported format's
    program, made before the metadata (whether it came out dynamic is part of it)."""
    from segadv.export.wrapper import output_name

    if fmt == "onnx":
        from segadv.export.onnx_export import export_onnx

        return {"onnx": export_onnx(model, example, path, output_name=output_name(argmax),
                                    argmax=argmax, opset=opset, dynamic=dynamic, embed=embed)}
    if fmt == "exported":
        from segadv.export.pt2_export import save_program

        assert program is not None
        return {"exported": save_program(program, path, embed=embed)}
    from segadv.export.torchscript_export import export_torchscript

    return {"torchscript": export_torchscript(model, example, path, embed=embed)}


def export_verified(loaded: LoadedGenerator, fmt: str, output: Path, options: ExportOptions) -> Exported:
    """Write ``loaded``'s G as a ``fmt`` file at ``output`` and its sidecar, if it matches PyTorch
    eager within the tolerances at every verification shape (UserError on a size that cannot be)."""
    import numpy as np
    import torch

    from segadv.data import class_names
    from segadv.export.verify import format_report, make_input, verify
    from segadv.export.wrapper import InferenceModel, export_metadata, input_dtype, input_kind, size_divisor

    from segadv.parallel.placement import unwrap

    generator, cfg = loaded.model, loaded.cfg
    norm = cfg.data.input_normalization
    divisor = size_divisor(generator)
    h, w = tuple(options.input_size) if options.input_size else default_input_size(loaded, divisor)
    check_size(h, w, divisor, "--input-size")
    dynamic = options.dynamic or fmt == "torchscript"
    if dynamic and fmt == "onnx" and not unwrap(generator).onnx_dynamic_shapes:
        # A ViT's position embedding is resampled to the input's grid with factors the ONNX trace
        # fixes: its graph takes the size it was traced at only.
        log.warning("%s: its ONNX graph takes one input size (the traced position-embedding grid): exported "
                    "and verified at %dx%d only, as --no-dynamic", type(unwrap(generator)).__name__, h, w)
        dynamic = False
    if not options.dynamic and fmt == "torchscript":
        log.info("--no-dynamic: a scripted TorchScript module takes any shape anyway; verifying at several")
    step, least = divisor, 1  # a dynamic export's sides: multiples of step from least
    if fmt == "exported":
        from segadv.export.pt2_export import program_grid

        step, least = program_grid(generator, divisor)
    # Before the export: a --verify-size the export cannot take is refused before anything slow.
    shapes = verification_shapes(options.verify_sizes, dynamic, h, w, step, least=least)
    kind, dtype = input_kind(options.preprocess), input_dtype(options.preprocess, options.half)

    exported = InferenceModel(generator, norm, options.preprocess, options.argmax, options.half).eval()
    reference = InferenceModel(generator, norm, options.preprocess, options.argmax, half=False).eval()
    rng = np.random.default_rng(1234)
    example = torch.from_numpy(make_input(rng, [1, 3, h, w], kind, dtype, norm.mean, norm.std))
    notes = [CPU_HALF_NOTE] if options.half and fmt == "onnx" else []
    program = None
    if fmt == "exported":
        from segadv.export.pt2_export import export_program

        name = type(unwrap(generator)).__name__
        program = export_program(exported, example, dynamic=dynamic, step=step, least=least, name=name)
        if program.dynamic:
            divisor = step  # what the program's sides must be multiples of (the sidecar's size_divisor)
        elif dynamic:
            dynamic = False
            notes.append(f"{name}'s program is static, 1x3x{h}x{w} only: {program.static_because}")
            shapes = verification_shapes(options.verify_sizes, False, h, w, divisor,
                                         static_what=f"{name}'s static programs")

    meta = export_metadata(
        model_format=fmt, model_file=output.name, loaded=loaded, classes=class_names(cfg.data),
        palette=palette(cfg.data.num_classes).tolist(), preprocess=options.preprocess,
        argmax=options.argmax, half=options.half, dynamic=dynamic,
        input_size=(h, w), divisor=divisor,
    )
    if program is not None:
        meta["exported"] = program.section()
    make_dir(output.parent)
    precision = "float16" if options.half else "float32"
    done = Exported(False, [], notes, meta, precision, kind, dtype, divisor)
    # A stop signal unwinds (segadv/signals.py, exit 128 + N), so staged() removes its temp file, as on
    # any other exit.
    with interrupted_note(f"nothing was written to {output}"), staged(output) as stage:
        meta.update(write_export(fmt, exported, example, stage.path, argmax=options.argmax, dynamic=dynamic,
                                 embed=to_json(meta), opset=options.opset, program=program))
        run, runtime = make_runner(fmt, stage.path)
        result = verify(run, reference, shapes=shapes, kind=kind, dtype=dtype, class_ids=options.argmax,
                        mean=norm.mean, std=norm.std, atol=options.atol, rtol=options.rtol,
                        min_agreement=options.min_agreement, runtime=runtime)
        done.report = format_report(result)
        if not result.passed:
            return done
        stage.commit()
    done.passed = True
    meta["model_sha256"] = file_sha256(output)
    meta["verification"] = result.as_dict()
    if notes:
        meta["notes"] = notes
    done.sidecar = write_sidecar(output, meta)
    return done
