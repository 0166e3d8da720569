"""segadv-eval: evaluate a generator checkpoint on the configured val split.

    segadv-eval --checkpoint FILE [--config FILE] [--device DEV] [key=value ...]

Without ``--config`` the config saved in the checkpoint is used (overrides apply on top).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from torch import nn

from segadv.cli_args import parse_args
from segadv.checkpoint import load_weights, read_checkpoint
from segadv.config import Config, config_from_dict, load_config
from segadv.data import build_val_loader, class_names
from segadv.engine.evaluate import evaluate
from segadv.errors import UserError, cli_entry
from segadv.models import build_generator_for_weights
from segadv.parallel import activate, parse_device_map
from segadv.runtime import setup_logging

log = logging.getLogger("segadv.eval")


def resolve_config(ckpt: dict, config_path: str | None, overrides: list[str]) -> Config:
    if config_path is not None:
        return load_config(config_path, overrides)
    if not isinstance(ckpt.get("config"), dict):
        raise UserError("the checkpoint carries no config: pass --config FILE")
    return config_from_dict(ckpt["config"], overrides=overrides, source="checkpoint config")


def load_generator(ckpt: dict, cfg: Config, source: str) -> nn.Module:
    generator = build_generator_for_weights(cfg.model.generator, cfg.data.num_classes)
    load_weights(ckpt, generator, role="generator", name=source)
    return generator


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="segadv-eval", description="Evaluate a generator checkpoint.")
    parser.add_argument("--checkpoint", required=True, help="segadv checkpoint (e.g. RUN/checkpoints/last.pt)")
    parser.add_argument("--config", help="config file (default: the one saved in the checkpoint)")
    parser.add_argument("--device", help="cpu, cuda:N or N (default: cuda:0 if available, else cpu)")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    parser.add_argument("--trust-checkpoint", action="store_true", help="allow pickled code (off: weights only)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    setup_logging()
    device_map = parse_device_map(None if args.device is None else f"g:{args.device}")
    activate(device_map)
    ckpt = read_checkpoint(args.checkpoint, trusted=args.trust_checkpoint)
    cfg = resolve_config(ckpt, args.config, args.overrides)
    generator = load_generator(ckpt, cfg, args.checkpoint).to(device_map.generator)
    # The split training measured val/* on: the target's with domain adaptation, else data's.
    val_data = cfg.target_data if cfg.target_data is not None else cfg.data
    val_loader = build_val_loader(val_data, seed=cfg.train.seed, pin_memory=False)  # no train split needed
    metrics = evaluate(generator, val_loader, device_map.generator, cfg.data.num_classes).metrics
    if args.json:
        print(json.dumps(metrics))
        return 0
    print(f"checkpoint: {args.checkpoint} (step {ckpt.get('step', '?')}); val split of "
          f"{'target_data' if cfg.target_data is not None else 'data'}")
    print(f"mIoU       {metrics['mIoU']:.4f}")
    print(f"pixel acc  {metrics['pixel_acc']:.4f}")
    for name, iou in zip(class_names(val_data), metrics["iou"]):
        print(f"  IoU {name:<14} {iou:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
