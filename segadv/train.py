"""segadv-train: train G against D on the configured data.

    segadv-train [--config FILE] [--device-map MAP] [--run-dir DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Iterable, Iterator

from segadv.build import Training, build_training
from segadv.checkpoint import Checkpointer, training_state
from segadv.config import Config, config_to_dict, dump_config, load_config
from segadv.data import build_dataloaders, palette
from segadv.engine.evaluate import evaluate
from segadv.errors import UserError, cli_entry
from segadv.monitor.images import segmentation_panel
from segadv.monitor.meters import LossAverager, StepTimer
from segadv.monitor.progress import Progress
from segadv.monitor.writer import MetricWriter
from segadv.parallel import activate, parse_device_map
from segadv.runtime import seed_everything, setup_logging

log = logging.getLogger("segadv.train")


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    val_metrics: dict[str, object]


def train(cfg: Config, config_name: str = "default") -> TrainResult:
    device_map = parse_device_map(cfg.device_map)
    activate(device_map)
    seed_everything(cfg.train.seed, cfg.train.deterministic)
    run_dir = prepare_run_dir(cfg, config_name)
    dump_config(cfg, run_dir / "config.yaml")
    log.info("run dir: %s; device map: %s", run_dir, device_map)

    train_loader, val_loader = build_dataloaders(
        cfg.data, seed=cfg.train.seed, pin_memory=device_map.generator.type == "cuda"
    )
    parts = build_training(cfg, device_map)
    writer = MetricWriter(run_dir, tensorboard=cfg.log.tensorboard)
    checkpointer = Checkpointer(run_dir, cfg.checkpoint.every)
    config_dict = config_to_dict(cfg)

    max_steps = cfg.train.max_steps
    progress = Progress(max_steps, start=0, bar=cfg.log.progress_bar)
    losses, timer = LossAverager(), StepTimer()
    batches = iterate_epochs(train_loader)
    val_metrics: dict[str, object] = {}
    step = 0
    try:
        while step < max_steps:
            t_data = time.perf_counter()
            images, labels = next(batches)
            timer.add_data_wait(time.perf_counter() - t_data)
            losses.update(parts.step(images, labels, step).as_dict())
            step += 1
            final = step == max_steps

            if step % cfg.train.log_every == 0 or final:
                log_training(writer, progress, parts, step, losses.pop_means(), timer.pop())
            if step % cfg.train.eval_every == 0 or final:
                val_metrics = run_evaluation(cfg, parts, val_loader, writer, progress, step)
            if checkpointer.due(step, final):
                checkpointer.save(step, training_state(
                    step, parts.generator, parts.discriminator, parts.opt_g, parts.opt_d, config_dict
                ))
            if step % cfg.train.eval_every == 0 or checkpointer.due(step, final):
                timer.reset()  # keep evaluation and saving out of the step time
    finally:
        progress.close()
        writer.close()
    log.info(
        "done: %d steps, final val mIoU %.4f, pixel accuracy %.4f",
        step, val_metrics.get("mIoU", float("nan")), val_metrics.get("pixel_acc", float("nan")),
    )
    log.info("checkpoint: %s", checkpointer.last_path)
    if cfg.log.tensorboard:
        log.info("TensorBoard logs: %s  (view: tensorboard --logdir %s)", writer.tensorboard_dir, writer.tensorboard_dir)
    return TrainResult(run_dir, step, val_metrics)


def iterate_epochs(loader: Iterable) -> Iterator:
    """Batches forever, epoch after epoch (telling a distributed sampler the epoch)."""
    for epoch in count():
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader


def log_training(
    writer: MetricWriter, progress: Progress, parts: Training, step: int,
    losses: dict[str, float], perf: dict[str, float],
) -> None:
    scalars = {f"train/{name}": value for name, value in losses.items()}
    scalars.update({
        "train/lr_g": parts.opt_g.lr,
        "train/lr_d": parts.opt_d.lr,
        "amp/scale_g": parts.opt_g.loss_scale(),
        "amp/scale_d": parts.opt_d.loss_scale(),
        **perf,
    })
    writer.scalars(step, scalars)
    progress.update(step, losses)


def run_evaluation(
    cfg: Config, parts: Training, val_loader: Iterable, writer: MetricWriter, progress: Progress, step: int
) -> dict[str, object]:
    result = evaluate(
        parts.generator, val_loader, parts.device_map.generator, cfg.data.num_classes,
        autocast=parts.opt_g.autocast, num_samples=cfg.log.num_images,
    )
    metrics = result.metrics
    scalars = {"val/mIoU": metrics["mIoU"], "val/pixel_acc": metrics["pixel_acc"]}
    names = class_names_for(cfg)
    scalars.update({f"val/IoU/{name}": iou for name, iou in zip(names, metrics["iou"]) if iou == iou})
    writer.scalars(step, scalars)
    if result.samples is not None:
        panel = segmentation_panel(*result.samples, palette(cfg.data.num_classes), cfg.data.mean, cfg.data.std)
        writer.image(step, "val/input_gt_pred", panel)
    progress.write(f"step {step}: val mIoU {metrics['mIoU']:.4f}, pixel accuracy {metrics['pixel_acc']:.4f}")
    return metrics


def class_names_for(cfg: Config) -> list[str]:
    from segadv.data import class_names

    return list(class_names(cfg.data))


def prepare_run_dir(cfg: Config, config_name: str) -> Path:
    if cfg.run_dir is not None:
        run_dir = Path(cfg.run_dir)
    else:
        run_dir = Path("runs") / f"{config_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run dir {run_dir} exists and is not a directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create run dir {run_dir}: {err.strerror}") from None
    return run_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="segadv-train",
        description="Train a DeepLab generator against a fully convolutional discriminator.",
    )
    parser.add_argument("--config", help="YAML config (default: configs/default.yaml, the embedded demo)")
    parser.add_argument("--device-map", help="where each network runs, e.g. g:1,d:0 or g:cuda:0,d:cpu")
    parser.add_argument("--run-dir", help="output directory (default: runs/<config>-<time>)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    cfg = load_config(args.config, args.overrides)
    if args.device_map is not None:
        cfg.device_map = args.device_map
    if args.run_dir is not None:
        cfg.run_dir = args.run_dir
    train(cfg, config_name=Path(args.config).stem if args.config else "default")
    return 0


if __name__ == "__main__":
    sys.exit(main())
