"""A run's set-up, from the built parts to the first step, in one place.

:func:`open_session` builds what the loop needs in order (the networks and the method, the data,
the weights, the checkpoints and the step they resume at, the reporter), enters their contexts on
one ExitStack, and hands the loop a :class:`Session`. Leaving it closes them in reverse: the
loaders' workers end, the signal handlers go back, the reporter closes its files, and an error on
the way out is told with the checkpoint the run can resume from.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from segadv.checkpoint import CheckpointManager, load_weights
from segadv.config import Config, config_to_dict
from segadv.engine.nonfinite import NonFiniteGuard
from segadv.errors import UserError, WriteFailed, input_shape_message
from segadv.monitor.profile import RunClock
from segadv.monitor.reporter import Reporter
from segadv.monitor.status import RunRecord
from segadv.parallel import DeviceMap, distributed
from segadv.parallel.distributed import DistEnv
from segadv.signals import Interrupted, StopRequests
from segadv.training import preflight, run_dir as rundir
from segadv.training.build import Training, build_training, log_placement, start_copies
from segadv.training.early_stop import EarlyStop
from segadv.training.run_data import RunData, build_data, run_state
from segadv.training.stopping import StopDecision

log = logging.getLogger("segadv.training.loop")  # the loop's lines, train.log's name for them


@dataclass(frozen=True)
class RunOptions:
    """How segadv-train was asked to run, besides the config (``train``'s keywords). ``resume``:
    "auto" or a checkpoint path; ``trusted``: checkpoints may hold more than tensors; ``stop_at``:
    stop (and checkpoint) after that step as a preempted run would; ``force``: start even if the
    run dir looks too small for the checkpoints the run keeps."""

    resume: str | None = None
    trusted: bool = False
    stop_at: int | None = None
    force: bool = False


@dataclass(frozen=True)
class RunSite:
    """Where this process runs: the run dir it holds, its rank and its devices."""

    run_dir: Path
    env: DistEnv
    device_map: DeviceMap


@dataclass
class Session:
    """What the loop runs with, built and entered by :func:`open_session`."""

    site: RunSite
    parts: Training  # the networks and the method (segadv/training/build.py)
    data: RunData  # the streams, the val loaders, the panel images
    checkpoints: CheckpointManager
    reporter: Reporter
    stop: StopDecision
    early_stop: EarlyStop  # train.early_stop's count, a checkpoint entry
    step: int  # the step the run starts at: 0, or the one resumed from


@contextmanager
def open_session(cfg: Config, site: RunSite, record: RunRecord, options: RunOptions,
                 start: preflight.Start | None = None, started: Callable[[], None] = lambda: None) -> Iterator[Session]:
    """The run set up in ``site`` (its run dir held, ``record`` its status.json) up to its first step.
    ``start``: what the start's checks established (None: checked here). ``started`` is called once
    the start is complete: a failure before it is a failed start (segadv/training/run_dir.py
    ``StartCleanup``), a signal before it unwinds the start (segadv/signals.py)."""
    log.info("run dir: %s; device map: %s", site.run_dir, site.device_map)
    parts = build_training(cfg, site.device_map, site.env, start.checked if start else None)
    data = build_data(cfg, parts, site.run_dir, start.catalog if start else None)
    initialise_weights(parts, options.trusted)
    log_placement(parts)
    clock = RunClock()  # the run's time, checkpointed, so that a resume continues it
    early_stop = EarlyStop(cfg.train.early_stop)
    checkpoints = CheckpointManager(site.run_dir, {**run_state(parts, data.streams, clock), "early_stop": early_stop},
                                    every=cfg.checkpoint.every, keep_last=cfg.checkpoint.keep_last,
                                    config=config_to_dict(cfg), env=site.env, best_by=cfg.checkpoint.best_by,
                                    keep_best=cfg.checkpoint.keep_best, read_back=cfg.train.smoke)
    step = start_checkpoints(cfg, checkpoints, options)
    guard = NonFiniteGuard(cfg.train.on_nonfinite, checkpoints, site.device_map.generator)
    with ExitStack() as stack:
        # resume_notes outside the Reporter too: a TensorBoard failure raised as it closes names the
        # checkpoint as well.
        stack.enter_context(resume_notes(checkpoints, user_errors=False))
        reporter = stack.enter_context(Reporter(cfg, parts, site.run_dir, record, guard, is_main=site.env.is_main,
                                                resume_step=step if options.resume else None,
                                                clock=clock))  # opening checks metrics.jsonl
        if site.env.is_main:
            rundir.save_config(cfg, site.run_dir)
        # The start is complete: from here a signal stops the run at a step boundary with a
        # checkpoint (exit 0); before, it unwound the start (segadv/signals.py).
        requests = stack.enter_context(StopRequests(watch_parent=distributed.launched_by_torchrun()))
        stack.enter_context(closing(data))
        stack.enter_context(resume_notes(checkpoints))
        started()
        stop = StopDecision(step, cfg.train.max_steps, requests, distributed.StepAgreement(), stop_at=options.stop_at)
        reporter.begin(step, checkpoints.best)
        yield Session(site, parts, data, checkpoints, reporter, stop, early_stop, step)


def start_checkpoints(cfg: Config, checkpoints: CheckpointManager, options: RunOptions) -> int:
    """The step the run starts at (0, or the one resumed from: the same on every rank), checked
    against ``train.max_steps`` and the room the run dir has for the checkpoints."""
    step = checkpoints.start(options.resume, options.trusted)
    distributed.check_ranks_agree({"the step resumed at": step},
                                  hint="every rank must see the same checkpoints: is the run dir on a file system "
                                       "all nodes share?")
    if checkpoints.last_complete is not None:  # resumed
        rundir.check_steps(step, cfg.train.max_steps, checkpoints.last_complete[0])
    checkpoints.check_room(cfg.train.max_steps, options.force)
    return step


def initialise_weights(parts: Training, trusted: bool) -> None:
    """``init.<role>``: each network starts from the given weights (strict unless excluded)."""
    for role, net in parts.members():
        source = role.settings.init
        if source is not None:
            load_weights(source.path, net.module, role=role.name, exclude=source.exclude, trusted=trusted)
    start_copies(parts)  # a role that starts as another's copy (the teacher, as G) after the init weights


@contextmanager
def resume_notes(checkpoints: CheckpointManager, user_errors: bool = True) -> Iterator[None]:
    """An error met after the run started, told with where the run can go on from: a failed write
    (metrics, TensorBoard), a signal that ends it at once, and (``user_errors``) bad data found
    mid-run."""
    try:
        yield
    except (WriteFailed, Interrupted) as err:
        err.after = err.after or checkpoints.resume_note()
        raise
    except (UserError, RuntimeError) as err:
        if not user_errors:
            raise
        noted = with_resume_note(err, checkpoints)
        if noted is err:
            raise
        raise noted from None


def with_resume_note(err: Exception, checkpoints: CheckpointManager) -> Exception:
    """A user error met after the run started (a sample that fails to read, a batch G cannot take)
    as one naming the last complete checkpoint; any other error as it is."""
    message = str(err) if isinstance(err, UserError) else input_shape_message(err)
    if message is None:
        return err
    return UserError(f"{message}; {checkpoints.resume_note()}")
