"""segadv-plan of a generator split into pipeline stages (``g:0/1,d:1``): each stage's weights and
activations on its own device, the hand-overs between stages in "between devices", and a split
that puts a block on a device the map does not name caught."""

import pytest
import torch

from conftest import TINY_OVERRIDES, needs_planner_torch
from pipeline_toy import ToySplitG, use_toy_generator
from segadv.config import load_config
from segadv.models import build_discriminator
from segadv.parallel.pipeline import balanced_boundaries
from segadv.plan.accounting import PlacementError
from segadv.plan.dry_run import dry_run

pytestmark = needs_planner_torch


def planned(device_map, *overrides):
    return dry_run(load_config(None, [*TINY_OVERRIDES, f"device_map={device_map}", *overrides]), steps=1)


def state_bytes(*modules):
    return sum(t.numel() * t.element_size() for m in modules for t in [*m.parameters(), *m.buffers()])


@pytest.mark.parametrize("channels_last", ["false", "true"])
def test_each_stage_is_planned_on_its_own_device(monkeypatch, channels_last):
    use_toy_generator(monkeypatch)
    cfg = load_config(None, TINY_OVERRIDES)
    g, d = ToySplitG(cfg.data.num_classes), build_discriminator(cfg.model.discriminator, cfg.data.num_classes)
    (cut,) = balanced_boundaries([sum(p.numel() for p in b.parameters()) for b in g.blocks], 2)
    plan = planned("g:0/1,d:1", f"train.channels_last={channels_last}")
    assert list(plan.devices) == ["cuda:0", "cuda:1"]
    # The map's stages hold exactly their blocks: the stem and the first blocks on cuda:0; the
    # rest, the head and D on cuda:1.
    assert plan.devices["cuda:0"].params_bytes == state_bytes(g.stem, *g.blocks[:cut])
    assert plan.devices["cuda:1"].params_bytes == state_bytes(*g.blocks[cut:], g.head, d)
    first, last = plan.devices["cuda:0"], plan.devices["cuda:1"]
    assert first.grads_bytes > 0 and first.activations_bytes > 0 and first.peak_bytes > first.params_bytes
    assert last.flops_per_iteration > 0 and first.flops_per_iteration > 0

    # Between the devices: the images onto the first stage (they come to G's output device with
    # the labels), the activation handed to the second stage and its gradient back. Unsplit on
    # one device, nothing crosses.
    images = cfg.data.batch_size * 3 * 64 * 64 * 4
    activation = cfg.data.batch_size * g.blocks[0][0].out_channels * 64 * 64 * 4
    assert plan.transfer_bytes_per_iteration == images + 2 * activation
    assert planned("g:1,d:1").transfer_bytes_per_iteration == 0


def test_a_split_that_puts_a_block_on_a_third_gpu_is_caught(monkeypatch):
    use_toy_generator(monkeypatch)
    real = ToySplitG.split

    def astray(self, stage_devices, boundaries=None):
        last, move = self.blocks[-1], self.blocks[-1].to
        # The split sends its last block to cuda:2, which the map does not name.
        last.to = lambda device, *args, **kwargs: move(torch.device(device.type, 2), *args, **kwargs)
        real(self, stage_devices, boundaries)

    monkeypatch.setattr(ToySplitG, "split", astray)
    with pytest.raises(PlacementError, match=r"placement: the generator's blocks\.3\.0\.weight is on cuda:2, which "
                                             r"the device map does not give it \(cuda:0, cuda:1\)"):
        planned("g:0/1,d:1")


def test_a_forward_that_does_not_hand_its_input_to_the_first_stage_is_caught(monkeypatch):
    """The loop's images come to G's output device (the last stage's): a split network's forward
    must move them to its first stage itself."""
    use_toy_generator(monkeypatch)
    real = ToySplitG.forward

    def forgetful(self, x):
        stages, self._stages = self._stages, ()
        try:
            x = self.stem(x)  # the input stays on cuda:1, the stem's weights are on cuda:0
        finally:
            self._stages = stages
        return real(self, x)

    monkeypatch.setattr(ToySplitG, "forward", forgetful)
    with pytest.raises(PlacementError, match=r"mixes devices cuda:0, cuda:1\n  at "):
        planned("g:0/1,d:1")


# In a process of its own: torch gives some warnings once per process, so one an earlier test
# set off would not be seen again here.
PLAN_RECORDING_WARNINGS = """
import json, sys, warnings
from segadv.config import load_config
from segadv.plan.dry_run import dry_run

with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    dry_run(load_config("dinov2_tiny", ["device_map=g:0/1,d:1", "data.batch_size=2", "data.synthetic.image_size=56"]),
            steps=1)
print(json.dumps([f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}" for w in seen]))
"""


def test_planning_a_split_dinov2_generator_raises_no_warning():
    """The stand-ins' fake tensors never have their bytes read: domain adaptation's own random
    stream (a hash of the CPU generator's state) took a fake copy's, which torch warns of."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", PLAN_RECORDING_WARNINGS], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
