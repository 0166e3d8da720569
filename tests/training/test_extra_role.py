"""A network role added in this file alone: a toy method declares G, D and a third network of a
role registered here (built and set like D, placed by its own device-map entry), and trains it
with placement, checkpoints and a bitwise resume."""

from __future__ import annotations

from typing import Mapping

import pytest
import torch
import torch.nn.functional as F

from segadv.checkpoint import read_checkpoint
from segadv.config.roles import register_role, unregister_role
from segadv.data.streams import StreamSpec
from segadv.engine.losses import one_hot_labels
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
from segadv.training.loop import train

from helpers import per_step_losses, resume_cfg


class Critics(Method):
    """G's CE; D and the critic each learn one-hot labels against G's maps."""

    name = "critics"
    streams = (StreamSpec("labeled", "labeled"),)
    losses = ("loss_seg", "loss_d", "loss_critic")
    d_losses = ("loss_d", "loss_critic")

    def __init__(self, nets: Mapping, phases, num_classes: int, ignore_index: int) -> None:
        self.g, self.ds, self.phases = nets["generator"], (nets["discriminator"], nets["critic"]), phases
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.schedule = Schedule()

    @classmethod
    def networks(cls, cfg) -> tuple[str, ...]:
        return ("generator", "discriminator", "critic")

    @classmethod
    def from_config(cls, cfg, nets, phases) -> Critics:
        return cls(nets, phases, cfg.data.num_classes, cfg.data.ignore_index)

    @classmethod
    def passes_generator_loss_through_discriminator(cls, cfg) -> bool:
        return False

    def __call__(self, streams: Mapping, step: int) -> dict[str, torch.Tensor]:
        g = self.g
        images, labels = streams["labeled"].next()
        images, labels = copy_in(self.phases, g.device, images, labels)
        g.module.train()
        with self.phases.phase("g_fwd_bwd", g.device):
            logits = generator_logits(g, images)
            loss_seg = F.cross_entropy(logits, labels, ignore_index=self.ignore_index)
            g.opt.backward(loss_seg)
        optimizer_step(self.phases, g)
        losses = {"loss_seg": loss_seg.detach()}
        for name, d in zip(("loss_d", "loss_critic"), self.ds):
            d.module.train()
            fake = hand_over(self.phases, logits.softmax(dim=1).detach(), g, d)
            (labels_d,) = copy_in(self.phases, d.device, labels)
            valid = labels_d != self.ignore_index
            real = one_hot_labels(labels_d, self.num_classes, valid)
            losses[name], _ = discriminator_backward(
                self.phases, d, [DiscriminatorBatch(fake, GROUND_TRUTH_REAL.fake, valid),
                                 DiscriminatorBatch(real, GROUND_TRUTH_REAL.real, valid)])
            optimizer_step(self.phases, d)
        return losses


@pytest.fixture
def critics(monkeypatch):
    """The role and the method, for this test only (a plugin would register both at its import)."""
    register_role("critic", "c", falls_back_to="discriminator")
    monkeypatch.setattr(registry, "METHODS", dict(registry.METHODS))
    register_method(Critics)
    yield Critics
    unregister_role("critic")


def test_the_extra_role_is_built_placed_and_named_by_the_device_map(critics, tmp_path):
    cfg = resume_cfg(tmp_path, "build", "method.name=critics", "optim.discriminator.lr=0.003")
    device_map = parse_device_map("g:cpu,d:cpu,c:cpu")
    parts = build_training(cfg, device_map)
    assert [role.name for role in parts.roles] == ["generator", "discriminator", "critic"]
    critic = parts.network("critic")
    assert critic.short == "c" and critic.devices == (torch.device("cpu"),)
    assert critic.opt.lr == pytest.approx(0.003)  # D's settings: the role falls back to D's
    assert critic.bare is not parts.d.bare
    assert str(device_map) == "g:cpu,d:cpu,c:cpu"


def test_the_extra_role_checkpoints_and_resumes_bitwise(critics, tmp_path):
    keys = ("train/loss_seg", "train/loss_d", "train/loss_critic")
    full = train(resume_cfg(tmp_path, "full", "method.name=critics"))
    assert full.step == 6
    saved = read_checkpoint(tmp_path / "full" / "checkpoints" / "last.pt")
    assert {"critic", "optim_critic", "discriminator", "generator"} <= set(saved)

    first = train(resume_cfg(tmp_path, "split", "method.name=critics"), stop_at=4)
    assert (first.step, first.stopped_by) == (4, "stop_at")
    second = train(resume_cfg(tmp_path, "split", "method.name=critics"), resume="auto")
    assert second.step == 6
    expected, got = per_step_losses(full.run_dir, keys), per_step_losses(second.run_dir, keys)
    assert sorted(got) == [1, 2, 3, 4, 5, 6] and got == expected  # bitwise
    resumed = read_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")
    for name, tensor in saved["critic"].items():
        assert torch.equal(tensor, resumed["critic"][name]), name
