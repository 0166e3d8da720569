"""segadv-train: train G against D on the configured data.

    segadv-train [--config FILE] [--device-map MAP] [--run-dir DIR] [--resume auto|PATH] [key=value ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from segadv.cli_args import add_config_arguments, parse_args
from segadv.build import Training, build_training, log_placement
from segadv.checkpoint import Checkpointer, load_weights, read_checkpoint, restore_training_state, training_state
from segadv.config import Config, config_to_dict, dump_config, load_config
from segadv.data import build_stream_loaders, build_val_loader, palette
from segadv.data.streams import Stream, Streams
from segadv.engine.evaluate import evaluate
from segadv.errors import UserError, cli_entry
from segadv.methods import stream_batch_sizes
from segadv.monitor.images import confidence_panel, segmentation_panel
from segadv.monitor.meters import LossAverager, StepTimer
from segadv.monitor.profile import RunProfile, format_profile, peak_memory_gib, profile_scalars
from segadv.monitor.progress import Progress
from segadv.monitor.writer import MetricWriter, NullWriter
from segadv.parallel import activate, parse_device_map
from segadv.parallel.placement import for_inference, unwrap
from segadv.parallel import distributed
from segadv.parallel.distributed import DistEnv
from segadv.runtime import capture_rng_state, restore_rng_state, seed_everything, setup_logging
from segadv.signals import StopRequests

log = logging.getLogger("segadv.train")


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    val_metrics: dict[str, object]
    stopped_by: str | None = None  # the signal that ended the run early, if any
    best: dict[str, float] | None = None  # the best evaluation: {"mIoU", "step"} (checkpoints/best.pt)


def train(
    cfg: Config,
    config_name: str = "default",
    *,
    resume: str | None = None,
    trusted: bool = False,
    stop_at: int | None = None,
) -> TrainResult:
    """Train to ``train.max_steps``. ``resume``: "auto" or a checkpoint path. ``stop_at``: stop
    (and checkpoint) after that step as a preempted run would, for tests and schedulers."""
    env = distributed.env_from()
    device_map = parse_device_map(cfg.device_map, local_rank=env.local_rank)
    activate(device_map)
    distributed.init_process_group(env, device_map)
    # Per-rank seeds (dropout differs per rank); DDP broadcasts rank 0's initial weights, and the
    # data order comes from the shared train.seed, so the ranks still agree where they must.
    seed_everything(cfg.train.seed + env.rank, cfg.train.deterministic, device_map.devices)
    run_dir = prepare_run_dir(cfg, config_name)
    log.info("run dir: %s; device map: %s", run_dir, device_map)

    parts = build_training(cfg, device_map, env)
    loaders, val_loader = build_stream_loaders(
        cfg.data, parts.method.streams, seed=cfg.train.seed, pin_memory=device_map.generator.type != "cpu",
        run_dir=run_dir, rank=env.rank, world_size=env.world_size, batch_sizes=stream_batch_sizes(cfg),
        target=cfg.target_data,
    )
    streams = Streams({name: Stream(name, loader) for name, loader in loaders.items()})
    source_val_loader = None
    if cfg.train.eval_source and cfg.target_data is not None:
        # Every rank evaluates the whole source val split (small; the confusion counts it
        # all-reduces scale together, so the metrics are the single-process ones).
        source_val_loader = build_val_loader(cfg.data, seed=cfg.train.seed, pin_memory=False)
    panel_images = first_images(streams[parts.method.panel_stream], cfg.log.num_images) \
        if parts.method.panel_stream and cfg.log.num_images else None
    initialise_weights(cfg, parts, trusted)
    log_placement(parts)
    checkpointer = Checkpointer(run_dir, cfg.checkpoint.every, cfg.checkpoint.keep_last)
    if env.is_main:
        checkpointer.remove_stale_temp_files()
    step, resumed_from, best = (0, None, None) if resume is None else resume_training(
        resume, checkpointer, parts, streams, trusted)
    if env.is_main:
        checkpointer.archive_later_checkpoints(step, resumed_from)
    if best is not None and not checkpointer.best_path.is_file():
        log.warning("best.pt (val mIoU %.4f at step %d) is gone (abandoned or removed): the next evaluation "
                    "writes a new one", best["mIoU"], best["step"])
        best = None
    distributed.barrier()  # everyone has read the checkpoint before rank 0 writes anything
    if env.is_main:
        dump_config(cfg, run_dir / "config.yaml")
        writer = MetricWriter(run_dir, tensorboard=cfg.log.tensorboard, resume_step=step if resume else None)
    else:
        writer = NullWriter(run_dir)
    config_dict = config_to_dict(cfg)

    def save(at_step: int, as_best: bool = False) -> None:
        rng = distributed.gather_objects(capture_rng_state(device_map.devices))  # one per rank
        if env.is_main:
            state = training_state(
                at_step, parts.generator, parts.discriminator, parts.opt_g, parts.opt_d, config_dict, rng=rng,
                data_streams=streams.state_dict(), aux_discriminator=parts.aux_discriminator,
                opt_d_aux=parts.opt_d_aux, best=best,
            )
            if as_best:
                checkpointer.save_best(at_step, state, best)
            else:
                checkpointer.save(at_step, state)
        distributed.barrier()  # nobody races ahead of (or exits before) the write

    max_steps = cfg.train.max_steps
    progress = Progress(max_steps, start=step, bar=cfg.log.progress_bar if env.is_main else False)
    losses, timer = LossAverager(), StepTimer()
    profile = RunProfile(parts.phases)
    val_metrics: dict[str, object] = {}
    stopped_by: str | None = None
    with StopRequests() as stop:
        try:
            while step < max_steps:
                losses.update(parts.method(streams, step))
                waits = streams.pop_wait()
                timer.add_data_wait(waits)
                for name, seconds in waits.items():
                    profile.phases.add(f"data/{name}", seconds)
                step += 1
                final = step == max_steps
                log_now = step % cfg.train.log_every == 0 or final
                if step == stop_at:
                    stopped_by = "stop_at"
                elif stop_agreed(stop, env, log_now):
                    stopped_by = stop.requested or "a signal on another rank"
                interrupted = stopped_by is not None and not final

                if log_now or interrupted:
                    with profile.host_phase("logging"):
                        log_training(writer, progress, parts, step, losses.pop_means(), timer.pop())
                        parts.phases.resolve()  # the losses' read synced the devices
                if step % cfg.train.eval_every == 0 or final:
                    with profile.host_phase("evaluation"):
                        val_metrics = run_evaluation(cfg, parts, val_loader, writer, progress, step,
                                                     train_seconds=profile.elapsed())
                        if panel_images is not None:
                            log_method_panel(cfg, parts, panel_images, writer, step)
                        if source_val_loader is not None:
                            evaluate_source(cfg, parts, source_val_loader, writer, progress, step)
                    if best is None or val_metrics["mIoU"] > best["mIoU"]:
                        # The same metrics on every rank (all-reduced), so every rank agrees.
                        best = {"mIoU": float(val_metrics["mIoU"]), "step": step}
                        with profile.host_phase("checkpoint"):
                            save(step, as_best=True)
                    writer.scalars(step, {"val/best_mIoU": best["mIoU"]})
                if checkpointer.due(step, final) or interrupted:
                    with profile.host_phase("checkpoint"):
                        save(step)
                if interrupted:
                    break
                if step % cfg.train.eval_every == 0 or checkpointer.due(step, final):
                    timer.reset()  # keep evaluation and saving out of the step time
            if env.is_main:
                log_time_profile(writer, profile, device_map.devices, step)
        finally:
            progress.close()
            writer.close()
    if stopped_by and step < max_steps:
        log.info("stopped (%s) at step %d/%d; checkpoint: %s", stopped_by, step, max_steps, checkpointer.last_path)
        log.info("resume with: segadv-train --run-dir %s --resume auto", run_dir)
        return TrainResult(run_dir, step, val_metrics, stopped_by, best)
    log.info(
        "done: %d steps, final val mIoU %.4f, pixel accuracy %.4f; best val mIoU %.4f at step %d",
        step, val_metrics.get("mIoU", float("nan")), val_metrics.get("pixel_acc", float("nan")),
        best["mIoU"] if best else float("nan"), best["step"] if best else -1,
    )
    log.info("checkpoints: %s (final), %s (best)", checkpointer.last_path, checkpointer.best_path)
    if cfg.log.tensorboard:
        log.info("TensorBoard logs: %s  (view: tensorboard --logdir %s)", writer.tensorboard_dir, writer.tensorboard_dir)
    return TrainResult(run_dir, step, val_metrics, best=best)


def log_time_profile(writer: MetricWriter, profile: RunProfile, devices: list[torch.device], step: int) -> None:
    """Where this run's wall time went (README "Time profile"): a table in the log and
    ``perf/time/*``, ``perf/share/*``, ``perf/peak_mem_gib/*`` at the last step."""
    wall, seconds = profile.table()
    peaks = peak_memory_gib(devices)
    log.info("time profile (this process, %d steps):\n%s", step, format_profile(wall, seconds, peaks))
    writer.scalars(step, profile_scalars(wall, seconds, peaks))


def stop_agreed(stop: StopRequests, env: DistEnv, log_now: bool) -> bool:
    """Whether to stop now. A signal may reach one rank only, so under DDP the ranks agree at log
    time (a sync there anyway) rather than every step."""
    if not env.distributed:
        return stop.requested is not None
    return log_now and distributed.any_rank(stop.requested is not None)


def initialise_weights(cfg: Config, parts: Training, trusted: bool) -> None:
    """``init.generator`` / ``init.discriminator``: start from given weights (strict unless excluded)."""
    for role, module in (("generator", parts.generator), ("discriminator", parts.discriminator)):
        source = getattr(cfg.init, role)
        if source is not None:
            load_weights(source.path, module, role=role, exclude=source.exclude, trusted=trusted)


def resume_training(
    resume: str, checkpointer: Checkpointer, parts: Training, streams: Streams, trusted: bool
) -> tuple[int, Path | None, dict | None]:
    """Restore networks, optimizers, schedulers, scalers, data stream positions and RNGs; returns
    the step to continue from, the file it came from (None: nothing to resume, a fresh start) and
    the best evaluation so far."""
    if resume == "auto":
        found = checkpointer.newest_loadable(trusted)
        if found is None:
            log.info("--resume auto: no checkpoint in %s, starting fresh", checkpointer.directory)
            return 0, None, None
        path, ckpt = found
    else:
        path, ckpt = Path(resume), read_checkpoint(resume, trusted=trusted)
    step = restore_training_state(ckpt, parts.generator, parts.discriminator, parts.opt_g, parts.opt_d,
                                  parts.aux_discriminator, parts.opt_d_aux)
    streams.load_state_dict(ckpt.get("data_streams"), step)
    rng = ckpt.get("rng")
    if isinstance(rng, list):  # one state per rank
        if len(rng) == parts.env.world_size:
            restore_rng_state(rng[parts.env.rank])
        else:
            log.warning("checkpoint has RNG states of %d ranks, this run has %d: RNGs not restored",
                        len(rng), parts.env.world_size)
    elif rng:
        restore_rng_state(rng)
    log.info("resumed from %s at step %d", path, step)
    return step, path, ckpt.get("best")


def log_training(
    writer: MetricWriter, progress: Progress, parts: Training, step: int,
    losses: dict[str, float], perf: dict[str, float],
) -> None:
    losses = distributed.mean_over_ranks(losses, parts.device_map.generator)
    scalars = {f"train/{name}": value for name, value in losses.items()}
    scalars.update({
        "train/lr_g": parts.opt_g.lr,
        "train/lr_d": parts.opt_d.lr,
        "amp/scale_g": parts.opt_g.loss_scale(),
        "amp/scale_d": parts.opt_d.loss_scale(),
        **perf,
    })
    if parts.opt_d_aux is not None:
        scalars.update({"train/lr_d_aux": parts.opt_d_aux.lr, "amp/scale_d_aux": parts.opt_d_aux.loss_scale()})
    writer.scalars(step, scalars)
    progress.update(step, losses)


def run_evaluation(
    cfg: Config, parts: Training, val_loader: Iterable, writer: MetricWriter, progress: Progress, step: int,
    train_seconds: float | None = None,
) -> dict[str, object]:
    """``train_seconds``: the loop's wall time when this evaluation began, logged with it
    (``perf/train_seconds``: accuracy against time, tools/demo_curves.py)."""
    result = evaluate(
        generator_for_evaluation(parts), val_loader, parts.device_map.generator, cfg.data.num_classes,
        autocast=parts.opt_g.autocast, num_samples=cfg.log.num_images,
    )
    metrics = result.metrics
    scalars = {"val/mIoU": metrics["mIoU"], "val/pixel_acc": metrics["pixel_acc"]}
    if train_seconds is not None:
        scalars["perf/train_seconds"] = train_seconds
    names = class_names_for(cfg)
    scalars.update({f"val/IoU/{name}": iou for name, iou in zip(names, metrics["iou"]) if iou == iou})
    writer.scalars(step, scalars)
    if result.samples is not None:
        panel = segmentation_panel(*result.samples, palette(cfg.data.num_classes), cfg.data.mean, cfg.data.std)
        writer.image(step, "val/input_gt_pred", panel)
    progress.write(f"step {step}: val mIoU {metrics['mIoU']:.4f}, pixel accuracy {metrics['pixel_acc']:.4f}")
    return metrics


def evaluate_source(cfg: Config, parts: Training, loader: Iterable, writer: MetricWriter, progress: Progress,
                    step: int) -> None:
    """Domain adaptation with ``train.eval_source``: the source's val split, as ``val_source/*``."""
    metrics = evaluate(generator_for_evaluation(parts), loader, parts.device_map.generator, cfg.data.num_classes,
                       autocast=parts.opt_g.autocast).metrics
    writer.scalars(step, {"val_source/mIoU": metrics["mIoU"], "val_source/pixel_acc": metrics["pixel_acc"]})
    progress.write(f"step {step}: source val mIoU {metrics['mIoU']:.4f}")


def first_images(stream: Stream, count: int) -> torch.Tensor:
    """The stream's first ``count`` images, fixed for the whole run (a method's panel), read
    without moving the stream."""
    dataset = stream.loader.dataset
    samples = [dataset[(i, 0)] for i in range(min(count, len(dataset)))]
    return torch.stack([s[0] if isinstance(s, (tuple, list)) else s for s in samples])


def log_method_panel(cfg: Config, parts: Training, images: torch.Tensor, writer: MetricWriter, step: int) -> None:
    maps = parts.method.panel(images)
    if maps is not None:
        panel = confidence_panel(maps, palette(cfg.data.num_classes), cfg.data.mean, cfg.data.std)
        writer.image(step, maps.tag, panel)


def generator_for_evaluation(parts: Training) -> nn.Module:
    """G as every rank evaluates it: under DDP with rank 0's BatchNorm statistics (after the last
    step each rank's hold one local update), and outside DDP's collective forward."""
    if isinstance(parts.generator, DistributedDataParallel):
        distributed.broadcast_buffers(unwrap(parts.generator))
    return for_inference(parts.generator)


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
    add_config_arguments(parser, "default: default, the embedded demo; when resuming, RUN_DIR/config.yaml")
    parser.add_argument("--device-map", help="where each network runs, e.g. g:1,d:0 or g:cuda:0,d:cpu")
    parser.add_argument("--run-dir", help="output directory (default: runs/<config>-<time>)")
    parser.add_argument("--resume", metavar="auto|PATH",
                        help="continue from the newest complete checkpoint in the run dir (auto) or from PATH")
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="allow checkpoints that need arbitrary pickled code (off: weights only)")
    parser.add_argument("--nproc-per-node", type=int, metavar="N",
                        help="launch N processes on this node through torchrun (DDP)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    return parser


def resolve_config_path(args: argparse.Namespace) -> str | None:
    """When resuming a run dir without --config, the run's own saved config is the one to use."""
    if args.config is None and args.resume is not None and args.run_dir is not None:
        saved = Path(args.run_dir) / "config.yaml"
        if saved.is_file():
            return str(saved)
    return args.config


@cli_entry
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(build_parser(), argv)
    if args.nproc_per_node is not None:
        # Re-launch this command through torchrun (torch.distributed.run), one process per rank.
        from segadv.parallel.launch import launch_with_torchrun

        return launch_with_torchrun(args.nproc_per_node, argv)
    env = distributed.env_from()
    setup_logging(main_process=env.is_main)
    config_path = resolve_config_path(args)
    cfg = load_config(config_path, args.overrides)
    if args.device_map is not None:
        cfg.device_map = args.device_map
    if args.run_dir is not None:
        cfg.run_dir = args.run_dir
    name = Path(args.config).stem if args.config else "default"
    try:
        train(cfg, config_name=name, resume=args.resume, trusted=args.trust_checkpoint)
    finally:
        distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
