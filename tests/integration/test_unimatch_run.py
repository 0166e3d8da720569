"""UniMatch from the command line on each generator: a few steps of V1 and V2 on DeepLab-v2 and on
the DINOv2 G train, V2 with D on top; the DINOv2 G split into two stages (g:cpu/cpu, the feature
scales read on the head's stage) trains bitwise as the unsplit one; segadv-ckpt convert writes V2's
teacher."""

from __future__ import annotations

import pytest
import torch

from segadv.checkpoint import read_checkpoint
from segadv.cli.ckpt import main as ckpt_main
from segadv.cli.train import main as train_main

from conftest import TINY_OVERRIDES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = [*TINY_OVERRIDES, "method.name=unimatch", "method.unimatch.confidence=0.2", "train.max_steps=2",
         "train.eval_every=2", "train.log_every=1", "train.deterministic=true", "log.tensorboard=false",
         "data.labeled_fraction=0.5"]
DINOV2 = ["model.generator={arch: dinov2, encoder: vit_small_patch14_dinov2, depth: 2, head_features: 16, "
          "head_out_channels: [8, 16, 32, 64]}", "data.synthetic.image_size=42", "data.normalization=imagenet"]
DEEPLABV2 = ["model.generator={arch: deeplabv2, encoder: resnet18, encoder_weights: null}"]


def run(tmp_path, name, *extra):
    run_dir = tmp_path / name
    assert train_main(["--run-dir", str(run_dir), *SMALL, *extra]) == 0
    return read_checkpoint(run_dir / "checkpoints" / "last.pt"), run_dir


@pytest.mark.parametrize("generator", [DEEPLABV2, DINOV2], ids=["deeplabv2", "dinov2"])
@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_each_variant_trains_on_each_generator(tmp_path, generator, variant):
    saved, _ = run(tmp_path, "run", *generator, f"method.unimatch.variant={variant}", "loss.lambda_adv=0.01")
    assert ("teacher" in saved) == (variant == "v2") and "discriminator" in saved


def test_a_split_dinov2_g_trains_bitwise_as_the_unsplit_one(tmp_path):
    whole, _ = run(tmp_path, "whole", *DINOV2, "--device-map", "cpu")
    split, run_dir = run(tmp_path, "split", *DINOV2, "--device-map", "g:cpu/cpu")
    for role in ("generator", "teacher"):
        for key, tensor in whole[role].items():
            assert torch.equal(tensor, split[role][key]), (role, key)
    out = tmp_path / "teacher.pt"
    assert ckpt_main(["convert", str(run_dir / "checkpoints" / "last.pt"), "--output", str(out),
                      "--network", "teacher"]) == 0
    written = torch.load(out, map_location="cpu", weights_only=True)
    assert written.keys() == split["teacher"].keys()
    assert all(torch.equal(v, split["teacher"][k]) for k, v in written.items())
    assert any(not torch.equal(v, split["generator"][k]) for k, v in written.items())
