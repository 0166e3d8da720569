"""segadv-predict: segment images with a checkpoint or an exported model; write palette PNG masks.

    segadv-predict (--checkpoint FILE [--config FILE] [key=value ...] | --model FILE.onnx|FILE.pt2|FILE.pt)
                   --input PATH --output DIR [--batch-size N] [--device DEV] [--overlay]
                   [--mode slide|resize] [--max-size PX] [--overlap F]

``--input``: an image file, a folder (its image files, not recursive) or a quoted glob
(``'photos/**/*.jpg'``). Each image gives ``DIR/<stem>.png``: a palette PNG whose pixel values are
class ids and whose palette is the class colours; ``--overlay`` adds ``DIR/overlay/<stem>.png``
(the image blended with the mask colours).

Sizes: an image whose sides are both at most ``--max-size`` (default 1024) runs whole, padded to
the network's size multiple. A larger one is split into overlapping ``max-size`` windows whose
logits are averaged (``--mode slide``, the default: objects keep the scale the network was trained
at) or shrunk to fit ``max-size`` and the prediction scaled back (``--mode resize``: faster,
coarser). A model exported with fixed input dimensions uses those as the window.

Images are read as training reads them (segadv/data/images.py: EXIF orientation applied, 16-bit
grayscale scaled to 8 bits). Every input's header is checked before the model is loaded: an
unreadable input stops the job naming every one (``--on-error raise``, the default) or is listed
and left out while the rest are segmented (``--on-error skip``).

Nothing the user did not name is replaced: an output that would replace an input (an image, the
model, the config) is refused, and so is an output folder holding files segadv-predict did not
write (its masks carry a ``Software: segadv-predict`` PNG text chunk) unless ``--overwrite``.

A checkpoint's G runs under the autocast its run's evaluations ran it under (the config's
``amp.generator``, ``auto`` resolved on the device as training resolves it: segadv-eval's rule,
segadv/inference/precision.py); ``amp.generator.enabled=false`` predicts in float32. The output
says which precision ran.

With an ONNX ``--model`` this runs on onnxruntime and numpy only: torch, the networks and the
training code are never imported (the model's classes, palette and normalisation come from the
metadata segadv-export embedded in the file, or else from its sidecar ``FILE.json``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from segadv.cli.args import (ArgumentParser, HelpFormatter, add_config_arguments, add_network_argument, docs_epilog,
                             parse_args, path_argument)
from segadv.errors import UserError, cli_entry
from segadv.inference.backends import CheckpointBackend, open_model
from segadv.inference.inputs import SHOWN, find_images, scan_inputs, unreadable_error
from segadv.inference.outputs import OVERLAY_DIR, check_outputs, model_files
from segadv.inference.segment import MaskFormat, Tiling, segment_images
from segadv.inference.tiling import MODES

log = logging.getLogger("segadv.cli.predict")

DEFAULT_MAX_SIZE = 1024
ON_ERROR = ("raise", "skip")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="segadv-predict", formatter_class=HelpFormatter,
        description="Segment images with a checkpoint (PyTorch) or an exported model (ONNX / torch.export / "
                    "TorchScript).",
        epilog=docs_epilog("inference.md"),
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=path_argument, help="segadv checkpoint, a run dir (its best checkpoint), raw generator "
                        "state dict or smp save_pretrained directory (runs PyTorch eager)")
    source.add_argument("--model", type=path_argument,
                        help="a segadv-export file: .onnx (onnxruntime, no torch), a torch.export .pt2 or TorchScript")
    p.add_argument("--input", required=True, help="an image, a folder of images or a quoted glob ('dir/*.png')")
    p.add_argument("--output", type=path_argument, required=True, help="folder for the masks (created if missing)")
    add_config_arguments(p, "for a raw state dict (--checkpoint only)")
    p.add_argument("--batch-size", type=int, default=4, help="images (or windows) per forward pass (default 4)")
    p.add_argument("--device", help="cpu, cuda, cuda:N or N (default: cuda:0 when available, else cpu)")
    p.add_argument("--overlay", action="store_true",
                   help=f"also write {OVERLAY_DIR}/<stem>.png: the image with the mask's class colours blended in "
                   "(background, black in the palette, left as it is)")
    p.add_argument("--alpha", type=float, default=0.5, help="mask weight in overlays (default 0.5)")
    p.add_argument("--mode", choices=MODES, default="slide",
                   help="images larger than --max-size: slide overlapping windows (default) or resize to fit")
    p.add_argument("--max-size", type=int, default=DEFAULT_MAX_SIZE,
                   help=f"largest side run in one pass, and the window size (default {DEFAULT_MAX_SIZE})")
    p.add_argument("--overlap", type=float, default=0.25, help="window overlap fraction in slide mode (default 0.25)")
    p.add_argument("--on-error", choices=ON_ERROR, default="raise",
                   help="an unreadable input: stop naming every one (raise, default) or list it and segment "
                   "the rest (skip)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an --output folder holding files segadv-predict did not write (inputs are "
                   "never replaced)")
    add_network_argument(p)
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow a checkpoint that needs arbitrary pickled code (only for a file you trust)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides (--checkpoint only; the keys: segadv-train --help-config)")
    return p


def _setup_logging() -> None:
    # segadv.training.process.setup_logging imports torch; the ONNX path must not.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def validate(args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.max_size < 1:
        raise UserError(f"--max-size must be >= 1, got {args.max_size}")
    if not 0.0 <= args.overlap < 1.0:
        raise UserError(f"--overlap must be in [0, 1), got {args.overlap}")
    if not 0.0 <= args.alpha <= 1.0:
        raise UserError(f"--alpha must be in [0, 1], got {args.alpha}")
    if args.model and (args.config or args.overrides or args.trust_checkpoint or args.network):
        raise UserError("--config, --trust-checkpoint and key=value overrides apply to --checkpoint only")


@cli_entry
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(build_parser(), argv)
    _setup_logging()
    validate(args)
    images = find_images(args.input)
    out_dir = Path(args.output)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--output {out_dir} exists and is not a folder")
    check_outputs(images, out_dir, args.overlay, model_files(args.model, args.checkpoint, args.config), args.overwrite)
    images, problems = scan_inputs(images)
    if problems and args.on_error == "raise":
        raise unreadable_error(problems)
    if not images:
        raise UserError(f"--input {args.input}: none of the {len(problems)} inputs is readable:\n  "
                        + "\n  ".join(problems[:SHOWN]))
    if args.model:
        backend = open_model(args.model, args.device)
    else:
        backend = CheckpointBackend(args.checkpoint, args.config, args.overrides, args.device, args.trust_checkpoint,
                                    args.network)
    masks = MaskFormat.of(backend.meta)
    log.info("%d image(s) from %s; model: %s; mode %s, max size %d", len(images), args.input,
             backend.description, args.mode, args.max_size)
    log.info("precision: %s (%s)%s", backend.precision, backend.precision_why,
             f"; {backend.evaluation.key}=false predicts in float32"
             if isinstance(backend, CheckpointBackend) and backend.precision != "float32" else "")
    done = segment_images(backend, masks, images, out_dir,
                          Tiling(args.mode, args.max_size, args.overlap, args.batch_size),
                          overlay_alpha=args.alpha if args.overlay else None, skip_unreadable=args.on_error == "skip")
    problems += done.problems

    print(f"model      {backend.description}")
    print(f"precision  {backend.precision} ({backend.precision_why})")
    print(f"wrote      {done.written} mask(s) to {out_dir}"
          + (f" (+ overlays in {out_dir / OVERLAY_DIR})" if args.overlay else ""))
    print(f"windows    {done.windows} forward window(s); mode {args.mode}, max size {args.max_size}; "
          f"{done.seconds:.2f} s ({done.seconds / max(done.written, 1) * 1000:.0f} ms/image)")
    total = max(int(done.counts.sum()), 1)
    print("classes    " + ", ".join(f"{name} {c / total:.1%}" for name, c in zip(masks.classes, done.counts)))
    if problems:
        print(f"skipped    {len(problems)} unreadable input(s) (--on-error skip):")
        for problem in problems:
            print(f"  {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
