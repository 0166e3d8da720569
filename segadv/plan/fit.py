"""Whether a plan fits: each CUDA device's need (the run's peak plus an allowance for what a
tensor count cannot see) against a budget, and the search for the largest batch that fits.
The dry runs import torch when they run; this module imports none."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from segadv.config import Config
from segadv.data.batch_checks import BatchTooSmall

if TYPE_CHECKING:
    from segadv.plan.advise import Option
    from segadv.plan.dry_run import DevicePlan, Plan

log = logging.getLogger("segadv.plan")

GiB, MiB = 2**30, 2**20
# What a tensor count cannot see on a CUDA device (an assumption, stated beside every plan): the
# CUDA context with cuBLAS/cuDNN handles and a cuDNN workspace, and the caching allocator's
# block rounding and fragmentation over the counted peak.
CONTEXT_BYTES = 768 * MiB
ALLOCATOR_OVERHEAD = 0.10
ALLOWANCE_TEXT = (f"allowance per CUDA device (assumed, not measured): {CONTEXT_BYTES // MiB} MiB for the CUDA "
                  f"context, library handles and cuDNN workspace + {ALLOCATOR_OVERHEAD:.0%} of the largest of the "
                  "training, evaluation and checkpoint peaks for the caching allocator's rounding and fragmentation")
MAX_BATCH_LIMIT = 4096


def allowance(device: str, peak: int) -> int:
    return CONTEXT_BYTES + int(ALLOCATOR_OVERHEAD * peak) if device.startswith("cuda") else 0


def peak_of_run(row: DevicePlan) -> int:
    """The most live at once over the run: the iterations', the evaluation's or a save's and
    resume's, whichever is most."""
    return max(row.peak_bytes, row.evaluation_peak_bytes, row.checkpoint_peak_bytes)


def need(name: str, row: DevicePlan) -> int:
    return peak_of_run(row) + allowance(name, peak_of_run(row))


def shortfalls(plan: Plan, budget: int | None) -> dict[str, int]:
    """Bytes by which each CUDA device misses ``budget`` (none: it fits). The host is not budgeted."""
    if budget is None:
        return {}
    short = {}
    for name, row in plan.devices.items():
        if name.startswith("cuda") and need(name, row) > budget:
            short[name] = need(name, row) - budget
    return short


def with_batch(cfg: Config, batch_size: int) -> Config:
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"batch_size": batch_size})})


def largest_batch(cfg: Config, steps: int, budget: int, world_size: int = 1) -> tuple[int | None, Plan | None]:
    """The largest ``data.batch_size`` whose dry run fits every device, and its plan (None, None
    when none fits; a batch too small to train, e.g. one sample through BatchNorm, does not fit).

    A device's need grows affinely with the batch, so each next probe is where the line through
    the two probes nearest the budget meets it (kept strictly between the largest fit and the
    smallest miss known; bisection while fewer than two probes trained or where the line leaves that
    bracket), and the search ends when
    those are neighbours or the fit reaches ``MAX_BATCH_LIMIT``. With ``train.accumulation_steps``
    K, the batches searched are multiples of K (the search counts in K-sample units)."""
    from segadv.plan.dry_run import IterationFails, dry_run

    unit = cfg.train.accumulation_steps
    plans: dict[int, Plan] = {}
    excess: dict[int, int] = {}
    untrainable: set[int] = set()

    def probe(batch: int) -> None:
        try:
            plans[batch] = dry_run(with_batch(cfg, batch * unit), steps, world_size)
        except (IterationFails, BatchTooSmall) as err:
            if batch * unit >= cfg.data.batch_size:
                raise
            log.info("batch %d: does not train (%s)", batch * unit, str(err).splitlines()[0])
            untrainable.add(batch)
            excess[batch] = 1  # a miss for the bounds; the line fit below leaves it out
            return
        excess[batch] = max((need(name, row) - budget
                             for name, row in plans[batch].devices.items() if name.startswith("cuda")), default=-1)
        log.info("batch %d: %s", batch * unit, "fits" if excess[batch] <= 0 else f"{excess[batch] / GiB:.2f} GiB over")

    first = cfg.data.batch_size // unit
    limit = MAX_BATCH_LIMIT // unit
    probe(first)
    probe(first * 2 if excess[first] <= 0 else max(first // 2, 1))
    while True:
        fit = max((b for b, e in excess.items() if e <= 0), default=0)
        miss = min((b for b, e in excess.items() if e > 0), default=None)
        if miss is not None and miss == fit + 1 or fit >= limit:
            return (fit * unit, plans[fit]) if fit else (None, None)
        trained = sorted((b for b in excess if b not in untrainable), key=lambda n: abs(excess[n]))
        upper = limit + 1 if miss is None else miss
        guess = fit * 2 if miss is None else (fit + miss) // 2
        if len(trained) >= 2:
            a, b = trained[:2]  # the two probes nearest the budget
            slope = (excess[b] - excess[a]) / (b - a)
            if slope > 0:
                guess = int(a - excess[a] / slope)
        if miss is not None and not fit < guess < miss:
            # The line leaves the bracket: the need is not affine there (an evaluation's peak, which
            # the batch does not move, sets it at small batches; with accumulation up to large ones).
            guess = (fit + miss) // 2
        probe(min(max(guess, fit + 1), upper - 1))


def fitting_options(config: str | None, overrides: list[str], gpus: int, budget: int, steps: int) -> list[Option]:
    """The settings that fit ``gpus`` GPUs of ``budget`` bytes each, best first (segadv/plan/advise.py)."""
    from segadv.plan.advise import advise

    # The dry runs' own build logs, once per setting tried, would drown the advice.
    quiet, saved = logging.getLogger("segadv"), logging.getLogger("segadv").level
    quiet.setLevel(logging.WARNING)
    try:
        return advise(config, overrides, gpus, lambda plan: not shortfalls(plan, budget), steps)
    finally:
        quiet.setLevel(saved)
