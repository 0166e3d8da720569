"""The training loop of segadv-train (segadv/cli/train.py): a run from its config to its end.

The command (segadv/cli/train.py) imports this module only when a run starts; nothing here parses a
command line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from segadv.training.build import Training, build_training, log_placement
from segadv.checkpoint import CheckpointManager, load_weights
from segadv.config import Config, config_to_dict, flat_config
from segadv.data.streams import Streams
from segadv.engine.nonfinite import NonFiniteGuard
from segadv.errors import UserError, WriteFailed, input_shape_message
from segadv.monitor.diagnostics import D_LOSSES, DWinsWatch, confidence_quality
from segadv.monitor.images import confidence_panel, segmentation_panel
from segadv.monitor.meters import LossAverager, StepTimer
from segadv.monitor.profile import RunProfile, format_profile, peak_memory_gib, profile_scalars
from segadv.monitor.progress import Progress
from segadv.monitor.status import RunRecord
from segadv.monitor.writer import MetricWriter, NullWriter
from segadv.parallel import DeviceMap, activate, parse_device_map
from segadv.data.palette import palette
from segadv.parallel import distributed
from segadv.parallel.distributed import DistEnv
from segadv.training import preflight, run_dir as rundir
from segadv.training.lock import RunDirLock
from segadv.training.run_data import RunData, build_data, evaluate_generator, run_state
from segadv.training.process import seed_everything
from segadv.signals import StopRequests


log = logging.getLogger("segadv.training.loop")


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
    force: bool = False,
    config_path: Path | None = None,
) -> TrainResult:
    """Train to ``train.max_steps``. ``resume``: "auto" or a checkpoint path. ``stop_at``: stop
    (and checkpoint) after that step as a preempted run would, for tests and schedulers.
    ``force``: start even if the run dir looks too small for the checkpoints the run keeps.
    ``config_path``: the config file ``cfg`` came from (a run dir never writes over it).
    Raises Diverged (a non-finite loss or weight) and WriteFailed (a file could not be written),
    each with one message naming the last complete checkpoint (docs/failures.md). Rank 0 records
    how the run ended in RUN/status.json (segadv/monitor/status.py). The run dir follows
    segadv/training/run_dir.py's rule; a start that fails leaves nothing behind there."""
    run_dir = rundir.run_dir_for(cfg, config_name)
    rundir.check_start(run_dir, resume, config_path)
    resumed = rundir.resume_point(run_dir, resume, config_to_dict(cfg), trusted)  # before anything is written
    if resumed is not None and resumed.finished(cfg.train.max_steps):
        return already_finished(cfg, run_dir, resumed)
    env, device_map = start_processes(cfg)
    distributed.check_ranks_agree({**flat_config(cfg), "--resume": resume, "world size": env.world_size})
    preflight.check_start(cfg, resume, env.world_size)  # before anything slow
    cleanup = rundir.StartCleanup(run_dir, env)
    rundir.check_writable(run_dir)
    with RunDirLock(run_dir, env), cleanup, RunRecord(run_dir, cfg.train.max_steps, enabled=env.is_main) as record:
        result = run(cfg, env, device_map, run_dir, record, resume=resume, trusted=trusted, stop_at=stop_at,
                     force=force, started=cleanup.done)
        record.end(result.stopped_by)
        return result


def run(cfg: Config, env: DistEnv, device_map: DeviceMap, run_dir: Path, record: RunRecord, *,
        resume: str | None, trusted: bool, stop_at: int | None, force: bool,
        started: Callable[[], None] = lambda: None) -> TrainResult:
    """The run itself, in a run dir this process holds (``train``'s arguments). ``started`` is
    called once the first step is about to run: a failure before it is a failed start."""
    log.info("run dir: %s; device map: %s", run_dir, device_map)
    parts = build_training(cfg, device_map, env)
    data = build_data(cfg, parts, run_dir)
    initialise_weights(parts, trusted)
    log_placement(parts)
    checkpoints = CheckpointManager(run_dir, run_state(parts, data.streams), every=cfg.checkpoint.every,
                                    keep_last=cfg.checkpoint.keep_last, config=config_to_dict(cfg), env=env)
    step = start_step = checkpoints.start(resume, trusted)
    distributed.check_ranks_agree({"the step resumed at": step},
                                  hint="every rank must see the same checkpoints: is the run dir on a file system "
                                       "all nodes share?")
    max_steps = cfg.train.max_steps
    if checkpoints.last_complete is not None:  # resumed
        rundir.check_steps(step, max_steps, checkpoints.last_complete[0])
    checkpoints.check_room(max_steps, force)
    writer = open_writer(cfg, run_dir, env, resume_step=step if resume else None)
    started()
    progress = Progress(max_steps, start=step, bar=cfg.log.progress_bar if env.is_main else False)
    losses, timer, profile = LossAverager(), StepTimer(), RunProfile(parts.phases)
    guard = NonFiniteGuard(cfg.train.on_nonfinite, checkpoints, device_map.generator)
    d_wins = watch_d_wins(cfg, env)
    agreement = distributed.StepAgreement()
    val_metrics: dict[str, object] = {}
    stopped_by: str | None = None
    record.begin(step, checkpoints.best)
    with StopRequests(watch_parent=distributed.launched_by_torchrun()) as stop:
        try:
            while step < max_steps:
                losses.update(parts.step(data.streams, step))
                count_data_waits(data.streams, timer, profile)
                step += 1
                final = step == max_steps
                log_now = step % cfg.train.log_every == 0 or final
                stopped_by = stop_reason(stop, agreement, step, stop_at)
                interrupted = stopped_by is not None and not final
                if log_now or interrupted:
                    with profile.host_phase("logging"):
                        means = log_training(writer, progress, parts, step, losses.pop_means(),
                                             {**timer.pop(), **guard.skipped()})
                        parts.phases.resolve()  # the losses' read synced the devices
                    guard.check(step, means)
                    d_wins.update(step, means)
                evaluating = step % cfg.train.eval_every == 0 or final
                saving = checkpoints.due(step, final or interrupted)
                if evaluating or saving:
                    guard.check_unlogged(step, losses)  # nothing non-finite is evaluated or saved
                if evaluating:
                    agreement.settle()
                    with profile.host_phase("evaluation"):
                        val_metrics = evaluate_all(cfg, parts, data, writer, progress, step, profile.elapsed())
                    with profile.host_phase("checkpoint"):
                        checkpoints.keep_if_best(step, val_metrics["mIoU"], val_metrics["pixel_acc"])
                        record.evaluated(step, val_metrics, checkpoints.best)
                    writer.scalars(step, {"val/best_mIoU": checkpoints.best["mIoU"]})
                if saving:
                    with profile.host_phase("checkpoint"):
                        checkpoints.save(step)
                if interrupted:
                    break
                if evaluating or saving:
                    timer.reset()  # keep evaluation and saving out of the step time
            agreement.close()
            if env.is_main:
                log_time_profile(writer, profile, device_map.devices, step, start_step)
            writer.flush()  # a TensorBoard write that failed in its thread is raised here, with the note below
        except WriteFailed as err:  # metrics or TensorBoard: say where the run can go on from
            err.after = err.after or checkpoints.resume_note()
            raise
        except (UserError, RuntimeError) as err:  # bad data found mid-run: where the run can go on from
            noted = with_resume_note(err, checkpoints)
            if noted is err:
                raise
            raise noted from None
        finally:
            record.reached(step)
            progress.close()
            writer.close()
            data.close()
    if stopped_by and step < max_steps:
        return stopped(run_dir, step, max_steps, stopped_by, val_metrics, checkpoints)
    return finished(cfg, run_dir, step, val_metrics, checkpoints, writer)


def with_resume_note(err: Exception, checkpoints: CheckpointManager) -> Exception:
    """A user error met after the run started (a sample that fails to read, a batch G cannot take)
    as one naming the last complete checkpoint; any other error as it is."""
    message = str(err) if isinstance(err, UserError) else input_shape_message(err)
    if message is None:
        return err
    return UserError(f"{message}; {checkpoints.resume_note()}")


def start_processes(cfg: Config) -> tuple[DistEnv, DeviceMap]:
    """This process's rank, its devices activated, the process group joined, the RNGs seeded."""
    env = distributed.env_from()
    device_map = parse_device_map(cfg.device_map, local_rank=env.local_rank)
    activate(device_map)
    distributed.init_process_group(env, device_map)
    # Per-rank seeds (dropout differs per rank); DDP broadcasts rank 0's initial weights, and the
    # data order comes from the shared train.seed, so the ranks still agree where they must.
    seed_everything(cfg.train.seed + env.rank, cfg.train.deterministic, device_map.devices)
    return env, device_map


def open_writer(cfg: Config, run_dir: Path, env: DistEnv, resume_step: int | None) -> MetricWriter | NullWriter:
    """Rank 0 saves the config and writes the metrics; the other ranks write nothing."""
    if not env.is_main:
        return NullWriter(run_dir)
    writer = MetricWriter(run_dir, tensorboard=cfg.log.tensorboard, resume_step=resume_step)  # checks metrics.jsonl
    try:
        rundir.save_config(cfg, run_dir)
    except BaseException:
        writer.close()
        raise
    return writer


def watch_d_wins(cfg: Config, env: DistEnv) -> DWinsWatch:
    """"D wins outright" (``log.d_wins_loss``) on rank 0 only: the losses it reads are averaged
    over the ranks, and the other ranks log warnings too."""
    return DWinsWatch(cfg.log, D_LOSSES if env.is_main else ())


def count_data_waits(streams: Streams, timer: StepTimer, profile: RunProfile) -> None:
    waits = streams.pop_wait()
    timer.add_data_wait(waits)
    for name, seconds in waits.items():
        profile.phases.add(f"data/{name}", seconds)


def stopped(run_dir: Path, step: int, max_steps: int, reason: str, val_metrics: dict[str, object],
            checkpoints: CheckpointManager) -> TrainResult:
    log.info("stopped (%s) at step %d/%d; checkpoint: %s", reason, step, max_steps, newest_checkpoint(checkpoints))
    log.info("resume with: segadv-train --run-dir %s --resume auto", run_dir)
    return TrainResult(run_dir, step, val_metrics, reason, checkpoints.best)


def finished(cfg: Config, run_dir: Path, step: int, val_metrics: dict[str, object],
             checkpoints: CheckpointManager, writer: MetricWriter | NullWriter) -> TrainResult:
    best = checkpoints.best
    log.info(
        "done: %d steps, final val mIoU %.4f, pixel accuracy %.4f; best val mIoU %.4f at step %d",
        step, val_metrics.get("mIoU", float("nan")), val_metrics.get("pixel_acc", float("nan")),
        best["mIoU"] if best else float("nan"), best["step"] if best else -1,
    )
    log.info("checkpoints: %s (final), %s (best)", newest_checkpoint(checkpoints),
             checkpoints.best_path if best else "none")
    if cfg.log.tensorboard:
        log.info("TensorBoard logs: %s  (view: tensorboard --logdir %s)", writer.tensorboard_dir, writer.tensorboard_dir)
    return TrainResult(run_dir, step, val_metrics, best=best)


def newest_checkpoint(checkpoints: CheckpointManager) -> Path:
    """The checkpoint the run ends on: the one written or resumed from last (after a fallback from
    a corrupt last.pt, the step file it resumed from, never the file moved to abandoned/)."""
    return checkpoints.last_complete[0] if checkpoints.last_complete is not None else checkpoints.last_path


def already_finished(cfg: Config, run_dir: Path, resumed: rundir.ResumePoint) -> TrainResult:
    """A resume of a run that reached ``train.max_steps``: its stored results, nothing built or
    trained (a missing config.yaml is written back)."""
    env = distributed.env_from()
    with RunDirLock(run_dir, env):
        if env.is_main:
            rundir.save_config(cfg, run_dir, only_if_missing=True)
    evaluation = resumed.evaluation(run_dir)
    log.info(rundir.finished_line(run_dir, resumed.step, evaluation, resumed.best, resumed.path))
    metrics = {} if evaluation is None else {"mIoU": evaluation["mIoU"], "pixel_acc": evaluation.get("pixel_acc")}
    return TrainResult(run_dir, resumed.step, metrics, best=resumed.best)


def log_time_profile(writer: MetricWriter, profile: RunProfile, devices: list[torch.device], step: int,
                     start_step: int = 0) -> None:
    """Where this process's wall time went (docs/performance.md "Time profile of a run"): a table
    in the log and ``perf/time/*``, ``perf/share/*``, ``perf/peak_mem_gib/*`` at the last step.
    After a resume at ``start_step`` it covers the steps this process ran."""
    wall, seconds = profile.table()
    peaks = peak_memory_gib(devices)
    ran = f"{step - start_step} steps" + (f", {start_step + 1}-{step}" if start_step else "")
    log.info("time profile (this process, %s):\n%s", ran, format_profile(wall, seconds, peaks))
    writer.scalars(step, profile_scalars(wall, seconds, peaks))


def stop_reason(stop: StopRequests, agreement: distributed.StepAgreement, step: int,
                stop_at: int | None) -> str | None:
    """Why the run stops after ``step``, or None. A signal may reach one rank only: under DDP the
    ranks agree on it every step (one step late, without waiting: ``StepAgreement``), so every
    rank stops after the step following the first rank's ``seen``."""
    requested = stop.seen(step)
    agreed = agreement.any(requested is not None)
    if step == stop_at:
        return "stop_at"
    if agreed:
        return requested or "a signal on another rank"
    return None


def initialise_weights(parts: Training, trusted: bool) -> None:
    """``init.<role>``: each network starts from the given weights (strict unless excluded)."""
    for role, net in parts.members():
        source = role.settings.init
        if source is not None:
            load_weights(source.path, net.module, role=role.name, exclude=source.exclude, trusted=trusted)


def log_training(
    writer: MetricWriter, progress: Progress, parts: Training, step: int,
    losses: dict[str, float], perf: dict[str, float],
) -> dict[str, float]:
    """Logs the losses (averaged over ranks) and the optimizers' state; returns those losses."""
    losses = distributed.mean_over_ranks(losses, parts.device_map.generator)
    scalars = {f"train/{name}": value for name, value in losses.items()}
    for net in parts.networks():
        scalars.update({f"train/lr_{net.short}": net.opt.lr, f"amp/scale_{net.short}": net.opt.loss_scale()})
    scalars.update(perf)
    writer.scalars(step, scalars)
    progress.update(step, losses)
    return losses


def evaluate_all(cfg: Config, parts: Training, data: RunData, writer: MetricWriter, progress: Progress, step: int,
                 train_seconds: float) -> dict[str, object]:
    """Every evaluation due at ``step``: val (returned), the method's panel, the source's val split."""
    metrics = run_evaluation(cfg, parts, data.val_loader, writer, progress, step, num_samples=cfg.log.num_images,
                             extra={"perf/train_seconds": train_seconds})
    if data.panel_images is not None:
        log_method_panel(cfg, parts, data.panel_images, writer, step)
    if data.diagnostic is not None:
        log_confidence_quality(cfg, parts, data.diagnostic, writer, step)
    if data.source_val_loader is not None:
        run_evaluation(cfg, parts, data.source_val_loader, writer, progress, step, prefix="val_source")
    return metrics


def run_evaluation(
    cfg: Config, parts: Training, loader: Iterable, writer: MetricWriter, progress: Progress, step: int,
    prefix: str = "val", num_samples: int = 0, extra: dict[str, float] | None = None,
) -> dict[str, object]:
    """G on one val split, logged as ``<prefix>/mIoU``, ``<prefix>/pixel_acc``, ``<prefix>/IoU/<class>``
    (and ``num_samples`` input/truth/prediction panels). ``extra``: scalars logged with them
    (``perf/train_seconds``: accuracy against time, segadv-curves)."""
    result = evaluate_generator(cfg, parts, loader, num_samples=num_samples, track=progress.evaluation)
    metrics = result.metrics
    scalars = {f"{prefix}/mIoU": metrics["mIoU"], f"{prefix}/pixel_acc": metrics["pixel_acc"], **(extra or {})}
    names = class_names_for(cfg)
    notes = evaluation_notes(cfg, loader, result.absent_classes, names)
    scalars.update({f"{prefix}/IoU/{name}": iou for name, iou in zip(names, metrics["iou"]) if iou == iou})
    writer.scalars(step, scalars)
    if result.samples is not None:
        panel = segmentation_panel(*result.samples, palette(cfg.data.num_classes), cfg.data.mean, cfg.data.std,
                                   names)
        writer.image(step, f"{prefix}/input_gt_pred", panel)
    progress.write(f"step {step}: {prefix} mIoU {metrics['mIoU']:.4f}, pixel accuracy {metrics['pixel_acc']:.4f}{notes}")
    return metrics


def evaluation_notes(cfg: Config, loader: Iterable, absent: list[int], names: list[str]) -> str:
    """What an evaluation's numbers leave out: val samples dropped under data.on_error=skip, and
    classes with no ground-truth pixel (``; ...`` each, or "")."""
    from segadv.data.files import absent_classes_note
    from segadv.data.loaders import left_out

    skipped = len(left_out(loader))
    notes = [f"{skipped} val sample{'' if skipped == 1 else 's'} skipped (data.on_error=skip)"] if skipped else []
    absent_note = absent_classes_note(names, absent, cfg.data.ignore_index, "val")
    return "".join(f"; {note}" for note in [*notes, *([absent_note] if absent_note else [])])


def log_confidence_quality(cfg: Config, parts: Training, samples: tuple[torch.Tensor, torch.Tensor],
                           writer: MetricWriter, step: int) -> None:
    """Does D know which pixels are right? The method's own panel maps (G's argmax, D's confidence,
    the mask) on the diagnostic images, in chunks of the panel's size, against their masks:
    ``diag/d_confidence_auroc``, ``diag/d_mask_precision``, ``diag/d_mask_pass``, ``diag/g_pixel_acc``
    (docs/training.md)."""
    images, truth = samples
    chunk = max(cfg.log.num_images, 1)
    maps = [parts.method.panel(images[i:i + chunk]) for i in range(0, len(images), chunk)]
    if any(m is None for m in maps):
        return
    ignore = cfg.data.ignore_index
    quality = confidence_quality(torch.cat([m.preds for m in maps]), torch.cat([m.confidence for m in maps]),
                                 torch.cat([m.pseudo_labels for m in maps]) != ignore, truth, ignore)
    writer.scalars(step, {f"diag/{name}": value for name, value in quality.items()})


def log_method_panel(cfg: Config, parts: Training, images: torch.Tensor, writer: MetricWriter, step: int) -> None:
    """The method's panel and, from the same maps, the histogram of D's confidence at every pixel
    of the panel's images (``diag/d_confidence_<panel stream>``)."""
    maps = parts.method.panel(images)
    if maps is not None:
        panel = confidence_panel(maps, palette(cfg.data.num_classes), cfg.data.mean, cfg.data.std,
                                 class_names_for(cfg))
        writer.image(step, maps.tag, panel)
        writer.histogram(step, f"diag/d_confidence_{parts.method.panel_stream}", maps.confidence)


def class_names_for(cfg: Config) -> list[str]:
    from segadv.data import class_names

    return list(class_names(cfg.data))
