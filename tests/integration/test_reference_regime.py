"""The references' regime (issue 42): DeepLab-v2 with BatchNorm frozen trains at batch 1, exports
and resumes bitwise, as

    segadv-train model.generator.arch=deeplabv2 model.generator.norm=frozen data.batch_size=1 train.max_steps=3

on the tiny config (the tests' small encoder at output stride 8)."""

import json

import onnxruntime as ort
import pytest
import torch

from segadv.checkpoint import read_checkpoint
from segadv.cli import export as export_cli
from segadv.training.loop import train

from helpers import per_step_losses, resume_cfg

REGIME = ["model.generator.arch=deeplabv2", "model.generator.norm=frozen", "data.batch_size=1",
          "model.generator.output_stride=8"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_deeplabv2_frozen_batch_one_trains_and_exports(tmp_path):
    result = train(resume_cfg(tmp_path, "run", *REGIME, "train.max_steps=3"))
    assert result.step == 3 and result.stopped_by is None
    ckpt = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    g = ckpt["generator"]
    assert any(k.startswith("segmentation_head.0.branches.") for k in g)
    # Frozen: no BatchNorm counted a batch, and from scratch its statistics are still torch's initial ones.
    tracked = [v for k, v in g.items() if k.endswith("num_batches_tracked")]
    assert tracked and all(int(v) == 0 for v in tracked)
    assert all(torch.equal(v, torch.zeros_like(v)) for k, v in g.items() if k.endswith("running_mean"))

    output = tmp_path / "g.onnx"
    assert export_cli.main(["--checkpoint", str(tmp_path / "run" / "checkpoints" / "last.pt"),
                            "--output", str(output)]) == 0  # verified against PyTorch by the export itself
    sidecar = json.loads((tmp_path / "g.onnx.json").read_text())
    assert sidecar["generator"]["arch"] == "deeplabv2"
    session = ort.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {session.get_inputs()[0].name: torch.randn(1, 3, 64, 64).numpy()})
    assert logits.shape == (1, 5, 64, 64)


def test_deeplabv2_frozen_batch_one_resumes_bitwise(tmp_path):
    """6 steps in one go vs 4, stop, resume for 2: identical per-step losses, bitwise."""
    full = train(resume_cfg(tmp_path, "full", *REGIME))
    first = train(resume_cfg(tmp_path, "split", *REGIME), stop_at=4)
    assert (full.step, first.step, first.stopped_by) == (6, 4, "stop_at")
    second = train(resume_cfg(tmp_path, "split", *REGIME), resume="auto")
    assert second.step == 6
    expected, got = per_step_losses(full.run_dir), per_step_losses(second.run_dir)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    assert got == expected


def test_multi_level_adaptsegnet_trains_at_one_plus_one_with_the_references_batchnorm(tmp_path):
    """configs/adaptsegnet_gta5_cityscapes_reference.yaml's G on the tiny data: DeepLab-v2 with the
    two-branch classifier on both levels, BatchNorm's affine fixed and its statistics updating,
    batch 1 + 1, two Ds."""
    from segadv.config import load_config

    from helpers import UDA_OVERRIDES

    cfg = load_config(None, [*UDA_OVERRIDES, *REGIME[:1], "model.generator.norm=frozen_affine", "data.batch_size=1",
                             "model.generator.output_stride=8", "model.generator.aspp_v2_rates=early_return",
                             "train.max_steps=2", "train.eval_every=2", "log.tensorboard=false"])
    cfg.run_dir, cfg.device_map = str(tmp_path / "uda"), "cpu"
    assert train(cfg).step == 2
    g = read_checkpoint(tmp_path / "uda" / "checkpoints" / "last.pt")["generator"]
    assert {k for k in g if k.startswith("aux_head.branches.")} == {
        f"aux_head.branches.{i}.{p}" for i in (0, 1) for p in ("weight", "bias")}
    tracked = [int(v) for k, v in g.items() if k.endswith("num_batches_tracked")]
    assert tracked and all(n == 4 for n in tracked)  # two steps, a source and a target forward each
