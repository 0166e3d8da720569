"""segadv-plan's report: the per-device table and JSON of a plan, and the table and JSON of the
settings --advise found."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable

from segadv.plan.fit import ALLOWANCE_TEXT, GiB, MAX_BATCH_LIMIT, MiB, allowance, need, peak_of_run, shortfalls

if TYPE_CHECKING:
    from segadv.plan.advise import Option
    from segadv.plan.dry_run import DevicePlan, Plan


def max_batch_text(batch: int) -> str:
    """The search stops at MAX_BATCH_LIMIT: a fit there is a lower bound."""
    return f"at least {batch} (the search's cap)" if batch >= MAX_BATCH_LIMIT else str(batch)


def plan_json(plan: Plan, budget: int | None, max_batch: int | None, searched: bool) -> dict[str, Any]:
    short = shortfalls(plan, budget)
    devices = {}
    for name, row in plan.devices.items():
        entry = {k: v for k, v in asdict(row).items() if k != "device" and v is not None}
        entry["allowance_bytes"] = allowance(name, peak_of_run(row))
        entry["need_bytes"] = need(name, row)
        entry["fits"] = name not in short
        devices[name] = entry
    out: dict[str, Any] = {
        "devices": devices,
        "transfer_bytes_per_iteration": plan.transfer_bytes_per_iteration,
        "host_to_device_bytes_per_iteration": plan.host_to_device_bytes_per_iteration,
        "fits": not short,
        "gpu_memory_bytes": budget,
        "steps": plan.steps,
        "steps_run": plan.steps_run,
        "world_size": plan.world_size,
    }
    if searched:
        out["max_batch"] = max_batch
        out["max_batch_is_lower_bound"] = bool(max_batch and max_batch >= MAX_BATCH_LIMIT)
    return out


def plan_table(plan: Plan, budget: int | None) -> str:
    short = shortfalls(plan, budget)
    unit, size = ("GiB", GiB) if max(r.peak_bytes for r in plan.devices.values()) >= GiB else ("MiB", MiB)

    def gib(n: int) -> str:
        return f"{n / size:.2f}"

    measured = any(row.measured_peak_bytes is not None for row in plan.devices.values())
    wrapped = any(row.wrapper_bytes for row in plan.devices.values())
    columns = ["device", "params", "grads", "optimizer", *(["wrapper"] if wrapped else []), "activations", "peak",
               "peak at step", "evaluation", "checkpoint", "+allowance", "need"]
    if measured:
        columns += ["measured peak", "allocator peak"]
    if budget is not None:
        columns.append(f"fits {budget / GiB:.2f} GiB")
    rows = []
    for name, row in plan.devices.items():
        extra = allowance(name, peak_of_run(row))
        extra_cells = [_measured(row.measured_peak_bytes, row, gib), _measured(row.allocator_peak_bytes, row, gib)]
        cells = [name, gib(row.params_bytes), gib(row.grads_bytes), gib(row.optimizer_bytes),
                 *([gib(row.wrapper_bytes)] if wrapped else []), gib(row.activations_bytes), gib(row.peak_bytes),
                 "build" if row.peak_step is None else str(row.peak_step), gib(row.evaluation_peak_bytes),
                 gib(row.checkpoint_peak_bytes), gib(extra), gib(need(name, row))]
        if measured:
            cells += extra_cells
        if budget is not None:
            cells.append("no" if name in short else "yes" if name.startswith("cuda") else "(host)")
        rows.append(cells)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(columns, widths)))]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.append(f"{unit}; each column its own largest over the iterations, peak the most live at once "
                 "(tensor bytes, as torch.cuda.max_memory_allocated counts them); evaluation: the most live during "
                 "an evaluation (G at data.val_batch_size, the panels); checkpoint: during a save and a resume's "
                 "load; need: the largest of the three + allowance")
    if plan.world_size > 1:
        lines.append(f"one rank of {plan.world_size} processes: params, grads and optimizer are the rank's (FSDP: "
                     "its dim-0 shards)" + ("; wrapper: what FSDP holds in flight (gathered units, a unit's "
                     "unsharded gradients) and DDP's gradient buckets, in the peaks" if wrapped else ""))
        for name, row in plan.devices.items():
            for role, net in row.networks.items():
                lines.append(f"  {name} {role} ({net['mode']}): params {gib(net['params_bytes'])}, grads "
                             f"{gib(net['grads_bytes'])}, optimizer {gib(net['optimizer_bytes'])}, in flight "
                             f"{gib(net['in_flight_bytes'])} (unsharded: {gib(net['unsharded_params_bytes'])}, "
                             f"{gib(net['unsharded_grads_bytes'])}, {gib(net['unsharded_optimizer_bytes'])})")
    lines.append(ALLOWANCE_TEXT)
    lines.append(f"between devices per iteration: {plan.transfer_bytes_per_iteration / MiB:.1f} MiB; "
                 f"host to devices: {plan.host_to_device_bytes_per_iteration / MiB:.1f} MiB")
    carrying = [f"{name} {row.gradient_images_per_iteration} ({row.gradient_batches_per_iteration:g} labeled batches)"
                for name, row in plan.devices.items() if row.gradient_images_per_iteration]
    if carrying:
        lines.append(f"images through G with a gradient per iteration: {', '.join(carrying)}")
    lines.extend(f"note: {note}" for note in plan.notes)
    return "\n".join(lines)


def _measured(value: int | None, row: DevicePlan, fmt: Callable[[int], str]) -> str:
    if value is None:
        return "-"
    return f"{fmt(value)} ({(value - row.peak_bytes) / row.peak_bytes:+.1%})" if row.peak_bytes else fmt(value)


def option_json(option: Option) -> dict[str, Any]:
    return {
        "device_map": option.device_map,
        "overrides": option.overrides,
        "flops_per_iteration": option.flops,
        "transfer_bytes_per_iteration": option.plan.transfer_bytes_per_iteration,
        "devices": {name: {"peak_bytes": peak_of_run(row), "need_bytes": need(name, row),
                           "flops_per_iteration": row.flops_per_iteration}
                    for name, row in option.plan.devices.items()},
    }


def advice_table(options: list[Option], gpus: int, budget: int) -> str:
    lines = [f"settings that fit {gpus} GPU(s) of {budget / GiB:.2f} GiB, best first (compute per iteration, "
             "then bytes between devices):"]
    for rank, option in enumerate(options, 1):
        needs = ", ".join(f"{name} {need(name, row) / GiB:.2f} GiB" for name, row in option.plan.devices.items()
                          if name.startswith("cuda"))
        lines.append(f"{rank}. --device-map {option.device_map} {' '.join(option.overrides)}\n"
                     f"   {option.flops / 1e9:.1f} GFLOP per iteration, "
                     f"{option.plan.transfer_bytes_per_iteration / MiB:.1f} MiB between devices; need: {needs}")
    if not options:
        lines.append("none")
    lines.append(ALLOWANCE_TEXT)
    return "\n".join(lines)
