"""The DINOv3 generator end to end on the CPU, through the command lines: configs/dinov3_tiny.yaml
with the mean teacher and an adversarial D trains, resumes bitwise into another run dir, evaluates
and exports to ONNX; a local timm-layout file loads strictly through the config; a size that is no
multiple of the patch (16) is refused naming the key.

Shrunk by overrides: ViT-S/16 cut to 2 blocks, a narrow head, 48 px images (3 x 3 patches),
8 samples per domain, batches of 2, 4 steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import vit_runs
from segadv.checkpoint import read_checkpoint
from segadv.cli import eval as eval_cli
from segadv.cli import export as export_cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZE = 48  # a multiple of DINOv3's patch (16)
DEPTH = 2
COMMAND = vit_runs.command("dinov3_tiny")
SMALL = vit_runs.small(SIZE, DEPTH)
NETWORKS = ("generator", "teacher", "discriminator")


def train(run_dir: Path, *extra: str) -> int:
    return vit_runs.train(COMMAND, SMALL, run_dir, *extra)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, one_torch_thread):
    return vit_runs.trained(tmp_path_factory.mktemp("dinov3") / "full", COMMAND, SMALL)


def test_the_tiny_dinov3_run_trains_every_network(full_run):
    ckpt, mid = (read_checkpoint(full_run / "checkpoints" / name) for name in ("last.pt", "step_2.pt"))
    assert ckpt["step"] == 4 and ckpt["config"]["model"]["generator"]["arch"] == "dinov3"
    for net in NETWORKS:
        assert ckpt[net].keys() == mid[net].keys()
        assert [k for k in ckpt[net] if ckpt[net][k].is_floating_point() and not torch.equal(ckpt[net][k], mid[net][k])]
    assert {k.split(".")[2] for k in ckpt["generator"] if k.startswith("encoder.blocks.")} == {"0", "1"}


def test_a_resume_into_a_new_run_dir_ends_bitwise_where_the_run_ended(full_run, tmp_path):
    resumed = tmp_path / "resumed"
    assert train(resumed, "--resume", str(full_run / "checkpoints" / "step_2.pt")) == 0
    ours, theirs = (read_checkpoint(d / "checkpoints" / "last.pt") for d in (resumed, full_run))
    assert ours["step"] == theirs["step"] == 4
    for net in NETWORKS:
        differ = [k for k in theirs[net] if not torch.equal(ours[net][k], theirs[net][k])]
        assert not differ, f"{net}: {len(differ)} tensors differ, e.g. {differ[:3]}"


def test_eval_and_the_static_onnx_export_read_the_run(full_run, tmp_path, capsys, caplog):
    ort = pytest.importorskip("onnxruntime")
    capsys.readouterr()
    assert eval_cli.main(["--checkpoint", str(full_run), "--device", "cpu", "--json"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["mIoU"] <= 1.0
    out = tmp_path / "g.onnx"
    with caplog.at_level("INFO"):
        assert export_cli.main(["--checkpoint", str(full_run / "checkpoints" / "last.pt"), "--output", str(out),
                               "--input-size", str(SIZE), str(SIZE)]) == 0
    assert f"exported and verified at {SIZE}x{SIZE} only" in caplog.text
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    x = np.random.default_rng(0).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
    (logits,) = session.run(None, {inp.name: x})
    assert logits.shape == (1, 5, SIZE, SIZE) and np.isfinite(logits).all()


def test_a_local_timm_file_loads_strictly_through_the_config(tmp_path):
    import timm

    from segadv.config import load_config
    from segadv.parallel import parse_device_map
    from segadv.parallel.placement import unwrap
    from segadv.training.build import build_training

    torch.manual_seed(3)
    state = timm.create_model("vit_small_patch16_dinov3", pretrained=False, num_classes=0, depth=DEPTH).state_dict()
    path = tmp_path / "vits16_depth2.pth"
    torch.save(state, path)
    cfg = load_config("dinov3_tiny", ["method.name=mean_teacher", "loss.lambda_adv=0.001", *SMALL,
                                      f"model.generator.encoder_weights={path}"])
    cfg.run_dir = str(tmp_path / "run")
    encoder = unwrap(build_training(cfg, parse_device_map("g:cpu,d:cpu,t:cpu")).g.module).encoder.state_dict()
    assert encoder.keys() == state.keys()
    assert all(torch.equal(encoder[k], state[k]) for k in state)


@pytest.mark.parametrize("key", ["data.synthetic.image_size", "target_data.synthetic.image_size"])
def test_an_input_of_56_px_is_refused_naming_the_patch_and_the_key(key, tmp_path, capsys):
    capsys.readouterr()
    code = train(tmp_path / "run", f"{key}=56", "train.max_steps=1")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "56" in err and "patch size 16" in err and key in err


def test_with_freeze_encoder_the_encoder_stays_while_the_head_trains(tmp_path):
    run_dir = tmp_path / "frozen"
    assert train(run_dir, "model.generator.freeze_encoder=true") == 0
    mid, last = (read_checkpoint(run_dir / "checkpoints" / name)["generator"] for name in ("step_2.pt", "last.pt"))
    encoder = [k for k in last if k.startswith("encoder.")]
    assert encoder and all(torch.equal(mid[k], last[k]) for k in encoder)
    assert any(not torch.equal(mid[k], last[k]) for k in last if k.startswith("head."))
