"""Batches that cannot be drawn or trained on, refused before the first step: each stream's batch
against its pool (a full batch must exist), and the batches G's BatchNorm cannot train on.

In train mode BatchNorm normalises each channel by the batch's own statistics, and a batch of one
sample through DeepLabV3's image pooling (one value per channel) has none: torch stops with a
ValueError. Whether G can train on one sample is one config property,
``GeneratorConfig.trains_on_one_sample`` (yes with ``model.generator.norm: frozen``, whose
BatchNorm uses its running statistics, and for DeepLab-v2, which pools nothing); where it cannot,
every batch G sees in training is checked here: each stream's micro-batch (``train.accumulation_steps`` cuts a batch into
equal parts), each DataParallel replica's chunk of it, and the last, partial batch of an epoch
when ``data.drop_last`` is false.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from segadv.data.stream_spec import StreamSpec
from segadv.errors import UserError

__all__ = ["MIN_BATCH", "BatchTooSmall", "Pool", "check_last_batches", "check_micro_batches", "check_stream_pools",
           "replica_chunks"]

MIN_BATCH = 2  # the least batch BatchNorm can train on


class BatchTooSmall(UserError):
    """A batch G cannot train on; segadv-plan's batch searches treat it as a batch that does not
    train, as they do an iteration the networks refuse."""


_POOL_ITEMS = {"labeled": "labeled samples", "unlabeled": "unlabeled samples", "target": "target images"}


@dataclass(frozen=True)
class Pool:
    """How many samples a stream's pool holds, and where a message says the count comes from."""

    count: int
    source: str

    @classmethod
    def counted(cls, name: str, count: int) -> "Pool":
        return cls(count, f"{count} {_POOL_ITEMS[name]}")


def check_stream_pools(streams: Sequence[StreamSpec], pools: Mapping[str, Optional[Pool]],
                       batch_sizes: Mapping[str, int], drop_last: bool, world_size: int) -> None:
    """Each stream's pool exists and (with ``drop_last``) holds a full batch on every rank.
    ``pools``: by pool name, None for an unlabeled pool left empty, no entry for an absent target.
    An empty labeled or target pool passes: the header scan names the empty split."""
    for spec in streams:
        if spec.pool not in pools:
            raise UserError("target_data: the method adapts to a target domain; give target_data "
                            "(docs/methods.md \"Domain adaptation\")")
        pool = pools[spec.pool]
        if pool is None:
            raise UserError(
                "data.labeled_fraction: the method draws unlabeled images but every training sample "
                "is labeled; set data.labeled_fraction below 1 or give data.labeled_list")
        batch_size = batch_sizes[spec.name]
        if not drop_last or not pool.count or batch_size <= pool.count // world_size:
            continue
        ranks = f" over {world_size} ranks" if world_size > 1 else ""
        raise UserError(f"{spec.batch_size_key}: {batch_size} is larger than the {spec.name} set "
                        f"({pool.source}{ranks}), so no full batch exists")


def replica_chunks(batch: int, replicas: int) -> list[int]:
    """How DataParallel's scatter (``Tensor.chunk``) cuts ``batch`` samples over ``replicas``."""
    size = math.ceil(batch / replicas)
    return [min(size, batch - start) for start in range(0, batch, size)]


def check_micro_batches(sizes: Mapping[str, int], steps: int, replicas: int = 1) -> None:
    """Every stream's micro-batch (``sizes``: its batch-size key -> batch size, divisible by
    ``steps``) and each of G's ``replicas``' chunk of it hold at least two samples."""
    for key, size in sizes.items():
        micro = size // steps
        if micro < MIN_BATCH:
            cut = (f" cut into train.accumulation_steps={steps} micro-batches of {micro}" if steps > 1 else "")
            fix = (f"a {key} of {MIN_BATCH * steps} or more, or fewer accumulation steps" if steps > 1
                   else f"{key}={MIN_BATCH} or more")
            raise BatchTooSmall(f"{key}={size}{cut}: G's BatchNorm cannot train on a batch of one sample; use {fix} "
                                "(or model.generator.norm=frozen)")
        if replicas > 1 and min(replica_chunks(micro, replicas)) < MIN_BATCH:
            raise BatchTooSmall(
                f"{key}={size}: G's {replicas} DataParallel replicas get chunks of {replica_chunks(micro, replicas)} "
                f"samples of each micro-batch, and BatchNorm cannot train on one; use a micro-batch of "
                f"{MIN_BATCH * replicas} or more")


def check_last_batches(loaders: Mapping[str, Any], keys: Mapping[str, str], steps: int,
                       batch_statistics: bool) -> None:
    """With ``drop_last`` off, each training loader's last batch of an epoch (this rank's share
    modulo the batch) must cut into ``steps`` equal micro-batches, and hold two samples per
    micro-batch where G cannot train on one sample (``batch_statistics``: not
    ``GeneratorConfig.trains_on_one_sample``). ``keys``: each loader's batch-size key."""
    for name, loader in loaders.items():
        if getattr(loader, "drop_last", True):
            continue
        samples, batch = len(loader.sampler), loader.batch_size
        last = samples % batch
        if not last:
            continue
        unequal = last % steps != 0
        if not unequal and not (batch_statistics and last // steps < MIN_BATCH):
            continue
        why = (f"which train.accumulation_steps={steps} cannot cut into equal micro-batches" if unequal
               else "and G's BatchNorm cannot train on a batch of one sample")
        raise BatchTooSmall(
            f"data.drop_last: false leaves a last batch of {last} in every epoch of the {name} stream "
            f"({samples} samples per process, {keys.get(name, 'data.batch_size')}={batch}), {why}; set "
            f"data.drop_last: true, or a batch size that divides {samples}")
