"""Every method trains on batches with nothing to select: labeled batches whose every pixel is
ignored (an all-void crop), pseudo labels of which no pixel is confident. Each of its losses stays
finite (the selection losses 0), the step reads nothing on the host, and each selection loss it
returns comes with its ``empty/<loss>`` at 1, the count the training log shows."""

from __future__ import annotations

import math

import pytest
import torch

from segadv.config import load_config
from segadv.engine.losses import EMPTY_PREFIX
from segadv.methods import method_class
from segadv.parallel import parse_device_map
from segadv.training.build import build_training

from conftest import TINY_OVERRIDES
from helpers import UDA_OVERRIDES, FixedStream, NoHostReads, exempt_optimizer_steps

# Each method with every selection it has made empty: the labels wholly ignored (below), and where
# it selects pseudo labels, a confidence threshold no pixel or image reaches.
CASES = {
    "supervised": [*TINY_OVERRIDES],
    "advsemiseg": [*TINY_OVERRIDES, "method.name=advsemiseg", "method.advsemiseg.semi_start=0",
                   "method.advsemiseg.mask_threshold=1.0"],
    "s4gan": [*TINY_OVERRIDES, "method.name=s4gan", "model.discriminator.kind=image", "method.s4gan.st_start=0",
              "method.s4gan.threshold=1.0"],
    "mean_teacher with D": [*TINY_OVERRIDES, "method.name=mean_teacher", "loss.lambda_adv=0.01"],
    "unimatch v1 with D": [*TINY_OVERRIDES, "method.name=unimatch", "loss.lambda_adv=0.01",
                           "method.unimatch.confidence=1.0"],
    "unimatch v2": [*TINY_OVERRIDES, "method.name=unimatch", "method.unimatch.variant=v2",
                    "method.unimatch.confidence=1.0"],
    "adaptsegnet, two levels": UDA_OVERRIDES,
    "advent": [*UDA_OVERRIDES, "method.name=advent"],
    "minent": [*UDA_OVERRIDES, "method.name=minent", "loss.lambda_adv=0"],
}


def nothing_labelled_streams(cfg, method):
    """Each stream the method draws: labeled ones with every pixel ``data.ignore_index``."""
    size, sizes = cfg.data.synthetic.image_size, method.stream_batch_sizes(cfg)
    streams = {}
    for spec in method.data_streams(cfg):
        images = torch.randn(sizes[spec.name], 3, size, size, generator=torch.Generator().manual_seed(len(streams)))
        labels = torch.full((sizes[spec.name], size, size), cfg.data.ignore_index)
        streams[spec.name] = FixedStream((images, labels) if spec.pool == "labeled" else images)
    return streams


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_a_step_with_nothing_selected_is_finite_and_counts_its_empty_selections(overrides):
    cfg = load_config(None, overrides)
    method = method_class(cfg.method.name)
    parts = build_training(cfg, parse_device_map("cpu"))
    streams = nothing_labelled_streams(cfg, method)
    mode = NoHostReads()
    exempt_optimizer_steps(parts, mode)
    with mode:
        outs = [parts.step(streams, step=step) for step in range(2)]
    for out in outs:
        assert {name: value.item() for name, value in out.items() if not math.isfinite(value.item())} == {}
        selections = [name for name in method.selection_losses if name in out]
        assert "loss_seg" in selections
        assert {name: out[EMPTY_PREFIX + name].item() for name in selections} == {name: 1.0 for name in selections}
        assert out["loss_seg"].item() == 0.0
        assert set(out) - set(method.losses) == {EMPTY_PREFIX + name for name in selections}
    for net in parts.networks():
        assert all(torch.isfinite(p).all() for p in net.module.parameters()), net.role


def test_a_labelled_batch_counts_no_empty_selection():
    """The count is not always 1: the same step on labelled pixels, confident pseudo labels."""
    cfg = load_config(None, CASES["advsemiseg"][:-1] + ["method.advsemiseg.mask_threshold=0.0"])
    method = method_class(cfg.method.name)
    parts = build_training(cfg, parse_device_map("cpu"))
    streams = nothing_labelled_streams(cfg, method)
    for name in ("labeled", "gt"):
        images, labels = streams[name].batch
        streams[name] = FixedStream((images, torch.zeros_like(labels)))
    out = parts.step(streams, step=0)
    assert {name: out[EMPTY_PREFIX + name].item() for name in method.selection_losses} == \
        {name: 0.0 for name in method.selection_losses}
    assert out["loss_seg"].item() > 0 and out["loss_semi"].item() > 0
