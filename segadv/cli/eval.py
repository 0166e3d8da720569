"""segadv-eval: evaluate a generator checkpoint on the configured val split.

    segadv-eval --checkpoint FILE|DIR|RUN_DIR [--config FILE] [--device DEV] [--json] [key=value ...]

Without ``--config`` the config saved in the checkpoint is used (overrides apply on top); a raw
state dict needs one; an smp ``save_pretrained`` directory describes G itself
(segadv/checkpoint/inference.py); a run dir means its best checkpoint
(segadv/checkpoint/run_checkpoint.py). ``--json``: one object, per-class IoU by class name (null
for a class neither predicted nor in the ground truth).
"""

from __future__ import annotations

import argparse
import json
import sys

from segadv.cli.args import HelpFormatter, add_config_arguments, docs_epilog, parse_args, path_argument
from segadv.errors import cli_entry


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="segadv-eval", formatter_class=HelpFormatter,
                                     epilog=docs_epilog("inference.md"),
                                     description="Evaluate a generator checkpoint on its config's val split: "
                                                 "mIoU, per-class IoU and pixel accuracy.")
    parser.add_argument("--checkpoint", type=path_argument, required=True, help="segadv checkpoint (e.g. RUN/checkpoints/last.pt), "
                        "a run dir (its best checkpoint), raw state dict (needs --config) or smp save_pretrained "
                        "directory")
    add_config_arguments(parser, "default: the one saved in the checkpoint")
    parser.add_argument("--device", help="cpu, cuda:N or N (default: cuda:0 if available, else cpu)")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    parser.add_argument("--network", choices=("student", "teacher"),
                        help="of a mean_teacher run's checkpoint: the student (G, default: the network the run scored "
                             "as val/mIoU) or its EMA teacher")
    parser.add_argument("--trust-checkpoint", action="store_true", help="allow pickled code (off: weights only)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. data.root=/data/VOC2012 "
                             "(the keys: segadv-train --help-config)")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    # torch and the data pipeline load here, once --help has had its answer
    from segadv.checkpoint.inference import load_generator
    from segadv.data import build_val_loader, class_names
    from segadv.data.files import absent_classes_note
    from segadv.data.loaders import left_out
    from segadv.engine.evaluate import evaluate
    from segadv.monitor.progress import evaluation_progress
    from segadv.parallel import activate, parse_device_map
    from segadv.training.process import setup_logging

    setup_logging()
    device_map = parse_device_map(None if args.device is None else f"g:{args.device}")
    activate(device_map)
    loaded = load_generator(args.checkpoint, args.config, args.overrides, trusted=args.trust_checkpoint,
                            network=args.network)
    checkpoint = str(loaded.checkpoint)
    cfg, generator = loaded.cfg, loaded.model.to(device_map.generator)
    # The split training measured val/* on: the target's with domain adaptation, else data's.
    val_data = cfg.target_data if cfg.target_data is not None else cfg.data
    val_loader = build_val_loader(val_data, seed=cfg.train.seed, pin_memory=False)  # no train split needed
    result = evaluate(generator, val_loader, device_map.generator, cfg.data.num_classes, track=evaluation_progress)
    metrics, skipped = result.metrics, left_out(val_loader)
    names = class_names(val_data)
    absent = absent_classes_note(names, result.absent_classes, val_data.ignore_index, "val")
    if args.json:
        print(json.dumps({"checkpoint": checkpoint, "step": loaded.step, "mIoU": metrics["mIoU"],
                          "pixel_acc": metrics["pixel_acc"],
                          "iou": {name: (iou if iou == iou else None) for name, iou in zip(names, metrics["iou"])},
                          "skipped": len(skipped), "absent_classes": [names[i] for i in result.absent_classes]}))
        return 0
    step = "" if loaded.step is None else f", step {loaded.step}"
    print(f"checkpoint: {checkpoint} ({loaded.kind}{step}); val split of "
          f"{'target_data' if cfg.target_data is not None else 'data'}")
    print(f"mIoU       {metrics['mIoU']:.4f}")
    print(f"pixel acc  {metrics['pixel_acc']:.4f}")
    for name, iou in zip(names, metrics["iou"]):
        print(f"  IoU {name:<14} {iou:.4f}")
    if skipped:
        print(f"skipped    {len(skipped)} val sample{'' if len(skipped) == 1 else 's'} left out of the scores "
              "(data.on_error=skip):")
        for problem in skipped:
            print(f"  {problem.message}")
    if absent:
        print(f"note       {absent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
