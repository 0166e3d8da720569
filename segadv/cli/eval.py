"""segadv-eval: evaluate a generator checkpoint on the configured val split (or, ``--split test``,
its test split, ``data.test``), or score a folder of predicted masks against its ground truth.

    segadv-eval --checkpoint FILE|DIR|RUN_DIR [--split val|test] [--config FILE] [--device DEV] [--json]
                [--show-dir DIR] [key=value ...]
    segadv-eval --predictions DIR [--split val|test] [--config FILE] [--json] [key=value ...]

Without ``--config`` the config saved in the checkpoint is used (overrides apply on top); a raw
state dict needs one; an smp ``save_pretrained`` directory describes G itself
(segadv/checkpoint/inference.py); a run dir means its best checkpoint
(segadv/checkpoint/run_checkpoint.py). G runs under the autocast its run evaluated it under (the
config's ``amp.generator``, ``auto`` resolved on the device as training resolves it), so a checkpoint
scores what its run's evaluations scored; ``amp.generator.enabled=false`` scores in float32.
``--json``: one object, with the split scored, the precision, per-class IoU by class name (null for
a class neither predicted nor in the ground truth) and the confusion matrix. ``--split test`` scores
the split ``data.test`` names (``target_data.test`` under domain adaptation) exactly as val is
scored (the val pipeline, G's precision, the same metrics); a config without one is exit 2.

``--show-dir DIR`` writes each val image's predicted mask (a palette PNG, as segadv-predict writes
them: segadv/data/masks.py) and an overlay, under segadv-predict's rules for its --output: no input
is replaced, and a folder holding files segadv-eval did not write is refused unless --overwrite.
``--predictions DIR`` scores masks already made (AdaptSegNet's compute_iou.py): one PNG per val
image, named by its stem, palette or single-channel, of its ground truth's size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from segadv.cli.args import (ArgumentParser, HelpFormatter, add_config_arguments, add_network_argument, docs_epilog,
                             parse_args, path_argument)
from segadv.errors import UserError, cli_entry
from segadv.inference.scoring import SPLITS
from segadv.inference.show_dir import OVERLAY_DIR


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="segadv-eval", formatter_class=HelpFormatter,
                            epilog=docs_epilog("inference.md"),
                            description="Evaluate a generator checkpoint on its config's val (or test) split: "
                                        "mIoU, per-class IoU and pixel accuracy.")
    parser.add_argument("--checkpoint", type=path_argument, help="segadv checkpoint (e.g. RUN/checkpoints/last.pt), "
                        "a run dir (its best checkpoint), raw state dict (needs --config) or smp save_pretrained "
                        "directory")
    parser.add_argument("--predictions", type=path_argument, metavar="DIR",
                        help="instead of --checkpoint: score a folder of predicted masks (one <val image stem>.png "
                             "each, palette or single-channel, class ids) against the config's val split")
    parser.add_argument("--split", choices=SPLITS, default="val",
                        help="the split scored: val (default), or test, the split data.test names (target_data.test "
                             "under domain adaptation), scored as val is")
    add_config_arguments(parser, "default: the one saved in the checkpoint (with --predictions: default)")
    parser.add_argument("--show-dir", type=path_argument, metavar="DIR",
                        help="write each val image's predicted mask (DIR/<stem>.png, a palette PNG) and overlay "
                             "(DIR/overlay/<stem>.png)")
    parser.add_argument("--overwrite", action="store_true",
                        help="let --show-dir write into a folder holding files segadv-eval did not write (an input "
                             "is still never replaced)")
    parser.add_argument("--device", help="cpu, cuda:N or N (default: cuda:0 if available, else cpu)")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    add_network_argument(parser)
    parser.add_argument("--trust-checkpoint", action="store_true", help="allow pickled code (off: weights only)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. data.root=/data/VOC2012 "
                             "(the keys: segadv-train --help-config)")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    if (args.checkpoint is None) == (args.predictions is None):
        raise UserError("name one of --checkpoint (a model to evaluate) and --predictions (a folder of masks to score)")
    if args.predictions is not None and (args.show_dir or args.network or args.device):
        raise UserError("--predictions scores masks already made: --show-dir, --network and --device need --checkpoint")
    # torch and the data pipeline load here, once --help has had its answer
    from segadv.data import class_names
    from segadv.data.files import absent_classes_note
    from segadv.inference.scoring import evaluate_checkpoint, score_prediction_folder
    from segadv.training.process import setup_logging

    setup_logging()
    if args.predictions is not None:
        scored = score_prediction_folder(args.predictions, args.config, args.overrides, split=args.split)
    else:
        scored = evaluate_checkpoint(args.checkpoint, args.config, args.overrides, device=args.device,
                                     trusted=args.trust_checkpoint, network=args.network, show_dir=args.show_dir,
                                     overwrite=args.overwrite, split=args.split)
    result, header, line, skipped, val_data = (scored.result, scored.header, scored.line, scored.skipped,
                                                scored.val_data)
    names = class_names(val_data)
    metrics = result.metrics
    split = scored.split
    absent = absent_classes_note(names, result.absent_classes, val_data.ignore_index, split)
    if args.json:
        print(json.dumps({**header, "mIoU": metrics["mIoU"], "pixel_acc": metrics["pixel_acc"],
                          "iou": {name: (iou if iou == iou else None) for name, iou in zip(names, metrics["iou"])},
                          "skipped": len(skipped), "absent_classes": [names[i] for i in result.absent_classes],
                          "confusion_matrix": {"classes": names, "rows": result.matrix.tolist()}}))
        return 0
    named = f" ({scored.section}.test: {val_data.test})" if split == "test" else ""
    print(f"{line}; {split} split{named} of {scored.section}")
    if scored.precision is not None:  # G's forward: the run's evaluations ran in the same
        print(f"precision  {scored.precision.name} ({scored.precision.why})")
    print(f"mIoU       {metrics['mIoU']:.4f}")
    print(f"pixel acc  {metrics['pixel_acc']:.4f}")
    for name, iou in zip(names, metrics["iou"]):
        print(f"  IoU {name:<14} {iou:.4f}")
    if skipped:
        print(f"skipped    {len(skipped)} {split} sample{'' if len(skipped) == 1 else 's'} left out of the scores "
              "(data.on_error=skip):")
        for problem in skipped:
            print(f"  {problem.message}")
    if absent:
        print(f"note       {absent}")
    if args.show_dir:
        print(f"wrote      {header['show_dir_written']} mask(s) to {args.show_dir} "
              f"(+ overlays in {Path(args.show_dir) / OVERLAY_DIR})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
