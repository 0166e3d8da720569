"""Helpers shared by test modules in different folders (tests/ is on sys.path through conftest.py):
tiny batches, hand-fed streams, the guard against host reads in a step, the methods' tiny conv G and
D, the tiny domain-adaptation overrides, and the resume tests' run config, records and checkpoint
comparison."""

from __future__ import annotations

import json

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from segadv.training.build import build_amp_optimizer
from segadv.config import load_config
from segadv.config.schema import NetworkAmpConfig, OptimizerConfig
from segadv.engine.network import Network

from conftest import TINY_OVERRIDES


def batch(cfg, n=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    size = cfg.data.synthetic.image_size
    images = torch.randn(n, 3, size, size, generator=gen)
    labels = torch.randint(0, cfg.data.num_classes, (n, size, size), generator=gen)
    labels[:, :4, :4] = cfg.data.ignore_index
    return images, labels


HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
              torch.Tensor.__int__, torch.Tensor.__index__}


class NoHostReads(TorchFunctionMode):
    """Fails on every call that reads a tensor's value on the host, unless ``paused``
    (tests/engine/test_hot_path.py: on the CPU a host sync cannot be observed directly)."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS and not self.paused:
            raise AssertionError(f"the step reads a tensor on the host: {func.__name__}")
        return func(*args, **(kwargs or {}))


def exempt_optimizer_steps(parts, mode: NoHostReads) -> None:
    """The optimizers' own ``step()`` reads torch's CPU step counters: never a wait for a device."""
    for opt in (net.opt.optimizer for net in parts.networks()):  # every trained network's (the teacher has none)
        opt.register_step_pre_hook(lambda *a: setattr(mode, "paused", True))
        opt.register_step_post_hook(lambda *a: setattr(mode, "paused", False))


class FixedStream:
    """A stream that hands out the same batch and counts draws (the Stream interface)."""

    def __init__(self, batch):
        self.batch = batch
        self.drawn = 0

    def next(self):
        self.drawn += 1
        return self.batch


def conv_networks(seed, discriminator_cls, num_classes, lr):
    """A tiny conv G (no BatchNorm, no dropout) and a real ``discriminator_cls`` D (ndf 4), each with
    plain SGD on the CPU, built in that order after seeding torch: the methods' unit-test networks."""
    torch.manual_seed(seed)
    generator = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, num_classes, 3, padding=1))
    discriminator = discriminator_cls(num_classes, ndf=4)
    device = torch.device("cpu")
    sgd = OptimizerConfig(name="sgd", lr=lr, momentum=0.0)
    opt_g = build_amp_optimizer(generator, sgd, NetworkAmpConfig(), device, 100, name="generator")
    opt_d = build_amp_optimizer(discriminator, sgd, NetworkAmpConfig(), device, 100, name="discriminator")
    return Network("generator", generator, opt_g, (device,)), Network("discriminator", discriminator, opt_d, (device,))


TARGET_DATA = ("target_data={kind: synthetic, num_classes: 5, val_batch_size: 4, num_workers: 0, "
               "synthetic: {image_size: 64, train_size: 12, val_size: 8, domain: target, seed: 1}}")
UDA_OVERRIDES = [*TINY_OVERRIDES, TARGET_DATA, "method.name=adaptsegnet", "model.generator.aux_head=true"]


LOSSES = ("train/loss_seg", "train/loss_adv", "train/loss_d")


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def per_step_losses(run_dir, keys=LOSSES):
    return {r["step"]: tuple(r[k] for k in keys) for r in records(run_dir) if "train/loss_seg" in r}


def resume_cfg(tmp_path, name, *extra):
    cfg = load_config(None, [*TINY_OVERRIDES, "train.max_steps=6", "train.log_every=1", "train.eval_every=100",
                             "checkpoint.every=3", "train.deterministic=true", "log.tensorboard=false",
                             "data.train_transforms=[{name: HorizontalFlip, p: 0.5}, "
                             "{name: RandomBrightnessContrast, p: 0.5}]", *extra])
    cfg.run_dir = str(tmp_path / name)
    cfg.device_map = "cpu"
    return cfg


def assert_checkpoints_equal(saved, resumed) -> int:
    """Every tensor of every state two checkpoints hold (networks, optimizers, scalers, data
    streams, a method's RNG) bitwise equal; the config, version, format and host RNG left out.
    Returns how many tensors were compared."""
    from segadv.checkpoint.state import tensors_in

    compared = 0
    for key in saved:
        if key in ("config", "segadv_version", "format", "format_version", "rng"):
            continue
        for a, b in zip(tensors_in(saved[key]), tensors_in(resumed[key]), strict=True):
            assert torch.equal(a, b), key
            compared += 1
    return compared


def stream_positions(ckpt):
    """A checkpoint's data position: batches drawn per stream."""
    return {name: state["batches"] for name, state in ckpt["data_streams"].items()}


def assert_refused(capsys, code: int, *named: str) -> str:
    """A command's user error: exit 2, no traceback, stderr naming each of ``named``; its stderr."""
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    for text in named:
        assert text in err, err[-2000:]
    return err
