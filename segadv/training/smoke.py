"""``train.smoke``: a smoke run, Lightning's ``fast_dev_run`` for segadv-train.

A smoke run is the run its config describes, cut short to what shows that it runs: everything a
start builds and checks (the trackers' packages, the method, the networks, the data with its
checks and survey), :data:`SMOKE_STEPS` optimizer steps of the method's own iteration (backward,
optimizer step, each step logged: the losses read and checked for non-finite values), one
evaluation at the end on at most :data:`SMOKE_VAL_BATCHES` val batches per rank (with the panels
and label-free scores a run's evaluation draws), then a checkpoint saved and read back into the run
as a resume restores one (``CheckpointManager(read_back=True)``: its integrity, its config, every
state strictly).

Nothing is kept: it runs in a throwaway run dir (``run_dir.throwaway_run_dir``), removed at its
end whatever the end, so the run dir the config names is neither made nor read, and a smoke run
on a run's dir leaves every file of it as it was. W&B and MLflow stay off, as Lightning's
``fast_dev_run`` turns its loggers off: their runs live outside the run dir. What every start
shares outside a run (downloaded weights, the mask survey's cache) is kept as any start keeps it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from segadv.config import Config
from segadv.errors import UserError

SMOKE_STEPS = 2  # two, so that an optimizer steps from the state its first step left
SMOKE_VAL_BATCHES = 2


def check_smoke(cfg: Config, resume: Optional[str]) -> None:
    """What a smoke run refuses before anything is made: a resume (it starts fresh and keeps
    nothing), and a tracker the config turns on without its package (a run of it would fail to
    start, though the smoke run logs to none)."""
    from segadv.monitor.trackers import check_installed

    if resume is not None:
        raise UserError("train.smoke: a smoke run starts fresh and keeps nothing, so it continues no run: leave out "
                        "--resume (or train.smoke)")
    check_installed(cfg.log)


def smoke_config(cfg: Config, run_dir: Path) -> Config:
    """The config a smoke run trains: ``cfg`` in ``run_dir`` (the throwaway one), cut to
    :data:`SMOKE_STEPS` steps, each logged, one evaluation (at the end), one checkpoint (last.pt at
    the end, best.pt at the evaluation; no step_<N>.pt), and no tracker outside the run dir."""
    smoke = cfg.model_copy(deep=True)
    smoke.run_dir = str(run_dir)
    smoke.train.max_steps = SMOKE_STEPS
    smoke.train.eval_every = SMOKE_STEPS
    smoke.train.log_every = 1
    smoke.checkpoint.every = SMOKE_STEPS + 1  # the end's checkpoint only: it writes last.pt alone
    smoke.log.wandb.enabled = False
    smoke.log.mlflow.enabled = False
    return smoke


def val_samples(cfg: Config, world_size: int) -> Optional[int]:
    """How many val samples an evaluation of ``cfg``'s run scores: a smoke run's first
    :data:`SMOKE_VAL_BATCHES` batches on each rank; None (all) for any other run."""
    return SMOKE_VAL_BATCHES * cfg.data.val_batch_size * world_size if cfg.train.smoke else None


def outcome_line(result: Any) -> str:
    """What a smoke run that returned says (``result``: its ``TrainResult``)."""
    if result.stopped_by:
        return f"smoke run: stopped ({result.stopped_by}) at step {result.step}; nothing kept"
    return (f"smoke run: {result.step} steps and one evaluation (val mIoU {result.val_metrics.get('mIoU', float('nan')):.4f} "
            f"on at most {SMOKE_VAL_BATCHES} val batches) passed, and a checkpoint saved and read back; nothing kept")
