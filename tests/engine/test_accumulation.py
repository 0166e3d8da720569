"""Gradient accumulation (train.accumulation_steps): K micro-batches, one optimizer step per network.

The equivalence with one batch of B (BatchNorm on its running statistics) is
tests/integration/test_equivalence.py's ``*accumulation*`` cases; resume at optimizer steps is
tests/integration/test_resume.py's; this file holds the mechanics.
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from conftest import TINY_OVERRIDES
from helpers import FixedStream
from segadv.training.build import build_amp_optimizer, build_training
from segadv.config import load_config
from segadv.config.schema import NetworkAmpConfig, OptimizerConfig
from segadv.engine.accumulation import Accumulation, split_batch
from segadv.engine.network import Network
from segadv.errors import UserError
from segadv.parallel import parse_device_map


def test_micro_batches_are_the_batch_cut_in_equal_consecutive_parts():
    images, labels = torch.arange(8.0).view(4, 2), torch.arange(4)
    parts = split_batch((images, labels), 2)
    assert [type(p) for p in parts] == [tuple, tuple]
    assert torch.equal(torch.cat([p[0] for p in parts]), images)
    assert torch.equal(torch.cat([p[1] for p in parts]), labels)
    assert [len(p[1]) for p in parts] == [2, 2]


def counted(calls: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return fn(*args, **kwargs)
    return wrapper


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_each_network_steps_once_per_k_micro_batches_and_the_schedule_counts_optimizer_steps():
    """K=2, three optimizer steps: each stream drawn 3 times (whole batches), each optimizer, GradScaler
    (fp16 D, so G's and D's are on) and poly schedule stepped 3 times; the LR is the schedule's at step 3."""
    cfg = load_config(None, [*TINY_OVERRIDES, "data.batch_size=4", "train.accumulation_steps=2", "train.max_steps=10",
                             "amp.discriminator.enabled=true", "amp.discriminator.dtype=float16"])
    parts = build_training(cfg, parse_device_map("cpu"))
    plain = build_training(load_config(None, [*TINY_OVERRIDES, "train.max_steps=10"]), parse_device_map("cpu"))
    calls: dict[str, int] = {}
    for net in parts.networks():
        net.opt.optimizer.step = counted(calls, f"{net.role} optimizer", net.opt.optimizer.step)
        net.opt.scaler.update = counted(calls, f"{net.role} scaler", net.opt.scaler.update)
        net.opt.scheduler.step = counted(calls, f"{net.role} schedule", net.opt.scheduler.step)
    images = torch.randn(4, 3, 64, 64)
    stream = FixedStream((images, torch.randint(0, cfg.data.num_classes, (4, 64, 64))))
    for step in range(3):
        parts.step({"labeled": stream}, step)
    assert stream.drawn == 3
    assert calls == {f"{role} {what}": 3 for role in ("generator", "discriminator")
                     for what in ("optimizer", "scaler", "schedule")}
    assert parts.g.opt.scales_loss and parts.d.opt.scales_loss
    for _ in range(3):
        plain.g.opt.scheduler.step()
    assert parts.g.opt.lr == pytest.approx(plain.g.opt.lr)


@pytest.mark.parametrize("overrides, key", [
    (["data.batch_size=6", "train.accumulation_steps=4"], "data.batch_size=6"),
    (["data.batch_size=4", "train.accumulation_steps=2", "method.name=advsemiseg",
      "method.advsemiseg.unlabeled_batch_size=3", "data.labeled_fraction=0.5"],
     "method.advsemiseg.unlabeled_batch_size=3"),
])
def test_a_step_count_that_does_not_divide_a_batch_is_a_user_error_naming_both(overrides, key):
    cfg = load_config(None, [*TINY_OVERRIDES, *overrides])
    with pytest.raises(UserError, match=rf"train.accumulation_steps=\d does not divide {key}"):
        build_training(cfg, parse_device_map("cpu"))


def test_ddp_all_reduces_once_per_optimizer_step():
    """no_sync on all micro-batches but the last: a comm hook sees one reduction per step (a
    one-process gloo group)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        ddp = DistributedDataParallel(nn.Linear(4, 2))
        reductions = []

        def hook(state, bucket):
            reductions.append(bucket.index())
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, hook)
        opt = build_amp_optimizer(ddp.module, OptimizerConfig(name="sgd", lr=0.1), NetworkAmpConfig(),
                                  torch.device("cpu"), 10, accumulation_steps=3)
        net = Network("generator", ddp, opt, (torch.device("cpu"),))

        def method(streams, step):
            loss = ddp(streams["x"].next()).square().mean()
            net.opt.backward(loss)
            net.opt.step()
            return {"loss": loss.detach()}

        x = torch.randn(6, 4)
        reference = nn.Linear(4, 2)
        reference.load_state_dict(ddp.module.state_dict())
        Accumulation(method, [net], 3)({"x": FixedStream(x)}, 0)
        assert reductions == [0]  # one bucket, reduced once: in the last micro-batch's backward
        reference(x).square().mean().backward()  # one batch of 6, plain SGD
        with torch.no_grad():
            for got, p in zip(ddp.module.parameters(), reference.parameters()):
                assert torch.allclose(got, p - 0.1 * p.grad, rtol=0, atol=1e-7)
    finally:
        dist.destroy_process_group()
