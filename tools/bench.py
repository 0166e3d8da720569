#!/usr/bin/env python
"""Time segadv's training step against a bare hand-written loop, in the same process.

Both sides run the same arithmetic (G's CE + adversarial update with D frozen, then D's update)
on the same networks and the same pre-loaded batches, so data loading is out of the picture.
segadv's side is the loop body of ``segadv.training.loop``: the step (with its phase timer), the on-device
loss averaging, the data-wait timer and the log-interval read-out. The two sides alternate in
rounds and the median round is kept, which cancels most of the drift of a noisy machine.

Then segadv's step under variants, again alternating rounds: float32 / bfloat16 / float16 autocast
per network, channels_last on, G's activation checkpointing, two micro-batches per step
(``train.accumulation_steps=2``), and on CUDA ``g:cuda:0,d:cuda:0`` vs ``g:cuda:0,d:cpu`` (the cost
of a cross-device hop). With ``--compile``, segadv's step with ``compile.generator``,
``compile.discriminator`` and both, against the eager step and the bare loop in the same rounds,
and the compilation's own seconds (minutes on a CPU: not part of the default run). Last, the
cost of the stop agreement that DDP runs make every step
(``StepAgreement``: a gloo all-reduce of one flag, collected a step later), in two processes on
this machine: call after call (the whole round trip, an upper bound, and its share of segadv's
step) and a step apart with the host idle in between (as during a GPU step).

    python tools/bench.py [--config FILE] [--steps N] [--rounds R] [--no-variants] [--compile] [key=value ...]

A repository tool, not part of the installed package: it measures this checkout (``make bench``),
so a wheel does not ship it (docs/performance.md).

Prints one figure per line, ``name value [unit] [# note]``: ``ratio`` (segadv / bare throughput,
1.0 = no overhead), ``breakdown/<phase>/ms_per_step`` (segadv's step by phase) and per variant
``<variant>/ms_per_step`` and ``<variant>/speedup`` (vs float32), ``stop_agreement/us_per_call``,
``stop_agreement/us_per_step`` and ``stop_agreement/share_of_step``; with ``--compile``,
``compile/bare/ms_per_step``, ``compile/<networks>/ms_per_step``, ``/speedup`` (vs segadv eager),
``/vs_bare`` (vs the bare eager loop) and ``/compile_s`` (the first steps' time beyond as many
timed steps).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from segadv.training.build import build_training
from segadv.cli.args import add_config_arguments
from segadv.config import load_config
from segadv.data import build_dataloaders
from segadv.engine.losses import masked_bce_with_logits, one_hot_labels
from segadv.errors import cli_entry
from segadv.methods import method_class
from segadv.monitor.meters import LossAverager, StepTimer
from segadv.monitor.profile import STEP_PHASES
from segadv.parallel import activate, distributed, parse_device_map
from segadv.training.process import setup_logging

log = logging.getLogger("segadv.bench")


def make_bare_step(parts, num_classes: int, ignore_index: int, lambda_adv: float):
    """The loop people write by hand: no wrappers, no AMP helpers, no meters. Each network's forward
    runs under the autocast segadv resolved for it (``amp.<network>``, ``auto`` included), so both
    sides compute in the same precision; fp16's loss scaling is segadv's alone."""
    G, D = parts.g.module, parts.d.module
    g_dev, d_dev = parts.g.device, parts.d.device
    opt_g, opt_d = parts.g.opt.optimizer, parts.d.opt.optimizer
    sched_g, sched_d = parts.g.opt.scheduler, parts.d.opt.scheduler
    g_cast, d_cast = parts.g.opt.autocast, parts.d.opt.autocast

    def step(images, labels):
        images, labels = images.to(g_dev), labels.to(g_dev)
        labels_d = labels.to(d_dev)
        valid = labels_d != ignore_index
        for p in D.parameters():
            p.requires_grad_(False)
        with g_cast():
            logits = G(images)
            loss_seg = F.cross_entropy(logits.float(), labels, ignore_index=ignore_index)
            probs = logits.float().softmax(dim=1).to(d_dev)
        with d_cast():
            loss_adv = masked_bce_with_logits(D(probs).float(), 1.0, valid)
        (loss_seg + lambda_adv * loss_adv.to(g_dev)).backward()
        opt_g.step()
        opt_g.zero_grad(set_to_none=True)
        sched_g.step()
        for p in D.parameters():
            p.requires_grad_(True)
        real = one_hot_labels(labels_d, num_classes, valid)
        with d_cast():
            fake_logits, real_logits = D(torch.cat([probs.detach(), real])).float().chunk(2)
        loss_d = masked_bce_with_logits(fake_logits, 0.0, valid) + masked_bce_with_logits(real_logits, 1.0, valid)
        loss_d.backward()
        opt_d.step()
        opt_d.zero_grad(set_to_none=True)
        sched_d.step()
        return loss_seg

    return step


def sync(device_map) -> None:
    for device in device_map.devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def bench_config(args: argparse.Namespace, *overrides: str):
    cfg = load_config(args.config, [*args.overrides, *overrides])
    if args.device_map:
        cfg.device_map = args.device_map
    # The step both sides run is the supervised method's (any other method in the config is ignored).
    cfg.method.name = "supervised"
    # The adversarial term is on from the first step, so both sides do all of the work.
    cfg.loss.adv_warmup_steps = 0
    # The weight as the supervised method reads it (null: its default), never 0; set explicitly, as
    # both sides read it.
    cfg.loss.lambda_adv = method_class("supervised").adversarial_weight(cfg) or 0.01
    return cfg


def segadv_runner(parts, batches, log_every: int):
    """segadv's loop body (step, on-device loss averaging, data timer, log-interval read-out);
    returns a function timing ``n`` steps (seconds per step)."""
    device_map = parts.device_map

    def run(n: int) -> float:
        losses, timer = LossAverager(), StepTimer()
        sync(device_map)
        t0 = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            images, labels = batches[i % len(batches)]
            timer.add_data_wait(time.perf_counter() - t)
            losses.update(parts.step({"labeled": OneBatch(images, labels)}, step=i))
            if (i + 1) % log_every == 0:
                losses.pop_means(), timer.pop(), parts.g.opt.loss_scale(), parts.d.opt.loss_scale()
                parts.phases.resolve()
        losses.pop_means() if n % log_every else None
        sync(device_map)
        return (time.perf_counter() - t0) / n

    return run


class OneBatch:
    """A stream that hands out one batch (the loop's ``Stream.next()``)."""

    def __init__(self, images, labels) -> None:
        self.batch = (images, labels)

    def next(self):
        return self.batch


def alternate(runners: dict[str, object], rounds: int, steps: int, warmup: int) -> dict[str, float]:
    """Median seconds per step of each runner over ``rounds`` rounds, the order rotating each
    round so a drifting machine favours none."""
    for run in runners.values():
        if warmup:
            run(warmup)
    times: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(runners[name](steps))
    return {name: statistics.median(values) for name, values in times.items()}


def machine_line(device_map) -> str:
    """What the ratios were measured on: torch, and the CPU's ISA as torch's kernels and oneDNN's
    see it (a capped ``ONEDNN_MAX_CPU_ISA`` changes the convolutions' kernels and bf16's speed), or
    the CUDA cards of the map."""
    from segadv.engine.amp_optimizer import cpu_bf16_features, onednn_isa_cap

    cap = onednn_isa_cap()
    cpu = (f"CPU capability {torch.backends.cpu.get_cpu_capability()}, oneDNN "
           f"{'capped at ' + cap if cap else 'uncapped'}, native bf16: {', '.join(cpu_bf16_features()) or 'none'}")
    cards = sorted({torch.cuda.get_device_name(d) for d in device_map.devices if d.type == "cuda"})
    return f"torch {torch.__version__}; {cpu}" + (f"; {', '.join(cards)}" if cards else "")


def figure(name: str, value: float, unit: str = "", note: str = "") -> None:
    """One figure per line: ``name value [unit] [# note]`` (read by scripts)."""
    print(f"{name:<34} {value:10.4g} {unit}{'  # ' + note if note else ''}".rstrip())


def load_batches(cfg) -> list:
    train_loader, _ = build_dataloaders(cfg.data, seed=cfg.train.seed, pin_memory=False)
    batches = []
    for images, labels in train_loader:
        batches.append((images, labels))
        if len(batches) == 4:
            break
    return batches


def build_parts(cfg):
    device_map = parse_device_map(cfg.device_map)
    activate(device_map)
    torch.manual_seed(cfg.train.seed)
    return build_training(cfg, device_map)


def compare_variants(args, batches, log_every: int, flops: int = 0) -> None:
    """segadv's step under each variant, against the first (fp32) in alternating rounds."""
    dtypes = {"fp32": [], "bf16": ["enabled=true", "dtype=bfloat16"], "fp16": ["enabled=true", "dtype=float16"]}
    precision: dict[str, list[str]] = {}
    for g in dtypes:
        precision[f"amp/g={g},d=fp32"] = [f"amp.generator.{o}" for o in dtypes[g]]
    for d in ("bf16", "fp16"):
        precision[f"amp/g=fp32,d={d}"] = [f"amp.discriminator.{o}" for o in dtypes[d]]
    precision["amp/g=bf16,d=bf16"] = [*precision["amp/g=bf16,d=fp32"], *precision["amp/g=fp32,d=bf16"]]
    # The precision variants run channels_last off whatever the config says, so that channels_last
    # on/off compares against the same fp32 base.
    variants = {name: ["train.channels_last=false", *overrides] for name, overrides in precision.items()}
    variants["channels_last/on,fp32"] = ["train.channels_last=true"]
    variants["channels_last/on,g=bf16"] = ["train.channels_last=true", *precision["amp/g=bf16,d=fp32"]]
    # Memory for time: G's stages and decoder recomputed in the backward; the batch in two micro-batches.
    variants["activation_checkpointing/on"] = ["train.channels_last=false",
                                               "model.generator.activation_checkpointing=true"]
    variants["accumulation_steps/2"] = ["train.channels_last=false", "train.accumulation_steps=2"]
    runners = {}
    for name, overrides in variants.items():
        cfg = bench_config(args, *overrides)
        runners[name] = segadv_runner(build_parts(cfg), batches, log_every)
    if torch.cuda.is_available():
        # The cost of a cross-device hop: D on the CPU, G's maps and D's gradient crossing PCIe.
        for device_map in ("g:cuda:0,d:cuda:0", "g:cuda:0,d:cpu"):
            cfg = bench_config(args)
            cfg.device_map = device_map
            runners[f"device_map/{device_map}"] = segadv_runner(build_parts(cfg), batches, log_every)
    times = alternate(runners, args.rounds, args.steps, args.warmup)
    base = times["amp/g=fp32,d=fp32"]
    for name, seconds in times.items():
        figure(f"{name}/ms_per_step", seconds * 1000, "ms")
        figure(f"{name}/speedup", base / seconds, "x", "vs amp/g=fp32,d=fp32")
        if flops:
            figure(f"{name}/tflops", flops / seconds / 1e12, "TFLOP/s")


COMPILE_VARIANTS = {
    "eager": [],
    "g": ["compile.generator=true"],
    "d": ["compile.discriminator=true"],
    "g+d": ["compile.generator=true", "compile.discriminator=true"],
}


def compare_compile(args, batches, log_every: int, run_bare) -> None:
    """segadv's step with G, D and both compiled, against the eager step and the bare eager loop,
    alternating rounds; the compile time is the first steps' time beyond the same steps timed.

    Each variant compiles cold: dynamo's graphs and inductor's in-memory caches cleared, an empty
    inductor cache directory of its own (the variants' networks would otherwise share graphs and
    kernels). A second warm-up, each variant in its own directory again, re-loads from it what the
    later resets dropped, so the timed rounds compile nothing (checked: a note says otherwise)."""
    import tempfile

    import torch._dynamo
    from torch._inductor.utils import clear_caches

    from segadv.parallel.compile import graphs_compiled

    warmup = max(args.warmup, 2)
    runners, first = {}, {}
    with tempfile.TemporaryDirectory(prefix="segadv-bench-inductor-") as root:
        for name, overrides in COMPILE_VARIANTS.items():
            torch._dynamo.reset()
            clear_caches()
            with inductor_cache(os.path.join(root, name)):
                runners[name] = segadv_runner(build_parts(bench_config(args, *overrides)), batches, log_every)
                first[name] = runners[name](warmup) * warmup
        for name, run in runners.items():
            with inductor_cache(os.path.join(root, name)):
                run(warmup)
    runners["bare"] = run_bare
    graphs = graphs_compiled()
    times = alternate(runners, args.rounds, args.steps, 0)
    if graphs_compiled() != graphs:
        print(f"# compile: {graphs_compiled() - graphs} graphs compiled during the timed rounds")
    figure("compile/bare/ms_per_step", times["bare"] * 1000, "ms", "the bare eager loop, in the same rounds")
    for name in COMPILE_VARIANTS:
        figure(f"compile/{name}/ms_per_step", times[name] * 1000, "ms")
        figure(f"compile/{name}/speedup", times["eager"] / times[name], "x", "vs segadv eager")
        figure(f"compile/{name}/vs_bare", times["bare"] / times[name], "x", "vs the bare eager loop")
        if name != "eager":
            figure(f"compile/{name}/compile_s", first[name] - warmup * times[name], "s",
                   f"cold: the first {warmup} steps beyond {warmup} timed ones")


@contextlib.contextmanager
def inductor_cache(directory: str):
    """Inductor's on-disk cache in ``directory`` (read from the environment at every lookup)."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


AGREEMENT_WORKER = "--stop-agreement-worker"


def stop_agreement_seconds(calls: int = 300, step_seconds: float = 0.0) -> float:
    """Seconds one ``StepAgreement.any`` call takes in a 2-process gloo group on this machine (the
    slower rank's mean), ``step_seconds`` apart: the host sleeping in between, as it waits for its
    device during a GPU step (0: call after call, the whole round trip, an upper bound)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    workers = [subprocess.Popen([sys.executable, __file__, AGREEMENT_WORKER, str(calls), str(step_seconds)],
                                stdout=subprocess.PIPE, text=True, env={**env, "RANK": str(rank)}) for rank in (0, 1)]
    outputs = [worker.communicate(timeout=120)[0] for worker in workers]
    if any(worker.returncode for worker in workers):
        raise RuntimeError(f"stop agreement workers failed: {outputs}")
    return max(float(out.split()[-1]) for out in outputs)


def agreement_worker(calls: int, step_seconds: float) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    agreement = distributed.StepAgreement()
    for _ in range(10):
        agreement.any(False)
    spent = 0.0
    for _ in range(calls):
        time.sleep(step_seconds)
        t0 = time.perf_counter()
        agreement.any(False)
        spent += time.perf_counter() - t0
    agreement.close()
    dist.destroy_process_group()
    print(spent / calls)


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
COPY_CALLS = ("cudaMemcpy",)  # cudaMemcpy and cudaMemcpyAsync: a copy from pageable host memory waits


def profile_sides(runners: dict[str, object], steps: int, top: int = 25) -> None:
    """Where one side's host time goes that the other's does not: ``torch.profiler`` over ``steps``
    steps of each side, per step: operators, kernel launches, host syncs and the host's own time
    (a launch-bound GPU step is the host's time), then the operators whose host time differs most.
    The profiler's own overhead inflates every figure alike; compare the sides, not the values."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    per_op: dict[str, dict[str, tuple[float, float]]] = {}
    for name, run in runners.items():
        with profile(activities=activities) as prof:
            run(steps)
        events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0 or e.count]
        per_op[name] = {e.key: (e.count / steps, e.self_cpu_time_total / steps) for e in events}
        ops = sum(c for key, (c, _) in per_op[name].items() if key.startswith("aten::"))
        launches = sum(c for key, (c, _) in per_op[name].items() if "LaunchKernel" in key)
        syncs = sum(c for key, (c, _) in per_op[name].items() if key.startswith(SYNC_CALLS))
        copies = sum(c for key, (c, _) in per_op[name].items() if key.startswith(COPY_CALLS))
        host_us = sum(us for _, us in per_op[name].values())
        figure(f"profile/{name}/aten_ops_per_step", ops)
        figure(f"profile/{name}/kernel_launches_per_step", launches)
        figure(f"profile/{name}/host_syncs_per_step", syncs, "", ", ".join(SYNC_CALLS))
        figure(f"profile/{name}/memcpy_calls_per_step", copies, "", "cudaMemcpy, cudaMemcpyAsync")
        figure(f"profile/{name}/host_self_ms_per_step", host_us / 1000, "ms", "profiler overhead included")
    a, b = list(per_op)[:2]
    keys = set(per_op[a]) | set(per_op[b])
    diff = sorted(keys, key=lambda k: -abs(per_op[a].get(k, (0, 0))[1] - per_op[b].get(k, (0, 0))[1]))
    print(f"# top {top} operators by host time per step, {a} minus {b}: count {a}/{b}, self us {a}/{b}")
    for key in diff[:top]:
        (ca, ua), (cb, ub) = per_op[a].get(key, (0, 0)), per_op[b].get(key, (0, 0))
        print(f"#   {key[:60]:<60} {ca:6.1f}/{cb:<6.1f} {ua:9.1f}/{ub:<9.1f} ({ua - ub:+.1f})")


def step_flops(step, batch) -> int:
    """Floating-point operations of one call of ``step`` (torch's FlopCounterMode: convolutions and
    matrix products, forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step(*batch)
    return counter.get_total_flops()


def count(minimum: int):
    """argparse type: an integer >= ``minimum`` (argparse reports a bad one and exits 2)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py", description=__doc__.splitlines()[0])
    add_config_arguments(parser, "default: the embedded default")
    parser.add_argument("--device-map", help="e.g. g:cuda:0,d:cuda:0")
    parser.add_argument("--steps", type=count(1), default=6, help="steps per round and side")
    parser.add_argument("--rounds", type=count(1), default=3, help="alternating rounds")
    parser.add_argument("--warmup", type=count(0), default=2, help="untimed steps per side first")
    parser.add_argument("--no-variants", action="store_true",
                        help="only the segadv / bare ratio and the breakdown (skip AMP, channels_last, hop)")
    parser.add_argument("--compile", action="store_true",
                        help="also time compile.generator / compile.discriminator / both (minutes of compilation)")
    parser.add_argument("--profile", type=count(0), default=0, metavar="STEPS",
                        help="also profile STEPS steps of each side (torch.profiler): ops, launches, syncs, "
                             "host time per step and the operators that differ most")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    setup_logging(logging.WARNING)
    cfg = bench_config(args)
    batches = load_batches(cfg)
    parts = build_parts(cfg)
    device_map = parts.device_map
    bare = make_bare_step(parts, cfg.data.num_classes, cfg.data.ignore_index, cfg.loss.lambda_adv)
    log_every = cfg.train.log_every

    def run_bare(n: int) -> float:
        sync(device_map)
        t0 = time.perf_counter()
        for i in range(n):
            loss = bare(*batches[i % len(batches)])
            if (i + 1) % log_every == 0:
                loss.item()
        sync(device_map)
        return (time.perf_counter() - t0) / n

    run_segadv = segadv_runner(parts, batches, log_every)
    if args.warmup:
        run_segadv(args.warmup)
        run_bare(args.warmup)
    parts.phases.resolve()
    parts.phases.seconds.clear()  # the breakdown covers the timed rounds only
    times = alternate({"segadv": run_segadv, "bare": run_bare}, args.rounds, args.steps, 0)
    parts.phases.resolve()
    timed_steps = args.rounds * args.steps
    precision = {role: (str(part.opt.autocast_dtype).removeprefix("torch.") if part.opt.autocast_enabled else "float32")
                 for role, part in (("G", parts.g), ("D", parts.d))}
    print(f"# precision (both sides): G {precision['G']}, D {precision['D']}")
    print(f"# machine: {machine_line(device_map)}")
    print(f"# device map {device_map}; {cfg.model.generator.arch}/{cfg.model.generator.encoder}, "
          f"D ndf={cfg.model.discriminator.ndf}, batch {cfg.data.batch_size} x {cfg.data.synthetic.image_size}px; "
          f"{args.rounds} rounds x {args.steps} steps per side, median round")
    figure("bare/ms_per_step", times["bare"] * 1000, "ms")
    figure("segadv/ms_per_step", times["segadv"] * 1000, "ms")
    figure("ratio", times["bare"] / times["segadv"], "", "segadv / bare throughput; 1.0 = no overhead")
    flops = step_flops(bare, batches[0])
    figure("flops/gflop_per_step", flops / 1e9, "GFLOP", "convolutions and matmuls, forward and backward")
    figure("flops/segadv_tflops", flops / times["segadv"] / 1e12, "TFLOP/s", "achieved, against the card's peak")
    step_total = sum(parts.phases.seconds.values())
    for name in STEP_PHASES:
        seconds = parts.phases.seconds.get(name, 0.0)
        figure(f"breakdown/{name}/ms_per_step", seconds / timed_steps * 1000, "ms",
               f"{seconds / step_total if step_total else 0.0:.1%} of the step")
    if args.profile:
        profile_sides({"segadv": run_segadv, "bare": run_bare}, args.profile)
    if args.compile:
        compare_compile(args, batches, log_every, run_bare)
    if not args.no_variants:
        compare_variants(args, batches, log_every, flops)
        back_to_back = stop_agreement_seconds()
        hidden = stop_agreement_seconds(calls=50, step_seconds=times["segadv"])
        figure("stop_agreement/us_per_call", back_to_back * 1e6, "us", "call after call: the whole round trip")
        figure("stop_agreement/us_per_step", hidden * 1e6, "us", "a step apart, the host idle in between")
        figure("stop_agreement/share_of_step", back_to_back / times["segadv"], "",
               "upper bound (the round trip) over segadv's step; DDP runs only")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == [AGREEMENT_WORKER]:
        sys.exit(agreement_worker(int(sys.argv[2]), float(sys.argv[3])))
    sys.exit(main())
