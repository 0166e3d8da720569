"""segadv-export: the generator of a checkpoint as ONNX, a torch.export program (.pt2) or TorchScript, verified.

    segadv-export --checkpoint FILE|RUN_DIR --output FILE [--format onnx|exported|torchscript] [options] [key=value ...]

The model is written to a temp file next to ``--output``, run against PyTorch eager on random
inputs at two or more sizes, and renamed into place only when the check passes; then the
``<output>.json`` sidecar is written. Exit codes: 0 written and verified, 1 verification failed
(nothing written, the numbers are printed), 2 user error.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from segadv.cli.args import (ArgumentParser, HelpFormatter, add_config_arguments, add_network_argument, docs_epilog,
                             fraction, parse_args, path_argument, tolerance)
from segadv.errors import EXIT_FAILURE, UserError, cli_entry
from segadv.export.deps import import_extra
from segadv.export.settings import FORMATS, example_outputs, resolve_format, tolerances
from segadv.export.sidecar import sidecar_path
from segadv.fsutil import check_output, check_parent, output_file, refuse_overwriting



def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="segadv-export", formatter_class=HelpFormatter,
        description="Export a checkpoint's generator to ONNX, torch.export (.pt2) or TorchScript and verify it "
                    "against PyTorch.",
        epilog=docs_epilog("inference.md", "failures.md"),
    )
    p.add_argument("--checkpoint", type=path_argument, required=True,
                   help="segadv checkpoint, a run dir (its best checkpoint), raw generator state dict "
                   "(any wrapper prefix) or smp save_pretrained directory")
    p.add_argument("--output", type=path_argument, required=True, help="file to write (its sidecar is OUTPUT.json)")
    p.add_argument("--format", choices=FORMATS,
                   help="default: from the output suffix (.onnx; .pt2 for exported; .pt/.ts/.torchscript); "
                   "a suffix of another format is refused")
    add_config_arguments(p, "needed for a raw state dict (default: the checkpoint's own)")
    p.add_argument("--input-size", nargs=2, type=int, metavar=("H", "W"),
                   help="example input height and width (default: the training image size)")
    p.add_argument("--dynamic", action=argparse.BooleanOptionalAction, default=True,
                   help="dynamic batch, height and width axes (ONNX and exported; default on). TorchScript is "
                   "always shape-generic")
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
    add_network_argument(p)
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow a checkpoint that needs arbitrary pickled code (only for a file you trust)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted config overrides of the generator's config (the keys: segadv-train --help-config)")
    return p


def size_text(path: Path) -> str:
    return f"{os.path.getsize(path) / 1e6:.1f} MB"


def format_detail(fmt: str, meta: dict) -> str:
    """What the ``exported`` line adds for ``fmt``, from its sidecar section."""
    if fmt == "onnx":
        return f", opset {meta['onnx']['opset']}"
    if fmt == "exported":
        section = meta["exported"]
        if section["dynamic"]:
            return f", torch.export, sides from {section['least_size'][0]}"
        return ", torch.export, static"
    return f", {meta['torchscript']['method']}"


@cli_entry
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(build_parser(), argv)
    from segadv.checkpoint.inference import load_generator, read_files
    from segadv.export.verified import ExportOptions, export_verified
    from segadv.training.process import setup_logging

    setup_logging()
    output = Path(args.output)
    if output.is_dir():
        raise UserError(f"--output {output} is a directory; name the file to write (e.g. "
                        f"{example_outputs(args.format, output)})")
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
    atol, rtol, min_agreement = tolerances(args.half, args.atol, args.rtol, args.min_agreement)

    loaded = load_generator(args.checkpoint, args.config, args.overrides, trusted=args.trust_checkpoint,
                            network=args.network)
    options = ExportOptions(
        input_size=tuple(args.input_size) if args.input_size else None, dynamic=args.dynamic, opset=opset,
        preprocess=args.with_preprocess, argmax=args.with_argmax, half=args.half, atol=atol, rtol=rtol,
        min_agreement=min_agreement, verify_sizes=args.verify_size)
    done = export_verified(loaded, fmt, output, options)
    if not done.passed:
        for line in done.report:
            print(line)
        for note in done.notes:
            print(f"note       {note}")
        print(f"error: the {fmt} export does not match PyTorch eager within tolerance; nothing was "
              f"written to {output}", file=sys.stderr)
        return EXIT_FAILURE

    meta = done.meta
    src = loaded.source_info()
    axes = ", ".join(meta["input"]["dynamic_axes"]) or "none (static)"
    print(f"checkpoint {src['checkpoint']} ({src['kind']}{', step ' + str(src['step']) if src['step'] is not None else ''}; "
          f"sha256 {src['sha256'][:12]}..., the file's)")
    extra = format_detail(fmt, meta)
    print(f"exported   {fmt} {output} ({size_text(output)}{extra}, {done.precision})")
    # The sidecar's input section, as written: what a host reads and what the console says agree.
    given = meta["input"]
    print(f"input      {given['name']}: {given['dtype']} {given['layout']} {given['channels']}, {given['kind']}; "
          f"dynamic axes: {axes}; H and W multiples of {given['size_divisor']}")
    out = meta["output"]
    layout = "N x H x W class ids" if args.with_argmax else f"N x {loaded.cfg.data.num_classes} x H x W"
    print(f"output     {out['name']}: {out['dtype']} {layout}")
    for line in done.report:
        print(line)
    for note in done.notes:
        print(f"note       {note}")
    print(f"sidecar    {done.sidecar}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
