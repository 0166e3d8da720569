"""The DINOv2 generator end to end on the CPU, through the command lines: configs/dinov2_tiny.yaml
with the mean teacher and an adversarial D trains, saves, resumes bitwise into another run dir,
evaluates and exports to ONNX; a local weight file in timm's layout loads strictly through the
config, and the files, names and sizes it cannot take are refused (exit 2, the culprit named).

Shrunk by overrides: ViT-S cut to 2 blocks, a narrow DPT head, 42 px images (3 x 3 patches),
8 samples per domain, batches of 2, 4 steps: about ten seconds a run on one thread.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import vit_runs
from helpers import assert_refused
from segadv.checkpoint import read_checkpoint
from segadv.cli import eval as eval_cli
from segadv.cli import export as export_cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZE = 42  # a multiple of DINOv2's patch (14)
DEPTH = 2
COMMAND = vit_runs.command("dinov2_tiny")
SMALL = vit_runs.small(SIZE, DEPTH)
NETWORKS = ("generator", "teacher", "discriminator")


def train(run_dir: Path, *extra: str, command=COMMAND) -> int:
    return vit_runs.train(command, SMALL, run_dir, *extra)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, one_torch_thread):
    return vit_runs.trained(tmp_path_factory.mktemp("dinov2") / "full", COMMAND, SMALL)


def test_the_tiny_dinov2_mean_teacher_run_trains_saves_and_saves_each_network(full_run):
    ckpt = read_checkpoint(full_run / "checkpoints" / "last.pt")
    assert ckpt["step"] == 4
    assert ckpt["config"]["model"]["generator"]["arch"] == "dinov2"
    mid = read_checkpoint(full_run / "checkpoints" / "step_2.pt")
    for net in NETWORKS:
        assert ckpt[net].keys() == mid[net].keys()
        moved = [k for k in ckpt[net] if ckpt[net][k].is_floating_point() and not torch.equal(ckpt[net][k], mid[net][k])]
        assert moved, f"the {net} did not change between steps 2 and 4"
    blocks = {k.split(".")[2] for k in ckpt["generator"] if k.startswith("encoder.blocks.")}
    assert blocks == {str(i) for i in range(DEPTH)}


def test_a_resume_from_the_mid_run_checkpoint_into_a_new_run_dir_ends_bitwise_where_the_run_ended(full_run, tmp_path):
    resumed = tmp_path / "resumed"
    assert train(resumed, "--resume", str(full_run / "checkpoints" / "step_2.pt")) == 0
    steps = [json.loads(line).get("step") for line in (resumed / "metrics.jsonl").read_text().splitlines()
             if "train/loss_seg" in line]
    assert sorted(set(steps)) == [3, 4]  # continued from step 2, not started over
    ours, theirs = (read_checkpoint(d / "checkpoints" / "last.pt") for d in (resumed, full_run))
    assert ours["step"] == theirs["step"] == 4
    for net in NETWORKS:
        assert ours[net].keys() == theirs[net].keys()
        differ = [k for k in theirs[net] if not torch.equal(ours[net][k], theirs[net][k])]
        assert not differ, f"{net}: {len(differ)} tensors differ from the uninterrupted run's, e.g. {differ[:3]}"


def test_eval_reads_the_dinov2_run(full_run, capsys):
    capsys.readouterr()
    assert eval_cli.main(["--checkpoint", str(full_run), "--device", "cpu", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.0 <= metrics["mIoU"] <= 1.0 and 0.0 <= metrics["pixel_acc"] <= 1.0
    final = [json.loads(line) for line in (full_run / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in final if "val/mIoU" in r][-1]
    assert metrics["mIoU"] == pytest.approx(final["val/mIoU"], abs=1e-9)


def test_the_onnx_export_is_static_verified_and_runs_in_onnxruntime(full_run, tmp_path, caplog):
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / "g.onnx"
    with caplog.at_level("INFO"):
        assert export_cli.main(["--checkpoint", str(full_run / "checkpoints" / "last.pt"), "--output", str(out),
                               "--input-size", str(SIZE), str(SIZE)]) == 0
    assert f"exported and verified at {SIZE}x{SIZE} only" in caplog.text  # one input size, said so
    assert json.loads((tmp_path / "g.onnx.json").read_text())["input"]["dynamic_axes"] == []  # static, in the sidecar
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    x = np.random.default_rng(0).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
    (logits,) = session.run(None, {inp.name: x})
    assert logits.shape == (1, 5, SIZE, SIZE) and np.isfinite(logits).all()


# ----------------------------------------------------------------------------------- weights


@pytest.fixture(scope="module")
def timm_weights(tmp_path_factory):
    """A random timm DINOv2 ViT-S/14 at the config's depth, saved as timm's state dict."""
    import timm

    torch.manual_seed(3)
    model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, img_size=518, depth=DEPTH)
    path = tmp_path_factory.mktemp("weights") / "vits14_depth2.pth"
    state = model.state_dict()
    torch.save(state, path)
    return path, state


def test_a_local_timm_dinov2_file_loads_strictly_into_the_encoder(timm_weights, tmp_path):
    """The run's own build (segadv.training.build.build_training, what segadv-train calls) reads the
    file into G's encoder: every tensor equal to the file's."""
    from segadv.config import load_config
    from segadv.parallel import parse_device_map
    from segadv.parallel.placement import unwrap
    from segadv.training.build import build_training

    path, state = timm_weights
    cfg = load_config("dinov2_tiny", ["method.name=mean_teacher", "loss.lambda_adv=0.001", *SMALL,
                                      f"model.generator.encoder_weights={path}"])
    cfg.run_dir = str(tmp_path / "run")
    parts = build_training(cfg, parse_device_map("g:cpu,d:cpu,t:cpu"))
    encoder = unwrap(parts.g.module).encoder.state_dict()
    expected = {k: v for k, v in state.items() if not k.startswith("head.")}  # timm's (identity) classifier
    assert encoder.keys() == expected.keys()
    differ = [k for k in expected if not torch.equal(encoder[k], expected[k])]
    assert not differ, f"{len(differ)} encoder tensors differ from the file's, e.g. {differ[:3]}"
    # and a fresh build without the file does not happen to hold them (the seed is the run's)
    cfg_plain = load_config("dinov2_tiny", ["method.name=mean_teacher", "loss.lambda_adv=0.001", *SMALL])
    cfg_plain.run_dir = str(tmp_path / "plain")
    plain = unwrap(build_training(cfg_plain, parse_device_map("g:cpu,d:cpu,t:cpu")).g.module).encoder.state_dict()
    assert not torch.equal(plain["blocks.0.attn.qkv.weight"], expected["blocks.0.attn.qkv.weight"])


def test_a_file_missing_one_key_is_refused_naming_it(timm_weights, tmp_path, capsys):
    path, state = timm_weights
    damaged = tmp_path / "missing.pth"
    torch.save({k: v for k, v in state.items() if k != "blocks.1.attn.proj.weight"}, damaged)
    capsys.readouterr()
    code = train(tmp_path / "run", f"model.generator.encoder_weights={damaged}", "train.max_steps=1")
    assert_refused(capsys, code, "blocks.1.attn.proj.weight", str(damaged.name))
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def test_imagenet_weights_for_dinov2_are_refused_saying_it_reads_a_local_file(tmp_path, capsys):
    capsys.readouterr()
    code = train(tmp_path / "run", "model.generator.encoder_weights=imagenet", "train.max_steps=1")
    assert_refused(capsys, code, "encoder_weights", "local file")


@pytest.mark.parametrize("key", ["data.synthetic.image_size", "target_data.synthetic.image_size"])
def test_an_input_of_520_px_is_refused_naming_the_patch_and_the_key_before_any_step(key, tmp_path, capsys):
    capsys.readouterr()
    code = train(tmp_path / "run", f"{key}=520", "train.max_steps=1")
    assert_refused(capsys, code, "520", "patch size 14", key)
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or "train/loss_seg" not in metrics.read_text()  # no step ran
    assert not list((tmp_path / "run").glob("checkpoints/*.pt"))


def test_val_images_that_are_no_patch_multiple_are_refused_at_start_naming_the_split_and_the_fix(tmp_path, capsys):
    """60 px folder images with 56 px training crops: the crops fit the patch, the val images (at
    their own size) do not. Refused before the run dir exists, not at the first evaluation; the
    fixes named (data.val_resize_to_multiple, data.val_input_size, or a pad to a multiple) pass the
    same start checks."""
    from data_builders import make_folder

    from segadv.config import load_config
    from segadv.parallel import parse_device_map
    from segadv.training import preflight

    make_folder(tmp_path / "data", n_train=4, n_val=3, num_classes=3, h=60, w=60)
    folder = ["method.name=supervised", "target_data=null", "data.kind=folder", f"data.root={tmp_path / 'data'}",
              "data.num_classes=3", "data.train_transforms=[{name: RandomCrop, height: 56, width: 56}]"]
    capsys.readouterr()
    code = train(tmp_path / "run", *folder, command=COMMAND[:2] + ["--device-map", "g:cpu,d:cpu"])
    assert_refused(capsys, code, "the val split of data (3 of its 3 images, the first 'val_000' of 60x60 px): 60x60 "
                                 "is not a multiple of DINOv2's patch size 14", "set data.val_resize_to_multiple: true",
                   "data.val_input_size: [56, 56]",
                   "data.val_transforms: [..., {name: PadIfNeeded, min_height: null, min_width: null, "
                   "pad_height_divisor: 14, pad_width_divisor: 14, position: top_left}]")
    assert not (tmp_path / "run").exists()
    for fix in ("data.val_resize_to_multiple=true", "data.val_input_size=[56, 56]", "data.val_transforms=[{name: PadIfNeeded, min_height: null, "
                "min_width: null, pad_height_divisor: 14, pad_width_divisor: 14, position: top_left}]"):
        cfg = load_config("dinov2_tiny", [*SMALL, *folder, fix])
        preflight.check_start(cfg, None, parse_device_map("g:cpu,d:cpu"))


def test_val_images_resized_to_the_patch_are_scored_alike_by_the_run_and_segadv_eval(tmp_path, capsys,
                                                                                        logits_at_calls):
    """data.val_resize_to_multiple (UniMatch V2's evaluation) on 37x53 folder images: G sees them
    at 42x56, its logits go back to 37x53, and segadv-eval scores the checkpoint as the run did."""
    from data_builders import make_folder

    seen = logits_at_calls
    make_folder(tmp_path / "data", n_train=4, n_val=3, num_classes=3, h=37, w=53)
    folder = ["method.name=supervised", "target_data=null", "data.kind=folder", f"data.root={tmp_path / 'data'}",
              "data.num_classes=3", "data.train_transforms=[{name: RandomCrop, height: 28, width: 28}]",
              "data.val_resize_to_multiple=true"]
    assert train(tmp_path / "run", *folder, command=COMMAND[:2] + ["--device-map", "g:cpu,d:cpu"]) == 0
    assert seen and set(seen) == {((42, 56), (37, 53))}
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    score = [r["val/mIoU"] for r in records if "val/mIoU" in r][-1]

    seen.clear()
    capsys.readouterr()
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    assert eval_cli.main(["--checkpoint", str(checkpoint), "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mIoU"] == pytest.approx(score, abs=1e-9)
    assert seen and set(seen) == {((42, 56), (37, 53))}


def test_the_static_onnx_graph_declares_the_size_it_was_traced_at(full_run, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / "g.onnx"
    assert export_cli.main(["--checkpoint", str(full_run / "checkpoints" / "last.pt"), "--output", str(out),
                            "--input-size", str(SIZE), str(SIZE)]) == 0
    (inp,) = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).get_inputs()
    assert list(inp.shape) == [1, 3, SIZE, SIZE]


# ----------------------------------------------------------------------------------- a split G


def test_a_dinov2_generator_split_over_two_host_stages_trains_the_unsplit_runs_weights(full_run, tmp_path):
    """``--device-map g:cpu/cpu,d:cpu`` (segadv/models/vit/split.py: the blocks over two pipeline
    stages, on the host) runs the unsplit G's kernels in the same order: after 4 steps of the whole
    run (the teacher's EMA, D, the optimizers) G, the teacher and D equal the ``g:cpu,d:cpu,t:cpu``
    run's bitwise. (One step against the plain loop: test_equivalence.py's
    test_a_dinov2_generator_split_into_stages_matches_the_plain_loop.) With TensorBoard on, the
    split run draws its last mixed batch (on G's first stage's device) and trains the same."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    command = [*COMMAND[:-1], "g:cpu/cpu,d:cpu"]
    assert train(tmp_path / "split", "log.tensorboard=true", command=command) == 0
    events = EventAccumulator(str(tmp_path / "split" / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    [panel] = events.Images("train/mixed_batch")
    assert panel.step == 4 and panel.width == 3 * (SIZE + 2) + 2
    ours, theirs = (read_checkpoint(d / "checkpoints" / "last.pt") for d in (tmp_path / "split", full_run))
    assert "generator on cpu/cpu" in (tmp_path / "split" / "train.log").read_text()  # two stages
    for net in NETWORKS:
        assert ours[net].keys() == theirs[net].keys()
        differ = [k for k in theirs[net] if not torch.equal(ours[net][k], theirs[net][k])]
        assert not differ, f"{net}: {len(differ)} tensors differ from the unsplit run's, e.g. {differ[:3]}"
