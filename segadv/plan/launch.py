"""segadv-plan --advise --world-size N: how to train on N GPUs of a given memory, each way planned.

The ways to place G when it outgrows a card, and what each costs:

- **ddp**: N processes, a whole G (and teacher, D, their AdamW state) on every card, and DDP's
  buckets; one all-reduce of the gradients a step. On one card: the run as it is.
- **fsdp**: N processes, G's parameters, gradients and AdamW state sharded over them (the teacher
  like its student, D under DDP), two gathered units and a unit's gradients in flight; about 1.5
  times DDP's traffic (all-gathers in the forward and the backward, a reduce-scatter).
- **split**: G's blocks over two cards (``g:0/1``, the rest on the second): one card waits while the
  other computes; N // 2 processes under DDP where that is 2 or more, else one process.

each without and with activation checkpointing (about one more forward of G a step) and without and
with ``model.generator.freeze_encoder`` (a different training: the head and D train, the encoder
stays as loaded, Meta's protocol for DINOv3). Ranked best first: what fits before what does not;
among those, a trained encoder before a frozen one (freezing changes what is trained), no split
before the split (a card idle half the time), no recompute before checkpointing (about a third more
compute), DDP before FSDP (less traffic).

Four dry runs on one card and four split (checkpointing x frozen encoder) give every strategy and
every N: the rank's iteration is the same whatever the wrapper, which sharding.py accounts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from segadv.config import Config
from segadv.config.roles import role as role_spec
from segadv.data.batch_checks import BatchTooSmall
from segadv.errors import UserError
from segadv.plan.dry_run import IterationFails, Plan, dry_run
from segadv.plan.fit import GiB, need
from segadv.plan.sharding import rank_plan
from segadv.training.checks import run_role_names

log = logging.getLogger("segadv.plan")

ONE_CARD, SPLIT = "g:0,d:0", "g:0/1,d:1"
STRATEGIES = ("ddp", "fsdp", "split")
COST = {
    "ddp": "a whole copy of every network and its AdamW state on each card, DDP's buckets a copy of the "
           "gradients; one all-reduce a step",
    "fsdp": "G's (and the teacher's) parameters, gradients and AdamW state 1/N a card, two gathered units "
            "and a unit's gradients in flight; about 1.5x DDP's traffic",
    "split": "G's blocks over two cards, one idle while the other computes",
}


@dataclass
class LaunchOption:
    strategy: str
    checkpointing: bool
    frozen: bool
    cards: int
    processes: int
    device_map: str
    plan: Optional[Plan]  # None: the setting does not train (a micro-batch BatchNorm refuses) or does not apply
    budget: int
    fits: bool = False
    why: str = ""
    needs: dict[str, int] = field(default_factory=dict)

    @property
    def overrides(self) -> list[str]:
        return [*variant_overrides(self.checkpointing, self.frozen), *self.parallel_overrides]

    @property
    def parallel_overrides(self) -> list[str]:
        if self.processes == 1:
            return []
        g = "fsdp" if self.strategy == "fsdp" else "ddp"
        return [f"parallel.generator={g}"]

    def rank(self) -> tuple[bool, bool, bool, bool, bool]:
        return (not self.fits, self.frozen, self.strategy == "split", self.checkpointing, self.strategy == "fsdp")

    @property
    def label(self) -> str:
        extra = [*(["activation checkpointing"] if self.checkpointing else []),
                 *(["frozen encoder"] if self.frozen else [])]
        processes = f"{self.processes} process{'es' if self.processes > 1 else ''}"
        name = "one card" if self.strategy == "ddp" and self.cards == 1 else self.strategy
        return f"{name} ({processes}, --device-map {self.device_map}{', ' if extra else ''}{', '.join(extra)})"


def variant_overrides(checkpointing: bool, frozen: bool) -> list[str]:
    return [f"model.generator.activation_checkpointing={str(checkpointing).lower()}",
            f"model.generator.freeze_encoder={str(frozen).lower()}"]


Variants = dict[tuple[str, bool, bool], "Plan | str"]


def variant_plans(config: Callable[[list[str]], Config], steps: int,
                  maps: tuple[str, ...] = (ONE_CARD, SPLIT)) -> Variants:
    """The unwrapped rank's dry run of each map x checkpointing x frozen encoder, or why there is
    none: it does not train at this batch, or G cannot be split (its arch has no ``split``)."""
    plans: Variants = {}
    for device_map in maps:
        for checkpointing in (False, True):
            for frozen in (False, True):
                cfg = config([*variant_overrides(checkpointing, frozen)])
                cfg.device_map = device_map
                try:
                    plans[device_map, checkpointing, frozen] = dry_run(cfg, steps)
                except (IterationFails, BatchTooSmall) as err:
                    plans[device_map, checkpointing, frozen] = f"does not train: {str(err).splitlines()[0]}"
                except UserError as err:
                    if device_map != SPLIT or "cannot be split" not in str(err):
                        raise
                    plans[device_map, checkpointing, frozen] = \
                        f"{cfg.model.generator.arch} cannot be split over two cards (its network has no split())"
                if isinstance(plans[device_map, checkpointing, frozen], str):
                    log.info("%s %s: %s", device_map, " ".join(variant_overrides(checkpointing, frozen)),
                             plans[device_map, checkpointing, frozen])
    return plans


def launch_modes(cfg: Config, strategy: str, processes: int) -> dict[str, str]:
    """Each network's wrapper on a rank: none in one process; under a launch D (and any other
    trained network) under DDP, G under FSDP or DDP, the teacher sharded like an FSDP student."""
    if processes == 1:
        return {}
    modes = {}
    for name in run_role_names(cfg):
        spec = role_spec(name)
        if spec.trained:
            modes[name] = "fsdp" if strategy == "fsdp" and name == "generator" else "ddp"
    for name in run_role_names(cfg):
        starts_as = role_spec(name).starts_as
        if name not in modes:
            modes[name] = "fsdp" if starts_as is not None and modes.get(starts_as) == "fsdp" else "none"
    return modes


def gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def judged(option: LaunchOption) -> LaunchOption:
    """Whether each card's need fits the budget, and why (or why not) in a line."""
    plan = option.plan
    if plan is None:
        return option  # why: the dry run's reason (variant_plans)
    option.needs = {name: need(name, row) for name, row in plan.devices.items() if name.startswith("cuda")}
    worst = max(option.needs, key=option.needs.get)
    row = plan.devices[worst]
    state = row.params_bytes + row.grads_bytes + row.optimizer_bytes
    parts = (f"{worst} needs {gib(option.needs[worst])} GiB: state {gib(state)} (params {gib(row.params_bytes)}, "
             f"grads {gib(row.grads_bytes)}, optimizer {gib(row.optimizer_bytes)})"
             + (f", wrapper {gib(row.wrapper_bytes)}" if row.wrapper_bytes else "")
             + f", peak {gib(max(row.peak_bytes, row.evaluation_peak_bytes, row.checkpoint_peak_bytes))}")
    option.fits = option.needs[worst] <= option.budget
    verdict = "fits" if option.fits else f"does not fit {gib(option.budget)} GiB by {gib(option.needs[worst] - option.budget)} GiB"
    option.why = f"{verdict}: {parts}; {COST[option.strategy] if option.processes > 1 or option.strategy == 'split' else 'no wrapper'}"
    return option


def launch_options(cfg: Config, plans: Variants, cards: int, budget: int) -> list[LaunchOption]:
    """Every strategy x checkpointing x frozen encoder on ``cards`` GPUs of ``budget`` bytes, each
    judged, best first (``LaunchOption.rank``)."""
    options = []
    for strategy in STRATEGIES:
        if strategy == "fsdp" and cards < 2 or strategy == "split" and cards < 2:
            continue
        device_map = SPLIT if strategy == "split" else ONE_CARD
        processes = cards // 2 if strategy == "split" else cards
        processes = processes if processes >= 2 else 1
        for checkpointing in (False, True):
            for frozen in (False, True):
                base = plans.get((device_map, checkpointing, frozen), "not planned")
                plan = None
                if not isinstance(base, str):
                    modes = launch_modes(cfg, strategy, processes)
                    plan = rank_plan(base, processes, modes) if processes > 1 else base
                option = LaunchOption(strategy, checkpointing, frozen, cards, processes, device_map, plan, budget,
                                      why=base if isinstance(base, str) else "")
                options.append(judged(option))
    return sorted(options, key=LaunchOption.rank)


def advise_launch(config: Callable[[list[str]], Config], cards: int, budget: int, steps: int) -> list[LaunchOption]:
    """--advise --world-size N: each strategy planned and judged for ``cards`` GPUs, best first."""
    cfg = config([])
    if cards < 1:
        raise UserError(f"--world-size: the GPUs (one process each), at least 1, got {cards}")
    maps = (ONE_CARD, SPLIT) if cards >= 2 else (ONE_CARD,)
    return launch_options(cfg, variant_plans(config, steps, maps), cards, budget)


def launch_table(options: list[LaunchOption], cards: int, budget: int) -> str:
    lines = [f"ways to train on {cards} GPU(s) of {gib(budget)} GiB, best first (fits; then a trained encoder before "
             "a frozen one, no split before the split, no recompute before checkpointing, DDP before FSDP):"]
    for rank, option in enumerate(options, 1):
        mark = "yes" if option.fits else "no "
        lines.append(f"{rank:2d}. [{mark}] {option.label}\n    {' '.join(option.overrides) or '(as configured)'}\n"
                     f"    {option.why}")
    return "\n".join(lines)


def launch_json(options: list[LaunchOption], cards: int, budget: int) -> dict[str, object]:
    return {"world_size": cards, "gpu_memory_bytes": budget, "options": [
        {"strategy": option.strategy, "activation_checkpointing": option.checkpointing,
         "freeze_encoder": option.frozen, "processes": option.processes, "device_map": option.device_map,
         "overrides": option.overrides, "fits": option.fits, "why": option.why, "need_bytes": option.needs}
        for option in options]}
