"""The training loop of segadv-train (segadv/cli/train.py): a run from its config to its end.

The command (segadv/cli/train.py) imports this module only when a run starts; nothing here parses a
command line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from segadv.config import Config, config_to_dict, flat_config
from segadv.config.schema import best_score_by
from segadv.checkpoint import CheckpointManager
from segadv.monitor.reporter import Reporter
from segadv.monitor.status import RunRecord
from segadv.parallel import DeviceMap, activate, parse_device_map
from segadv.parallel import distributed, fsdp
from segadv.parallel.distributed import DistEnv
from segadv.signals import Interrupted, Shielded, deferred, handling_signals
from segadv.training import preflight, run_dir as rundir, smoke
from segadv.training.build import Training
from segadv.training.early_stop import stopped_early
from segadv.training.lock import RunDirLock
from segadv.training.process import run_log, seed_everything
from segadv.training.run_data import RunData, evaluate_generator, evaluate_teacher
from segadv.training.session import RunOptions, RunSite, Session, open_session


log = logging.getLogger("segadv.training.loop")


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    val_metrics: dict[str, object]
    stopped_by: str | None = None  # what ended the run early, if anything: a signal, stop_at, D's health, early stop
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
    segadv/training/run_dir.py's rule; a start that fails leaves nothing behind there. SIGINT,
    SIGTERM and SIGHUP are answered by segadv/signals.py's handler from here to the return, called
    as a library too (a command's is already installed): no write of the run meets a signal's
    default action, which would end the process mid-write. With ``train.smoke`` the run is a smoke
    run (:func:`smoke_run`): it keeps nothing."""
    with handling_signals():
        if cfg.train.smoke:
            return smoke_run(cfg, resume=resume, trusted=trusted, stop_at=stop_at, force=force)
        return _train(cfg, rundir.run_dir_for(cfg, config_name), resume=resume, trusted=trusted, stop_at=stop_at,
                      force=force, config_path=config_path)


def smoke_run(cfg: Config, *, resume: str | None, trusted: bool, stop_at: int | None, force: bool) -> TrainResult:
    """``train.smoke`` (segadv/training/smoke.py): the run cut to a few steps, one evaluation and a
    checkpoint read back, in a throwaway run dir removed at its end; its ``TrainResult`` names that
    dir, gone by then. The run dir ``cfg`` names is neither made nor read."""
    smoke.check_smoke(cfg, resume)
    env, _ = start_processes(cfg)  # the ranks agree on the throwaway dir: the process group is up first
    with rundir.throwaway_run_dir(env) as run_dir:
        log.info("smoke run (train.smoke): %d steps and one evaluation in the throwaway run dir %s, removed at its "
                 "end; nothing is kept", smoke.SMOKE_STEPS, run_dir)
        try:
            result = _train(smoke.smoke_config(cfg, run_dir), run_dir, resume=None, trusted=trusted, stop_at=stop_at,
                            force=force, config_path=None)
        except Interrupted as err:
            err.after = "a smoke run keeps nothing: run it again"
            raise
    log.info(smoke.outcome_line(result))
    return result


def _train(cfg: Config, run_dir: Path, *, resume: str | None, trusted: bool, stop_at: int | None, force: bool,
           config_path: Path | None) -> TrainResult:
    rundir.check_start(run_dir, resume, config_path)
    resumed = rundir.resume_point(run_dir, resume, config_to_dict(cfg), trusted)  # before anything is written
    if resumed is not None and resumed.finished(cfg.train.max_steps):
        return already_finished(cfg, run_dir, resumed)
    if resumed is not None and \
            (reason := stopped_early(cfg.train.early_stop, resumed.early_stop, resumed.best)) is not None:
        return already_finished(cfg, run_dir, resumed, reason)
    options = RunOptions(resume, trusted, stop_at, force)
    env, device_map = start_processes(cfg)
    site = RunSite(run_dir, env, device_map)
    distributed.check_ranks_agree({**flat_config(cfg), "--resume": resume, "world size": env.world_size})
    start = preflight.check_start(cfg, resume, device_map, env)  # before anything slow
    cleanup = rundir.StartCleanup(run_dir, env)
    try:
        rundir.check_writable(run_dir)  # the start's first write (a probe, the run dir made)
        # Shielded: a signal while the lock is released, a failed start's files are removed or the
        # outcome is recorded waits for them to end (segadv/signals.py): none is left half done.
        with Shielded(cleanup.entering(RunDirLock(run_dir, env))), Shielded(cleanup), run_log(run_dir, env.is_main), \
                Shielded(RunRecord(run_dir, cfg.train.max_steps, enabled=env.is_main)) as record:
            result = run(cfg, site, record, options, start, started=cleanup.done)
            with deferred():
                record.end(result.stopped_by)
            return result
    except BaseException as err:
        if not cleanup.started:
            cleanup.remove_made_dir()  # a failure before the clean-up was entered (the probe, a refused lock)
        if isinstance(err, Interrupted):
            if not cleanup.started:
                interrupted_start(err, run_dir, resumed)
            elif not err.after:  # after the loop (its checkpoints saved), before the process ended
                err.after = f"the run's checkpoints are in {run_dir / rundir.CHECKPOINT_DIR} (resume: --resume auto)"
        raise


def run(cfg: Config, site: RunSite, record: RunRecord, options: RunOptions, start: preflight.Start | None = None,
        started: Callable[[], None] = lambda: None) -> TrainResult:
    """The run itself, in a run dir this process holds (``train``'s arguments): set up, the steps
    (each component deciding when it acts at a step), the end. ``started`` is called once the first
    step is about to run: a failure before it is a failed start. ``start``: what the start's checks
    established (None: checked here)."""
    with open_session(cfg, site, record, options, start, started) as session:
        parts, data, checkpoints, reporter, stop = (session.parts, session.data, session.checkpoints,
                                                    session.reporter, session.stop)
        step, val_metrics = session.step, {}
        while not stop.now:
            losses = parts.step(data.streams, step)
            step += 1
            reporter.step_done(step, losses, data.streams.pop_wait())
            stop.after_step(step)  # stop_at, a signal as the ranks agree on it
            logged = reporter.should_log(step) or stop.early
            if logged:
                reporter.log(step)
                stop.at_log(reporter.stop_reason)  # D out of its band, train.on_discriminator_collapse: stop
            evaluating = evaluation_due(cfg, step, stop.final)
            if evaluating or checkpoints.due(step, stop.now):
                reporter.check_finite(step)  # nothing non-finite is evaluated or saved
            if evaluating:
                val_metrics = evaluate(cfg, session, step)  # train.early_stop's reason, heard by stop
                if stop.early and not logged:
                    reporter.log(step)  # the losses since the last log step, as any stop logs them
            if checkpoints.due(step, stop.now):  # after the evaluation: an early stop is checkpointed
                with reporter.phase("checkpoint"):
                    checkpoints.save(step)
        stop.close()
        reporter.finish(step)
    if stop.stopped_by:
        return stopped(site.run_dir, step, cfg.train.max_steps, stop.stopped_by, val_metrics, checkpoints,
                       session.early_stop.patience if session.early_stop.exhausted else None, kept=not cfg.train.smoke)
    return finished(cfg, site.run_dir, step, val_metrics, checkpoints, reporter.tensorboard_dir)


def evaluation_due(cfg: Config, step: int, final: bool) -> bool:
    """Every ``train.eval_every`` steps and at ``train.max_steps``: an early stop is checkpointed,
    not evaluated."""
    return step % cfg.train.eval_every == 0 or final


def evaluate(cfg: Config, session: Session, step: int) -> dict[str, object]:
    """The evaluations due at ``step``, then train.early_stop's count (before best.pt, which
    carries it), best.pt where the score improved and status.json; an early stop's reason last,
    giving the best best.pt holds then."""
    session.stop.settle()  # no reduction in flight while the evaluation forks its loader workers
    with session.reporter.phase("evaluation"):
        val_metrics = evaluate_all(cfg, session.parts, session.data, session.reporter, step)
    exhausted = session.early_stop.update(step, val_metrics) is not None
    with session.reporter.phase("checkpoint"):
        session.checkpoints.keep_if_best(step, val_metrics["mIoU"], val_metrics["pixel_acc"],
                                         val_metrics.get("proxies"))
        session.reporter.evaluated(step, val_metrics, session.checkpoints.best)
    session.stop.at_evaluation(session.early_stop.reason(session.checkpoints.best) if exhausted else None)
    return val_metrics


def interrupted_start(err: Interrupted, run_dir: Path, resumed: rundir.ResumePoint | None) -> None:
    """A signal that ended a start before its first step, told as such: a fresh start left
    nothing (StartCleanup removed what it wrote), a resume left its run where it was."""
    err.when = err.when or "before the first step"
    if resumed is None:
        err.after = (f"nothing was trained or saved, and what the start wrote in {run_dir} was removed: "
                     "run the same command again to start")
    else:  # what the start's parts said (the checkpoints it read) is the same place, told as a start's
        err.after = (f"the run stands at {resumed.path} (step {resumed.step}): run the same command again "
                     "to go on")


def evaluate_all(cfg: Config, parts: Training, data: RunData, reporter: Reporter, step: int) -> dict[str, object]:
    """Every evaluation due at ``step``, each reported as it ends: val (its metrics returned, with
    its label-free scores as ``proxies`` where the method reads unlabeled or target images), the
    teacher's val mIoU where the run has one (``val/mIoU_teacher``), the method's panel and
    diagnostics, the source's val split."""
    # Sharded networks (FSDP) gathered for the evaluations: their forwards are then no
    # collectives, so uneven val shards and rank 0's panels cannot leave a rank waiting in one.
    with fsdp.gathered([net.bare for net in parts.every_network()]):
        return evaluate_networks(cfg, parts, data, reporter, step)


def evaluate_networks(cfg: Config, parts: Training, data: RunData, reporter: Reporter, step: int) -> dict[str, object]:
    train_seconds = reporter.elapsed()
    val_data = cfg.target_data or cfg.data  # the section data.val_loader reads
    val = evaluate_generator(cfg, parts, data.val_loader, val_data, num_samples=cfg.log.num_images,
                             track=reporter.track, proxies=type(parts.method).reads_unlabeled(cfg))
    metrics = reporter.evaluation(step, val, data.val_loader, train_seconds=train_seconds)
    teacher = evaluate_teacher(cfg, parts, data.val_loader, val_data, track=reporter.track)
    if teacher is not None:  # the mean teacher's EMA teacher beside the student's val/mIoU
        score = teacher.metrics["mIoU"]
        reporter.writer.scalars(step, {"val/mIoU_teacher": score})
        reporter.progress.write(f"step {step}: val mIoU of the teacher {score:.4f} (val/mIoU is the student's)")
    reporter.diagnostics(step, data.panel_images, data.diagnostic)
    if data.source_val_loader is not None:
        source = evaluate_generator(cfg, parts, data.source_val_loader, cfg.data, track=reporter.track)
        reporter.evaluation(step, source, data.source_val_loader, prefix="val_source")
    return metrics


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


def stopped(run_dir: Path, step: int, max_steps: int, reason: str, val_metrics: dict[str, object],
            checkpoints: CheckpointManager, spent_patience: int | None = None, kept: bool = True) -> TrainResult:
    """``spent_patience``: train.early_stop's patience where it is spent, so a resume as it is
    trains no more. ``kept``: the run dir stays (a smoke run's goes: nothing there to resume)."""
    if not kept:
        log.info("stopped (%s) at step %d/%d", reason, step, max_steps)
        return TrainResult(run_dir, step, val_metrics, reason, checkpoints.best)
    log.info("stopped (%s) at step %d/%d; checkpoint: %s", reason, step, max_steps, newest_checkpoint(checkpoints))
    if spent_patience is not None:
        log.info("to train on: segadv-train --run-dir %s --resume auto train.early_stop.patience=<more than %d> "
                 "(or train.early_stop.monitor=null)", run_dir, spent_patience)
    else:
        log.info("resume with: segadv-train --run-dir %s --resume auto", run_dir)
    return TrainResult(run_dir, step, val_metrics, reason, checkpoints.best)


def finished(cfg: Config, run_dir: Path, step: int, val_metrics: dict[str, object],
             checkpoints: CheckpointManager, tensorboard_dir: Path) -> TrainResult:
    best = checkpoints.best
    by = best_score_by(best) if best else "val/mIoU"
    chosen = "" if by == "val/mIoU" else f" (chosen by {by} {best['score']:.4f})"
    log.info(
        "done: %d steps, final val mIoU %.4f, pixel accuracy %.4f; best val mIoU %.4f at step %d%s",
        step, val_metrics.get("mIoU", float("nan")), val_metrics.get("pixel_acc", float("nan")),
        best["mIoU"] if best else float("nan"), best["step"] if best else -1, chosen,
    )
    if cfg.train.smoke:  # its run dir goes as it ends: nothing there to point at
        return TrainResult(run_dir, step, val_metrics, best=best)
    log.info("checkpoints: %s (final), %s (best)", newest_checkpoint(checkpoints),
             checkpoints.best_path if best else "none")
    if cfg.log.tensorboard:
        log.info("TensorBoard logs: %s  (view: tensorboard --logdir %s)", tensorboard_dir, tensorboard_dir)
    return TrainResult(run_dir, step, val_metrics, best=best)


def newest_checkpoint(checkpoints: CheckpointManager) -> Path:
    """The checkpoint the run ends on: the one written or resumed from last (after a fallback from
    a corrupt last.pt, the step file it resumed from, never the file moved to abandoned/)."""
    return checkpoints.last_complete[0] if checkpoints.last_complete is not None else checkpoints.last_path


def already_finished(cfg: Config, run_dir: Path, resumed: rundir.ResumePoint,
                     early_stop: str | None = None) -> TrainResult:
    """A resume of a run that reached ``train.max_steps``, or (``early_stop``: why) that
    train.early_stop stopped and would stop again at once: its stored results, nothing built or
    trained (a missing config.yaml is written back)."""
    env = distributed.env_from()
    with RunDirLock(run_dir, env):
        if env.is_main:
            rundir.save_config(cfg, run_dir, only_if_missing=True)
    evaluation = resumed.evaluation(run_dir)
    log.info(rundir.finished_line(run_dir, resumed.step, evaluation, resumed.best, resumed.path,
                                  early_stop=early_stop, max_steps=cfg.train.max_steps))
    metrics = {} if evaluation is None else {"mIoU": evaluation["mIoU"], "pixel_acc": evaluation.get("pixel_acc")}
    return TrainResult(run_dir, resumed.step, metrics, early_stop, best=resumed.best)
