#!/usr/bin/env python
"""Time segadv's training step against a bare hand-written loop, in the same process.

Both sides run the same arithmetic (G's CE + adversarial update with D frozen, then D's update)
on the same networks and the same pre-loaded batches, so data loading is out of the picture.
segadv's side is the loop body of ``segadv.train``: the step, the on-device loss averaging, the
data-wait timer and the log-interval read-out. The two sides alternate in rounds and the median
round is kept, which cancels most of the drift of a noisy machine.

    python tools/bench.py [--config FILE] [--steps N] [--rounds R] [key=value ...]

Prints the throughput ratio segadv / bare (1.0 = no overhead).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from segadv.build import build_training
from segadv.config import load_config
from segadv.data import build_dataloaders
from segadv.engine.losses import masked_bce_with_logits, one_hot_labels
from segadv.errors import cli_entry
from segadv.monitor.meters import LossAverager, StepTimer
from segadv.parallel import activate, parse_device_map
from segadv.runtime import setup_logging

log = logging.getLogger("segadv.bench")


def make_bare_step(parts, num_classes: int, ignore_index: int, lambda_adv: float):
    """The loop people write by hand: no wrappers, no AMP helpers, no meters."""
    G, D = parts.generator, parts.discriminator
    g_dev, d_dev = parts.device_map.generator, parts.device_map.discriminator
    opt_g, opt_d = parts.opt_g.optimizer, parts.opt_d.optimizer
    sched_g, sched_d = parts.opt_g.scheduler, parts.opt_d.scheduler

    def step(images, labels):
        images, labels = images.to(g_dev), labels.to(g_dev)
        labels_d = labels.to(d_dev)
        valid = labels_d != ignore_index
        for p in D.parameters():
            p.requires_grad_(False)
        logits = G(images)
        loss_seg = F.cross_entropy(logits, labels, ignore_index=ignore_index)
        probs = logits.softmax(dim=1).to(d_dev)
        loss_adv = masked_bce_with_logits(D(probs), 1.0, valid)
        (loss_seg + lambda_adv * loss_adv.to(g_dev)).backward()
        opt_g.step()
        opt_g.zero_grad(set_to_none=True)
        sched_g.step()
        for p in D.parameters():
            p.requires_grad_(True)
        real = one_hot_labels(labels_d, num_classes, valid)
        fake_logits, real_logits = D(torch.cat([probs.detach(), real])).chunk(2)
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


@cli_entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="config file (default: the embedded default)")
    parser.add_argument("--device-map", help="e.g. g:cuda:0,d:cuda:0")
    parser.add_argument("--steps", type=int, default=6, help="steps per round and side")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    setup_logging(logging.WARNING)
    cfg = load_config(args.config, args.overrides)
    if args.device_map:
        cfg.device_map = args.device_map
    # The adversarial term is on from the first step, so both sides do all of the work.
    cfg.loss.adv_warmup_steps = 0
    if cfg.loss.lambda_adv == 0:
        cfg.loss.lambda_adv = 0.01
    device_map = parse_device_map(cfg.device_map)
    activate(device_map)
    torch.manual_seed(cfg.train.seed)

    train_loader, _ = build_dataloaders(cfg.data, seed=cfg.train.seed, pin_memory=False)
    batches = []
    for images, labels in train_loader:
        batches.append((images, labels))
        if len(batches) == 4:
            break
    parts = build_training(cfg, device_map)
    bare = make_bare_step(parts, cfg.data.num_classes, cfg.data.ignore_index, cfg.loss.lambda_adv)
    log_every = cfg.train.log_every

    def run_segadv(n: int) -> float:
        losses, timer = LossAverager(), StepTimer()
        sync(device_map)
        t0 = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            images, labels = batches[i % len(batches)]
            timer.add_data_wait(time.perf_counter() - t)
            losses.update(parts.step(images, labels, step=i).as_dict())
            if (i + 1) % log_every == 0:
                losses.pop_means(), timer.pop(), parts.opt_g.loss_scale(), parts.opt_d.loss_scale()
        losses.pop_means() if n % log_every else None
        sync(device_map)
        return (time.perf_counter() - t0) / n

    def run_bare(n: int) -> float:
        sync(device_map)
        t0 = time.perf_counter()
        for i in range(n):
            loss = bare(*batches[i % len(batches)])
            if (i + 1) % log_every == 0:
                loss.item()
        sync(device_map)
        return (time.perf_counter() - t0) / n

    run_segadv(args.warmup)
    run_bare(args.warmup)
    segadv_times, bare_times = [], []
    for r in range(args.rounds):
        # Alternate which side goes first so a drifting machine favours neither.
        order = (run_segadv, run_bare) if r % 2 == 0 else (run_bare, run_segadv)
        for fn in order:
            (segadv_times if fn is run_segadv else bare_times).append(fn(args.steps))
    t_segadv, t_bare = statistics.median(segadv_times), statistics.median(bare_times)
    print(f"device map        {device_map}")
    print(f"model             {cfg.model.generator.arch}/{cfg.model.generator.encoder}, D ndf={cfg.model.discriminator.ndf}, "
          f"batch {cfg.data.batch_size} x {cfg.data.synthetic.image_size}px")
    print(f"rounds x steps    {args.rounds} x {args.steps} per side")
    print(f"bare loop         {t_bare * 1000:8.1f} ms/step (median round)")
    print(f"segadv            {t_segadv * 1000:8.1f} ms/step (median round)")
    print(f"throughput ratio  {t_bare / t_segadv:.3f}  (segadv / bare; 1.0 = no overhead)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
