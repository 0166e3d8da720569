"""What a training run holds besides its built networks, for segadv-train and segadv-plan alike:
its data (the method's streams, the val loaders, the images the panels and diagnostics keep),
its checkpointed state, and G as every rank evaluates it.

A library module: the training loop (``segadv/training/loop.py``) and the dry run
(``segadv/plan/dry_run.py``) both import it, so the plan runs what training runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from segadv.training.build import Training
from segadv.training.checks import trains_on_one_sample
from segadv.checkpoint import NetworkWeights, Stateful
from segadv.config import Config
from segadv.config.schema import DataConfig
from segadv.data import pool_has_masks
from segadv.data.augment import seed_transform
from segadv.data.batch_checks import check_last_batches
from segadv.data.catalog import Catalog
from segadv.data.loaders import build_run_loaders
from segadv.data.streams import Stream, Streams, close_loader
from segadv.engine.evaluate import EvalResult, evaluate
from segadv.parallel import distributed
from segadv.parallel.fsdp import is_sharded
from segadv.parallel.placement import for_inference
from segadv.training.process import RankRNGs
from segadv.training.smoke import val_samples


@dataclass
class RunData:
    streams: Streams  # what the method draws from
    val_loader: Iterable  # val/* (the target's under domain adaptation)
    source_val_loader: Iterable | None  # val_source/* (train.eval_source), else None
    panel_images: torch.Tensor | None  # the method's panel inputs, fixed for the run
    # Unlabeled images with their masks for diag/d_confidence_auroc (log.diagnostic_images), or None
    diagnostic: tuple[torch.Tensor, torch.Tensor] | None = None

    def close(self) -> None:
        """Every loader's workers ended (persistent ones included) before the run returns."""
        self.streams.close()
        for loader in (self.val_loader, self.source_val_loader):
            close_loader(loader)


def build_data(cfg: Config, parts: Training, run_dir: Path, catalog: Catalog | None = None) -> RunData:
    """The run's data from ``catalog``, the start's checked and listed data (preflight's), or,
    given none (segadv-plan, tests), from the config: the rest of the data path (scan, pools,
    loaders, streams) runs once."""
    env, device_map = parts.env, parts.device_map
    specs = type(parts.method).data_streams(cfg)
    loaders = build_run_loaders(
        cfg.data, specs, seed=cfg.train.seed, pin_memory=device_map.generator.type != "cpu",
        run_dir=run_dir, rank=env.rank, world_size=env.world_size, batch_sizes=parts.method.stream_batch_sizes(cfg),
        target=cfg.target_data, catalog=catalog, source_val=cfg.train.eval_source,
        val_samples=val_samples(cfg, env.world_size),
    )
    keys = {spec.name: spec.batch_size_key for spec in specs}
    check_last_batches(loaders.streams, keys, cfg.train.accumulation_steps,
                       not trains_on_one_sample(cfg, catalog))  # at the images' own sizes where the start listed them
    streams = Streams({name: Stream(name, loader, keys[name]) for name, loader in loaders.streams.items()})
    panel_images = first_images(streams[parts.method.panel_stream], cfg.log.num_images) \
        if parts.method.panel_stream and cfg.log.num_images else None
    diagnostic = None
    if panel_images is not None and cfg.log.diagnostic_images and pool_has_masks(cfg.data):
        diagnostic = first_labeled_samples(streams[parts.method.panel_stream], cfg.log.diagnostic_images)
    return RunData(streams, loaders.val, loaders.source_val, panel_images, diagnostic)


def first_images(stream: Stream, count: int) -> torch.Tensor:
    """The stream's first ``count`` images, fixed for the whole run (a method's panel), read
    without moving the stream."""
    dataset = stream.loader.dataset
    samples = [dataset[(i, 0)] for i in range(min(count, len(dataset)))]
    return torch.stack([s[0] if isinstance(s, (tuple, list)) else s for s in samples])


def first_labeled_samples(stream: Stream, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The stream's first ``count`` images (as :func:`first_images` reads them) with their masks,
    which only a diagnostic reads (the pool's ``labeled_sample``)."""
    dataset = stream.loader.dataset
    samples = []
    for i in range(min(count, len(dataset))):
        seed_transform(getattr(dataset, "transform", None), 0)  # as dataset[(i, 0)] seeds it
        samples.append(dataset.labeled_sample(i))
    images, masks = zip(*samples)
    return torch.stack(images), torch.stack(masks)


def run_state(parts: Training, streams: Streams | None, clock: Stateful | None = None) -> dict[str, Stateful]:
    """The run's stateful parts by checkpoint key: each network's weights and its optimizer (with
    its GradScaler and LR schedule), the data streams' positions (``streams``; None: left out),
    every rank's RNGs, and the run's time so far (``clock``, segadv/monitor/profile.py's
    ``RunClock``; None: left out)."""
    states: dict[str, Stateful] = {}
    for net in parts.every_network():  # an untrained network (the teacher) has weights, no optimizer
        states[net.role] = NetworkWeights(net.role, net.module)
        if net.opt is not None:
            states[f"optim_{net.role}"] = net.opt
    states.update(parts.method.checkpoint_state())  # the method's own (the mean teacher's mixing RNG)
    if streams is not None:
        states["data_streams"] = streams
    states["rng"] = RankRNGs(parts.device_map.devices, parts.env)
    if clock is not None:
        states["clock"] = clock
    return states


def generator_for_evaluation(parts: Training) -> nn.Module:
    """G as every rank evaluates it: under DDP with rank 0's BatchNorm statistics (after the last
    step each rank's hold one local update), and outside DDP's collective forward."""
    if isinstance(parts.g.module, DistributedDataParallel) or is_sharded(parts.g.bare):
        distributed.broadcast_buffers(parts.g.bare)
    return for_inference(parts.g.module)


def evaluate_teacher(cfg: Config, parts: Training, loader: Iterable, val_data: DataConfig,
                     track: Callable[[Iterable], Iterable] | None = None) -> EvalResult | None:
    """The run's teacher (the mean teacher's EMA of G, the ``teacher`` role) on one val split (of
    the section ``val_data``), as ``segadv-eval --network teacher`` scores it from a checkpoint
    (eval mode: its own running statistics), on its own device under its own autocast; None where
    the run has no teacher. Each rank holds its own copy (no DDP wrapper) and scores its shard; the
    counts are summed."""
    teacher = parts.network("teacher")
    if teacher is None:
        return None
    return evaluate(for_inference(teacher.module), loader, teacher.device, cfg.data.num_classes,
                    autocast=teacher.autocast, track=track, resize_to_multiple=val_data.val_resize_to_multiple)


def evaluate_generator(cfg: Config, parts: Training, loader: Iterable, val_data: DataConfig, num_samples: int = 0,
                       track: Callable[[Iterable], Iterable] | None = None, proxies: bool = False) -> EvalResult:
    """G on one val split (of the section ``val_data``: how its images meet G), on G's device
    under G's autocast (``num_samples`` input/truth/prediction samples kept for a panel; ``track``
    wraps the loader, e.g. a progress bar; ``proxies``: the label-free scores too, D's among them
    where the method has one)."""
    return evaluate(generator_for_evaluation(parts), loader, parts.device_map.generator, cfg.data.num_classes,
                    autocast=parts.g.opt.autocast, num_samples=num_samples, track=track, proxies=proxies,
                    realness=parts.method.discriminator_realness if proxies else None,
                    resize_to_multiple=val_data.val_resize_to_multiple)
