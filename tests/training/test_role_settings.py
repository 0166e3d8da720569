"""A network role registered in this file alone gets its own per-network config keys: optim.<role>
and amp.<role> read from YAML, validated, listed by --help-config, and trained with (its
optimizer's lr, its autocast)."""

from __future__ import annotations

from typing import Mapping

import pytest
import torch
import torch.nn.functional as F

from segadv.config import load_config
from segadv.config.roles import register_role, unregister_role
from segadv.data.streams import StreamSpec
from segadv.engine.losses import one_hot_labels
from segadv.errors import UserError
from segadv.methods import Method, register_method
from segadv.methods import registry
from segadv.methods.adversarial import (
    GROUND_TRUTH_REAL,
    DiscriminatorBatch,
    copy_in,
    discriminator_backward,
    generator_logits,
    hand_over,
    optimizer_step,
)
from segadv.methods.schedule import Schedule
from segadv.parallel import parse_device_map
from segadv.training.build import build_training

from conftest import TINY_OVERRIDES
from helpers import FixedStream, batch


class Judged(Method):
    """G's CE, and a judge (a D of its own settings) learning one-hot labels against G's maps."""

    name = "judged"
    streams = (StreamSpec("labeled", "labeled"),)
    losses = ("loss_seg", "loss_judge")
    d_losses = ("loss_judge",)

    def __init__(self, nets: Mapping, phases, num_classes: int, ignore_index: int) -> None:
        self.g, self.judge, self.phases = nets["generator"], nets["judge"], phases
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.schedule = Schedule()
        self.judge_autocast: list[bool] = []

    @classmethod
    def networks(cls, cfg) -> tuple[str, ...]:
        return ("generator", "judge")

    @classmethod
    def from_config(cls, cfg, nets, phases) -> Judged:
        return cls(nets, phases, cfg.data.num_classes, cfg.data.ignore_index)

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg) -> bool:
        return False

    def __call__(self, streams: Mapping, step: int) -> dict[str, torch.Tensor]:
        g, d = self.g, self.judge
        images, labels = streams["labeled"].next()
        images, labels = copy_in(self.phases, g.device, images, labels)
        g.module.train()
        logits = generator_logits(g, images)
        loss_seg = F.cross_entropy(logits, labels, ignore_index=self.ignore_index)
        g.opt.backward(loss_seg)
        optimizer_step(self.phases, g)
        d.module.train()
        fake = hand_over(self.phases, logits.softmax(dim=1).detach(), g, d)
        (labels_d,) = copy_in(self.phases, d.device, labels)
        valid = labels_d != self.ignore_index
        with d.opt.autocast():
            self.judge_autocast.append(torch.is_autocast_enabled(d.device.type))
        loss, _ = discriminator_backward(
            self.phases, d, [DiscriminatorBatch(fake, GROUND_TRUTH_REAL.fake, valid),
                             DiscriminatorBatch(one_hot_labels(labels_d, self.num_classes, valid),
                                            GROUND_TRUTH_REAL.real, valid)])
        optimizer_step(self.phases, d)
        return {"loss_seg": loss_seg.detach(), "loss_judge": loss}


@pytest.fixture
def judged(monkeypatch):
    """A role of its own kind and no fallback, and the method training it, for this test only."""
    register_role("judge", "j", kind="discriminator", title="the judge")
    monkeypatch.setattr(registry, "METHODS", dict(registry.METHODS))
    register_method(Judged)
    yield Judged
    unregister_role("judge")


def test_the_role_has_its_own_keys_listed_and_validated(judged, capsys):
    from segadv.cli.train import main

    with pytest.raises(SystemExit) as done:
        main(["--help-config", "optim.judge"])
    assert done.value.code in (0, None)
    listing = capsys.readouterr().out
    assert "optim.judge: section" in listing and "optim.judge.lr: float" in listing
    with pytest.raises(SystemExit):
        main(["--help-config", "amp.judge"])
    listing = capsys.readouterr().out
    assert "amp.judge: section" in listing and "amp.judge.enabled: " in listing and "the judge's" in listing
    with pytest.raises(UserError, match="optim.judge.lr"):
        load_config(None, ["optim.judge.lr=-1"])
    with pytest.raises(UserError, match="head_lr_mult is G's"):
        load_config(None, ["optim.judge.head_lr_mult=10"])  # a discriminator's kind: no head


def test_the_role_trains_with_its_own_optim_and_amp_from_yaml(judged, tmp_path):
    config = tmp_path / "judged.yaml"
    config.write_text("_base_: default\nmethod: {name: judged}\n"
                      "optim: {judge: {name: sgd, lr: 0.0037}}\namp: {judge: {enabled: true}}\n")
    cfg = load_config(str(config), [*TINY_OVERRIDES, "amp.generator.enabled=false"])
    assert cfg.optim.judge.lr == 0.0037 and cfg.amp.judge.enabled is True and cfg.init.judge is None
    assert cfg.optim.discriminator.lr != 0.0037  # its own, not D's
    parts = build_training(cfg, parse_device_map("cpu"))
    judge = parts.network("judge")
    assert judge.opt.lr == pytest.approx(0.0037)
    assert isinstance(judge.opt.optimizer, torch.optim.SGD)
    assert parts.g.opt.lr != pytest.approx(0.0037)
    assert judge.opt.autocast_enabled and not parts.g.opt.autocast_enabled

    streams = {"labeled": FixedStream(batch(cfg))}
    losses = parts.step(streams, 1)
    assert torch.isfinite(losses["loss_judge"])
    assert parts.method.judge_autocast == [True]  # amp.judge.enabled: its own autocast, G's is off
