"""segadv-export: the generator of a checkpoint as ONNX or TorchScript, verified.

    segadv-export --checkpoint FILE|RUN_DIR --output FILE [--format onnx|torchscript] [options] [key=value ...]

The model is written to a temp file next to ``--output``, run against PyTorch eager on random
inputs at two or more sizes, and renamed into place only when the check passes; then the
``<output>.json`` sidecar is written. Exit codes: 0 written and verified, 1 verification failed
(nothing written, the numbers are printed), 2 user error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from segadv.cli.args import HelpFormatter, add_config_arguments, docs_epilog, fraction, parse_args, path_argument, tolerance
from segadv.errors import EXIT_FAILURE, UserError, cli_entry
from segadv.export.deps import import_extra
from segadv.export.sidecar import sidecar_path, to_json, write_sidecar
from segadv.fsutil import check_output, check_parent, file_sha256, make_dir, output_file, refuse_overwriting, staged
from segadv.data.palette import palette
from segadv.signals import interrupted_note

if TYPE_CHECKING:  # torch and numpy load when an export runs: --help answers without them
    import numpy as np
    import torch

    from segadv.checkpoint.inference import LoadedGenerator

log = logging.getLogger("segadv.export")

FORMATS = ("onnx", "torchscript")
SUFFIX_FORMATS = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript", ".ts": "torchscript",
                  ".torchscript": "torchscript", ".jit": "torchscript"}
FALLBACK_INPUT_SIZE = 512

CPU_HALF_NOTE = (
    "onnxruntime's CPU provider (x86) has no float16 kernels for most of this graph (Conv included): "
    "it converts the float16 weights and inserts casts to compute in float32. The check measures "
    "float16 rounding of weights and activations, not float16 arithmetic; float16 speed needs a "
    "GPU provider (CUDAExecutionProvider)."
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="segadv-export", formatter_class=HelpFormatter,
        description="Export a checkpoint's generator to ONNX or TorchScript and verify it against PyTorch.",
        epilog=docs_epilog("inference.md", "failures.md"),
    )
    p.add_argument("--checkpoint", type=path_argument, required=True,
                   help="segadv checkpoint, a run dir (its best checkpoint), raw generator state dict "
                   "(any wrapper prefix) or smp save_pretrained directory")
    p.add_argument("--output", type=path_argument, required=True, help="file to write (its sidecar is OUTPUT.json)")
    p.add_argument("--format", choices=FORMATS, help="default: from the output suffix (.onnx; .pt/.ts/.torchscript)")
    add_config_arguments(p, "needed for a raw state dict (default: the checkpoint's own)")
    p.add_argument("--input-size", nargs=2, type=int, metavar=("H", "W"),
                   help="example input height and width (default: the training image size)")
    p.add_argument("--dynamic", action=argparse.BooleanOptionalAction, default=True,
                   help="dynamic batch, height and width axes (ONNX; default on). TorchScript is always shape-generic")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default 17)")
    p.add_argument("--with-preprocess", nargs="?", const="uint8", choices=("uint8", "unit"), default=None,
                   help="normalise in the graph: the model takes uint8 0..255 (default) or 'unit' float 0..1 RGB")
    p.add_argument("--with-argmax", action="store_true", help="output int64 class ids N x H x W instead of logits")
    p.add_argument("--half", action="store_true",
                   help="float16 weights and compute (on a CPU onnxruntime computes in float32: see the docs)")
    p.add_argument("--atol", type=tolerance, help="absolute tolerance (default 1e-4 float32, 1e-2 float16)")
    p.add_argument("--rtol", type=tolerance, help="tolerance relative to max|eager| (default 1e-4 float32, 1e-2 float16)")
    p.add_argument("--min-agreement", type=fraction,
                   help="least argmax agreement for --with-argmax exports (default 0.999 float32, 0.99 float16)")
    p.add_argument("--verify-size", nargs=2, type=int, action="append", metavar=("H", "W"),
                   help="a verification size (repeat; default: the input size and a larger non-square one)")
    p.add_argument("--network", choices=("student", "teacher"),
                   help="of a mean_teacher run's checkpoint: the student (G, default: the network the run scored as "
                        "val/mIoU) or its EMA teacher")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow a checkpoint that needs arbitrary pickled code (only for a file you trust)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted config overrides of the generator's config (the keys: segadv-train --help-config)")
    return p


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


def verification_shapes(args: argparse.Namespace, dynamic: bool, h: int, w: int, divisor: int) -> list[list[int]]:
    if args.verify_size:
        sizes = [tuple(s) for s in args.verify_size]
        for vh, vw in sizes:
            check_size(vh, vw, divisor, "--verify-size")
        if not dynamic and any(s != (h, w) for s in sizes):
            raise UserError(f"--no-dynamic exports take only their input size {h} {w}; drop --verify-size")
        return [[1 if i == 0 or not dynamic else 2, 3, vh, vw] for i, (vh, vw) in enumerate(sizes)]
    if not dynamic:
        log.warning("a --no-dynamic export takes one shape only, so it is verified at 1x3x%dx%d only", h, w)
        return [[1, 3, h, w]]
    return [[1, 3, h, w], [2, 3, h + 2 * divisor, w + divisor]]


def make_runner(fmt: str, path: Path) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
    import torch

    if fmt == "onnx":
        ort = import_extra("onnxruntime", "verifying an ONNX export")

        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()  # the same CPU budget as the eager side
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return (lambda x: session.run(None, {name: x})[0]), f"onnxruntime {ort.__version__} (CPUExecutionProvider)"
    from segadv.export.torchscript_export import load_torchscript

    module = load_torchscript(path)

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    return run, "torch.jit.load (cpu)"


def write_export(fmt: str, model: torch.nn.Module, example: torch.Tensor, path: Path, args: argparse.Namespace,
                 embed: str, opset: int) -> dict:
    from segadv.export.wrapper import output_name

    if fmt == "onnx":
        from segadv.export.onnx_export import export_onnx

        return {"onnx": export_onnx(model, example, path, output_name=output_name(args.with_argmax),
                                    argmax=args.with_argmax, opset=opset, dynamic=args.dynamic, embed=embed)}
    from segadv.export.torchscript_export import export_torchscript

    return {"torchscript": export_torchscript(model, example, path, embed=embed)}


def size_text(path: Path) -> str:
    return f"{os.path.getsize(path) / 1e6:.1f} MB"


@cli_entry
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(build_parser(), argv)
    import numpy as np
    import torch

    from segadv.checkpoint.inference import load_generator, read_files
    from segadv.data import class_names
    from segadv.export.verify import DEFAULT_TOLERANCES, format_report, make_input, verify
    from segadv.export.wrapper import InferenceModel, export_metadata, input_dtype, input_kind, size_divisor
    from segadv.training.process import setup_logging

    setup_logging()
    output = Path(args.output)
    if output.is_dir():
        raise UserError(f"--output {output} is a directory; name the file to write (e.g. {output / 'model.onnx'})")
    output = output_file(output, "--output")  # a device, FIFO or socket: refused before anything slow
    check_output(sidecar_path(output), "its sidecar")
    check_parent(output)
    refuse_overwriting([("--output", output), ("its sidecar", sidecar_path(output))],
                       read_files(args.checkpoint, args.config))
    fmt = resolve_format(args.format, output)
    if args.opset is not None and fmt != "onnx":
        raise UserError("--opset applies to ONNX exports only")
    if fmt == "onnx":  # fail before the slow part when the export extra is missing
        import_extra("onnx", "ONNX export")
        import_extra("onnxruntime", "verifying an ONNX export")
    from segadv.export.onnx_export import DEFAULT_OPSET, check_opset

    opset = args.opset if args.opset is not None else DEFAULT_OPSET
    if fmt == "onnx":
        check_opset(opset)
    precision = "float16" if args.half else "float32"
    atol, rtol, min_agreement = DEFAULT_TOLERANCES[precision]
    atol = atol if args.atol is None else args.atol
    rtol = rtol if args.rtol is None else args.rtol
    min_agreement = min_agreement if args.min_agreement is None else args.min_agreement

    loaded = load_generator(args.checkpoint, args.config, args.overrides, trusted=args.trust_checkpoint,
                            network=args.network)
    generator, cfg = loaded.model, loaded.cfg
    divisor = size_divisor(generator)
    h, w = tuple(args.input_size) if args.input_size else default_input_size(loaded, divisor)
    check_size(h, w, divisor, "--input-size")
    dynamic = args.dynamic or fmt == "torchscript"
    if not args.dynamic and fmt == "torchscript":
        log.info("--no-dynamic: a scripted TorchScript module takes any shape anyway; verifying at several")
    shapes = verification_shapes(args, dynamic, h, w, divisor)
    kind, dtype = input_kind(args.with_preprocess), input_dtype(args.with_preprocess, args.half)

    exported = InferenceModel(generator, cfg.data.input_normalization, args.with_preprocess,
                              args.with_argmax, args.half).eval()
    reference = InferenceModel(generator, cfg.data.input_normalization, args.with_preprocess,
                               args.with_argmax, half=False).eval()
    rng = np.random.default_rng(1234)
    example = torch.from_numpy(make_input(rng, [1, 3, h, w], kind, dtype, cfg.data.input_normalization.mean,
                                              cfg.data.input_normalization.std))

    names = class_names(cfg.data)
    meta = export_metadata(
        model_format=fmt, model_file=output.name, loaded=loaded, classes=names,
        palette=palette(cfg.data.num_classes).tolist(), preprocess=args.with_preprocess,
        argmax=args.with_argmax, half=args.half, dynamic=dynamic,
        input_size=(h, w), divisor=divisor,
    )
    make_dir(output.parent)
    notes = [CPU_HALF_NOTE] if args.half and fmt == "onnx" else []
    # A stop signal unwinds (segadv/signals.py, exit 128 + N), so staged() removes its temp file, as on
    # any other exit.
    with interrupted_note(f"nothing was written to {output}"), staged(output) as stage:
        meta.update(write_export(fmt, exported, example, stage.path, args, to_json(meta), opset))
        run, runtime = make_runner(fmt, stage.path)
        result = verify(run, reference, shapes=shapes, kind=kind, dtype=dtype, class_ids=args.with_argmax,
                        mean=cfg.data.input_normalization.mean, std=cfg.data.input_normalization.std, atol=atol, rtol=rtol,
                        min_agreement=min_agreement, runtime=runtime)
        report = format_report(result)
        if not result.passed:
            for line in report:
                print(line)
            for note in notes:
                print(f"note       {note}")
            print(f"error: the {fmt} export does not match PyTorch eager within tolerance; nothing was "
                  f"written to {output}", file=sys.stderr)
            return EXIT_FAILURE
        stage.commit()
    meta["model_sha256"] = file_sha256(output)
    meta["verification"] = result.as_dict()
    if notes:
        meta["notes"] = notes
    sidecar = write_sidecar(output, meta)

    src = loaded.source_info()
    axes = ", ".join(meta["input"]["dynamic_axes"]) or "none (static)"
    print(f"checkpoint {src['checkpoint']} ({src['kind']}{', step ' + str(src['step']) if src['step'] is not None else ''}; "
          f"sha256 {src['sha256'][:12]}..., the file's)")
    extra = f", opset {opset}" if fmt == "onnx" else f", {meta['torchscript']['method']}"
    print(f"exported   {fmt} {output} ({size_text(output)}{extra}, {precision})")
    print(f"input      {meta['input']['name']}: {dtype} NCHW RGB, {kind}; dynamic axes: {axes}; "
          f"H and W multiples of {divisor}")
    out = meta["output"]
    layout = "N x H x W class ids" if args.with_argmax else f"N x {cfg.data.num_classes} x H x W"
    print(f"output     {out['name']}: {out['dtype']} {layout}")
    for line in report:
        print(line)
    for note in notes:
        print(f"note       {note}")
    print(f"sidecar    {sidecar}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
