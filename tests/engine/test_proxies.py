"""The label-free scores (issue 51): SND held to a transcription of Saito et al.'s definition, the
scores from images alone (labels all ignore give the same), every proxy/* logged at each
evaluation of an adaptation run, and checkpoint.best_by choosing best.pt by one of them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from segadv.config import load_config
from segadv.engine.evaluate import evaluate
from segadv.engine.proxies import ProxyMeter, soft_neighborhood_density
from segadv.errors import UserError
from segadv.methods.registry import method_class
from segadv.models.base import Generator
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from helpers import TARGET_DATA

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def snd_transcribed(probs: np.ndarray, temperature: float = 0.05) -> float:
    """VisionLearningGroup/SND's score, as pytorch-adapt's SNDValidator computes it: cosine
    similarities of the normalised softmax vectors, self masked out, a softmax of sim / T per row,
    the mean of the rows' entropies (log of p + 1e-5)."""
    normed = probs / np.linalg.norm(probs, axis=1, keepdims=True)
    sim = normed @ normed.T / temperature
    np.fill_diagonal(sim, -np.inf)
    sim = sim - sim.max(axis=1, keepdims=True)
    p = np.exp(sim) / np.exp(sim).sum(axis=1, keepdims=True)
    return float(-(p * np.log(p + 1e-5)).sum(axis=1).mean())


def test_snd_matches_the_transcription():
    gen = torch.Generator().manual_seed(0)
    probs = torch.randn(200, 5, generator=gen).softmax(dim=1)
    assert soft_neighborhood_density(probs).item() == pytest.approx(snd_transcribed(probs.double().numpy()),
                                                                    rel=1e-4)
    # Two tight clusters of 50: each vector's soft neighbours are the 49 others of its cluster,
    # about evenly, and none of the other cluster: an entropy of log 49.
    clustered = torch.cat([torch.tensor([[0.98, 0.01, 0.01]]).repeat(50, 1),
                           torch.tensor([[0.01, 0.98, 0.01]]).repeat(50, 1)]) + 1e-3 * torch.rand(100, 3, generator=gen)
    assert soft_neighborhood_density(clustered).item() == pytest.approx(math.log(49), abs=0.01)


def predict_with(net):
    """G as evaluation calls it: its logits resampled to the size asked for (logits_at)."""
    return lambda x, size: F.interpolate(net(x), size=tuple(size), mode="bilinear", align_corners=False)


class Constant(nn.Module):
    """Logits that are the same at every pixel and for every image: certain, flip- and scale-invariant."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.tensor(logits)

    def forward(self, x):
        n, _, h, w = x.shape
        return self.logits.view(1, -1, 1, 1).expand(n, -1, h, w).clone()


def test_the_meter_on_a_network_that_never_changes_its_answer():
    net = Constant([4.0, 0.0, 0.0])
    meter = ProxyMeter(predict_with(net), "cpu", realness=lambda images, logits: torch.full((2, 1, 4, 4), 0.25))
    images = torch.randn(2, 3, 8, 8)
    meter.update(images, net(images))
    meter.all_reduce()
    scores = meter.compute()
    p = torch.tensor([4.0, 0.0, 0.0]).softmax(0)
    assert scores["proxy/entropy"] == pytest.approx(float(-(p * p.log()).sum() / math.log(3)), rel=1e-5)
    assert scores["proxy/flip_agreement"] == 1.0 and scores["proxy/scale_agreement"] == 1.0
    assert scores["proxy/d_confidence"] == pytest.approx(0.25)
    assert set(scores) == {"proxy/entropy", "proxy/flip_agreement", "proxy/scale_agreement", "proxy/snd",
                           "proxy/d_confidence"}
    without_d = ProxyMeter(predict_with(net), "cpu")
    without_d.update(images, net(images))
    without_d.all_reduce()
    assert "proxy/d_confidence" not in without_d.compute()


class LeftHalf(nn.Module):
    """Class 1 on the image's left half, 0 on its right: a flip turns every pixel's answer over."""

    def forward(self, x):
        n, _, h, w = x.shape
        logits = torch.zeros(n, 2, h, w)
        logits[:, 1, :, : w // 2] = 5.0
        logits[:, 0, :, w // 2:] = 5.0
        return logits


def test_flip_agreement_is_the_share_of_pixels_whose_answer_survives_the_mirror():
    net = LeftHalf()
    meter = ProxyMeter(predict_with(net), "cpu")
    images = torch.randn(1, 3, 8, 8)
    meter.update(images, net(images))
    meter.all_reduce()
    scores = meter.compute()
    assert scores["proxy/flip_agreement"] == 0.0
    assert scores["proxy/scale_agreement"] == 1.0  # resampled to the same size, the halves stay


def test_the_smaller_view_keeps_the_multiple_g_needs():
    meter = ProxyMeter(lambda x, size: x, "cpu", divisor=16)
    assert meter.smaller((32, 64)) == (16, 48)  # 24 and 48, down to multiples of 16
    assert ProxyMeter(lambda x, size: x, "cpu", divisor=8).smaller((80, 64)) == (56, 48)
    assert ProxyMeter(lambda x, size: x, "cpu").smaller((80, 64)) == (60, 48)


class TwoConvs(Generator):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_no_label_is_read_labels_all_ignore_give_the_same_scores():
    torch.manual_seed(0)
    net = TwoConvs()
    images = [torch.randn(2, 3, 16, 16) for _ in range(3)]
    labelled = [(x, torch.randint(0, 3, (2, 16, 16))) for x in images]
    ignored = [(x, torch.full((2, 16, 16), 255)) for x in images]
    a = evaluate(net, labelled, torch.device("cpu"), 3, proxies=True)
    b = evaluate(net, ignored, torch.device("cpu"), 3, proxies=True)
    assert a.proxies and a.proxies == b.proxies
    assert b.metrics["mIoU"] == 0.0  # nothing scored against labels there
    assert evaluate(net, labelled, torch.device("cpu"), 3).proxies == {}


def test_best_by_a_proxy_needs_images_without_labels_and_d_confidence_a_d():
    supervised = load_config(None, [*TINY_OVERRIDES, "method.name=supervised", "checkpoint.best_by=proxy/entropy"])
    with pytest.raises(UserError, match="checkpoint.best_by: proxy/entropy is a label-free score"):
        method_class("supervised").check_config(supervised)
    minent = load_config(None, [*TINY_OVERRIDES, TARGET_DATA, "method.name=minent",
                                "checkpoint.best_by=proxy/d_confidence"])
    with pytest.raises(UserError, match="trains no D"):
        method_class("minent").check_config(minent)
    ok = load_config(None, [*TINY_OVERRIDES, TARGET_DATA, "method.name=minent", "checkpoint.best_by=proxy/snd"])
    method_class("minent").check_config(ok)


def run_cfg(tmp_path, name, *extra):
    cfg = load_config(None, [*TINY_OVERRIDES, TARGET_DATA, "method.name=adaptsegnet", "train.max_steps=6",
                             "model.generator.aux_head=false", *extra])
    cfg.run_dir, cfg.device_map = str(tmp_path / name), "g:cpu,d:cpu"
    return cfg


def test_an_adaptation_run_logs_every_proxy_and_chooses_best_by_one(tmp_path, capsys):
    result = train(run_cfg(tmp_path, "run", "checkpoint.best_by=proxy/entropy"))
    run = tmp_path / "run"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluations = {r["step"]: r for r in lines if "val/mIoU" in r}
    assert sorted(evaluations) == [2, 4, 6]
    names = {"proxy/entropy", "proxy/flip_agreement", "proxy/scale_agreement", "proxy/snd", "proxy/d_confidence"}
    for record in evaluations.values():
        assert names <= set(record)
    entropy = {step: r["proxy/entropy"] for step, r in evaluations.items()}
    chosen = min(entropy, key=entropy.get)
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    assert best["by"] == "proxy/entropy" and best["step"] == chosen
    assert best["score"] == pytest.approx(entropy[chosen])
    assert best["mIoU"] == pytest.approx(evaluations[chosen]["val/mIoU"])
    assert result.best["step"] == chosen
    status = json.loads((run / "status.json").read_text())
    assert status["best"]["by"] == "proxy/entropy" and status["best"]["step"] == chosen
    assert set(status["final"]["proxies"]) == names

    from segadv.checkpoint.run_checkpoint import checkpoint_of_run

    found = checkpoint_of_run(run)
    assert found.path.name == "best.pt" and f"chosen by proxy/entropy" in found.note, found.note
