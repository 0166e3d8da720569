"""segadv-plan --advise: the settings that fit N GPUs of a given memory, found by planning them.

Every option is a dry run of exactly its settings (segadv/plan/dry_run.py), so each one fits when
planned on its own. Searched, for each device map over the GPUs (both networks on one; G on a
GPU of its own, D and an aux D on another) and each per-network dtype (float32 or bfloat16 for G
and for D): the least costly memory setting that fits, in the order of their compute: without
activation checkpointing, then with it (its recompute costs FLOPs), each with the fewest
micro-batches (``train.accumulation_steps``, a divisor of every stream's batch leaving at least 2
samples per micro-batch: the batch is kept). A device's need grows with the micro-batch, so the
fewest micro-batches that fit are found by bisection; a combination whose most saving setting
(checkpointing, the most micro-batches) does not fit is left after that one plan.

Options are ranked by compute per iteration (FLOPs counted on the stand-ins, recompute included),
then by bytes between devices, then by fewer micro-batches and fewer networks in bfloat16.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional

from segadv.config import Config, load_config
from segadv.data.batch_checks import BatchTooSmall
from segadv.methods import method_class
from segadv.plan.dry_run import IterationFails, Plan, dry_run
from segadv.training.checks import trains_on_one_sample

log = logging.getLogger("segadv.plan")

DTYPES = ("float32", "bfloat16")


@dataclass
class Option:
    device_map: str
    overrides: list[str]
    plan: Plan
    accumulation_steps: int
    reduced_precision: int  # networks in bfloat16

    @property
    def flops(self) -> int:
        return sum(row.flops_per_iteration for row in self.plan.devices.values())

    def rank(self) -> tuple[int, int, int, int]:
        return self.flops, self.plan.transfer_bytes_per_iteration, self.accumulation_steps, self.reduced_precision


def device_maps(gpus: int, teacher: bool = False) -> list[str]:
    """Both networks on one GPU; with two or more, G on a GPU of its own (D's, and an aux D's, the
    other), and with a mean teacher each place for it: with G (its default) or with D (``t:0``)."""
    maps = ["g:0,d:0"] + (["g:1,d:0"] if gpus >= 2 else [])
    if teacher and gpus >= 2:
        maps.append("g:1,d:0,t:0")
    return maps


def accumulation_choices(cfg: Config) -> list[int]:
    """Micro-batch counts that keep every stream's batch whole and at least 2 samples per micro-batch
    where G cannot train on one (BatchNorm on batch statistics over a 1x1 map: the ASPP pooling's, or
    the deepest map of small training images: the start's own rule)."""
    sizes = [cfg.data.batch_size, *method_class(cfg.method.name).stream_batch_sizes(cfg).values()]
    common = math.gcd(*sizes)
    least = 1 if trains_on_one_sample(cfg) else 2
    return [k for k in range(1, common + 1) if common % k == 0 and (k == 1 or min(sizes) // k >= least)]


def precision_overrides(g_dtype: str, d_dtype: str) -> list[str]:
    out = []
    for network, dtype in (("generator", g_dtype), ("discriminator", d_dtype)):
        out.append(f"amp.{network}.enabled={str(dtype != 'float32').lower()}")
        if dtype != "float32":
            out.append(f"amp.{network}.dtype={dtype}")
    return out


def memory_overrides(checkpointing: bool, accumulation_steps: int) -> list[str]:
    return [f"model.generator.activation_checkpointing={str(checkpointing).lower()}",
            f"train.accumulation_steps={accumulation_steps}"]


def planned(config: Callable[[list[str]], Config], device_map: str, overrides: list[str], steps: int) -> Optional[Plan]:
    """The plan of ``overrides`` on ``device_map``; None where the iteration cannot train (a micro-batch
    BatchNorm refuses)."""
    cfg = config(overrides)
    cfg.device_map = device_map
    try:
        return dry_run(cfg, steps)
    except (IterationFails, BatchTooSmall) as err:
        log.info("%s %s: does not train (%s)", device_map, " ".join(overrides), str(err).splitlines()[0])
        return None


def advise(config_file: Optional[str], base_overrides: list[str], gpus: int, fits: Callable[[Plan], bool],
           steps: int) -> list[Option]:
    """The options that fit, best first. ``fits``: whether a plan fits every GPU's budget."""
    def config(extra: list[str]) -> Config:
        return load_config(config_file, [*base_overrides, *extra])

    choices = accumulation_choices(config([]))
    options = []
    teacher = "teacher" in method_class(config([]).method.name).networks(config([]))
    for device_map in device_maps(gpus, teacher):
        for g_dtype in DTYPES:
            for d_dtype in DTYPES:
                precision = precision_overrides(g_dtype, d_dtype)
                option = least_costly_fit(config, device_map, precision, choices, fits, steps)
                if option is None:
                    log.info("%s, G %s, D %s: nothing fits", device_map, g_dtype, d_dtype)
                    continue
                option.reduced_precision = [g_dtype, d_dtype].count("bfloat16")
                options.append(option)
    return sorted(options, key=Option.rank)


def least_costly_fit(config: Callable[[list[str]], Config], device_map: str, precision: list[str],
                     choices: list[int], fits: Callable[[Plan], bool], steps: int) -> Optional[Option]:
    """The least costly memory setting that fits: the whole batch without checkpointing; else, if
    the most saving one (checkpointing, the most micro-batches) fits at all, the fewest
    micro-batches without checkpointing, then with it (bisection over ``choices``: the need falls
    as the micro-batch shrinks)."""
    plans: dict[tuple[bool, int], Optional[Plan]] = {}

    def fitting(checkpointing: bool, k: int) -> bool:
        if (checkpointing, k) not in plans:
            plans[checkpointing, k] = planned(config, device_map, [*precision, *memory_overrides(checkpointing, k)],
                                              steps)
        plan = plans[checkpointing, k]
        return plan is not None and fits(plan)

    def option(checkpointing: bool, k: int) -> Option:
        return Option(device_map, [*precision, *memory_overrides(checkpointing, k)], plans[checkpointing, k], k, 0)

    if fitting(False, choices[0]):
        return option(False, choices[0])
    if not fitting(True, choices[-1]):
        return None
    for checkpointing in (False, True):
        if not fitting(checkpointing, choices[-1]):
            continue
        low, high = 0, len(choices) - 1  # choices[high] fits; the first that does
        while low < high:
            middle = (low + high) // 2
            if fitting(checkpointing, choices[middle]):
                high = middle
            else:
                low = middle + 1
        return option(checkpointing, choices[high])
    return None
