"""The DINOv3 G split over two pipeline stages on the host, through the command line:
``segadv-train --config dinov3_tiny ... --device-map g:cpu/cpu,d:cpu`` (segadv/models/vit/split.py:
the embedding, the rotary periods and block 0 on the first stage, block 1, the norm and the head on
the second; the mean teacher follows G's placement) trains G, the teacher and D bitwise as the
unsplit ``g:cpu,d:cpu,t:cpu`` run does: the same kernels in the same order. Shrunk as
tests/integration/test_dinov3_run.py's run (2 blocks, 48 px, 4 steps)."""

from __future__ import annotations

import pytest
import torch

import vit_runs
from segadv.checkpoint import read_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMMAND = vit_runs.command("dinov3_tiny")
SMALL = vit_runs.small(48)
NETWORKS = ("generator", "teacher", "discriminator")


def test_a_dinov3_generator_split_over_two_host_stages_trains_the_unsplit_runs_weights(tmp_path):
    whole = vit_runs.trained(tmp_path / "whole", COMMAND, SMALL)
    split = vit_runs.trained(tmp_path / "split", [*COMMAND[:-1], "g:cpu/cpu,d:cpu"], SMALL)
    assert "generator on cpu/cpu" in (split / "train.log").read_text()  # two stages
    ours, theirs = (read_checkpoint(d / "checkpoints" / "last.pt") for d in (split, whole))
    assert ours["step"] == theirs["step"] == 4
    for net in NETWORKS:
        assert ours[net].keys() == theirs[net].keys()
        differ = [k for k in theirs[net] if not torch.equal(ours[net][k], theirs[net][k])]
        assert not differ, f"{net}: {len(differ)} tensors differ from the unsplit run's, e.g. {differ[:3]}"
