"""Activation checkpointing of G (model.generator.activation_checkpointing): the same step as the
plain G, BatchNorm's running statistics updated once, the same parameter names.

Its equivalence with the plain float32 loop under placements and precisions is
tests/integration/test_equivalence.py's ``*checkpointing*`` cases; its memory, tests/plan/test_plan.py's.
"""

from contextlib import nullcontext

import pytest
import torch

from conftest import TINY_OVERRIDES, needs_compiled_checkpointing_torch
from helpers import FixedStream
from segadv.training.build import build_training
from segadv.config import load_config
from segadv.parallel import parse_device_map, unwrap
from segadv.parallel import activation_checkpoint
from segadv.parallel.activation_checkpoint import CheckpointedForward

RESNET = ("model.generator.encoder=resnet18", "model.generator.encoder_depth=3", "model.generator.output_stride=8")


def one_step(checkpointing: bool, encoder: tuple[str, ...], init=None, compiled: tuple[str, ...] = ()):
    """G's state (parameters and buffers) after one training step from ``init`` (dropout on, the
    same seed: the recompute must draw the same masks) and the G trained. ``compiled``: overrides
    that compile G."""
    cfg = load_config(None, [*TINY_OVERRIDES, *encoder, "data.batch_size=4", *compiled,
                             f"model.generator.activation_checkpointing={str(checkpointing).lower()}"])
    parts = build_training(cfg, parse_device_map("cpu"))
    g, d = unwrap(parts.g.module), unwrap(parts.d.module)
    if init is not None:
        g.load_state_dict(init[0])
        d.load_state_dict(init[1])
    start = ({k: v.clone() for k, v in g.state_dict().items()}, {k: v.clone() for k, v in d.state_dict().items()})
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(4, 3, 64, 64, generator=gen),
             torch.randint(0, cfg.data.num_classes, (4, 64, 64), generator=gen))
    torch.manual_seed(1)
    parts.step({"labeled": FixedStream(batch)}, 0)
    return start, {k: v.clone() for k, v in g.state_dict().items()}, g


@pytest.mark.parametrize("encoder", [RESNET, ()], ids=["resnet18", "mobilenet_v2"])
def test_the_checkpointed_step_equals_the_plain_one_with_statistics_updated_once(encoder):
    start, plain, _ = one_step(False, encoder)
    _, got, g = one_step(True, encoder, init=start)
    assert isinstance(g.decoder, CheckpointedForward)
    assert got.keys() == plain.keys()  # no wrapper prefixes: files and loaders see the plain G
    counts = {k: int(v) for k, v in got.items() if k.endswith("num_batches_tracked")}
    assert counts and set(counts.values()) == {1}
    worst = max(float((got[k].double() - plain[k].double()).abs().max()) for k in plain)
    assert worst <= 1e-6, worst  # measured 0.0: the same kernels on the same values


@needs_compiled_checkpointing_torch
def test_compiled_checkpointing_updates_the_statistics_once_and_steps_as_the_plain_g():
    """compile.generator with checkpointing: the checkpoint is traced into G's graph (dynamo takes
    no context_fn), and the partitioner's recompute must not move the running statistics again.
    aot_eager: the same graph capture and partitioning as inductor, torch's own kernels."""
    start, plain, _ = one_step(False, RESNET)
    _, got, g = one_step(True, RESNET, init=start,
                         compiled=("compile.generator=true", "compile.backend=aot_eager"))
    assert got.keys() == plain.keys()
    counts = {k: int(v) for k, v in got.items() if k.endswith("num_batches_tracked")}
    assert counts and set(counts.values()) == {1}
    worst = max(float((got[k].double() - plain[k].double()).abs().max()) for k in plain)
    assert worst <= 1e-4, worst  # measured 2.2e-5 (AOTAutograd decomposes BatchNorm)


def test_a_recompute_that_updates_the_statistics_is_caught(monkeypatch):
    """The trap planted: without the recompute's own copies, the running statistics move twice."""
    monkeypatch.setattr(activation_checkpoint, "running_statistics_untouched", lambda module: nullcontext())
    start, plain, _ = one_step(False, RESNET)
    _, got, _ = one_step(True, RESNET, init=start)
    moved = [k for k in plain if "running" in k and not torch.equal(got[k], plain[k])]
    assert moved
    assert 2 in {int(v) for k, v in got.items() if k.endswith("num_batches_tracked")}  # the stem's stays at 1


def test_evaluation_runs_the_plain_forward():
    _, _, g = one_step(True, RESNET)
    g.eval()
    with torch.no_grad():
        out = g(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 5, 64, 64)
