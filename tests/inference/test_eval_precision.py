"""segadv-eval scores a checkpoint in the precision its run's evaluations used (the config's
``amp.generator``, ``auto`` resolved as training resolves it): the run's best.json mIoU, to every
digit; ``amp.generator.enabled=false`` forces float32 (segadv/inference/precision.py).
segadv-predict --checkpoint predicts in that precision too, and says which."""

import json

import numpy as np
from PIL import Image

import pytest
import torch

from segadv.cli import eval as eval_cli
from segadv.cli import predict as predict_cli
from segadv.cli import train as train_cli
from segadv.config import load_config
from segadv.engine import amp_optimizer
from segadv.inference.scoring import evaluation_precision

from conftest import TINY_OVERRIDES

# bf16 autocast set outright (not auto), so the run evaluates in bf16 on any CPU. After 6 steps
# this G's val predictions have pixels near a class boundary: float32 moves some of them.
BF16_RUN = [o for o in TINY_OVERRIDES if not o.startswith("amp.generator")] + [
    "amp.generator.enabled=true", "amp.generator.dtype=bfloat16",
    "train.max_steps=6", "train.eval_every=6", "checkpoint.every=6"]


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bf16") / "run"
    assert train_cli.main(["--run-dir", str(run_dir), "--device-map", "g:cpu,d:cpu", *BF16_RUN]) == 0
    return run_dir


def eval_json(capsys, *argv):
    assert eval_cli.main(["--checkpoint", *argv, "--device", "cpu", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_scores_the_run_dir_as_its_run_did(bf16_run, capsys):
    best = json.loads((bf16_run / "checkpoints" / "best.json").read_text())
    scored = eval_json(capsys, str(bf16_run))
    assert scored["precision"] == "bfloat16"
    assert scored["step"] == best["step"]
    assert scored["mIoU"] == best["mIoU"]  # every digit best.json holds

    assert eval_cli.main(["--checkpoint", str(bf16_run), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "precision  bfloat16 (amp.generator.enabled: true, dtype bfloat16)" in out
    assert f"mIoU       {best['mIoU']:.4f}\n" in out


def test_float32_is_forced_by_the_amp_key_and_scores_otherwise(bf16_run, capsys):
    run_precision = eval_json(capsys, str(bf16_run))
    forced = eval_json(capsys, str(bf16_run), "amp.generator.enabled=false")
    assert forced["precision"] == "float32"
    # the precision is what moved the scores: same G, same val split
    assert forced["confusion_matrix"]["rows"] != run_precision["confusion_matrix"]["rows"]


@pytest.mark.parametrize("features, expected", [((), "float32"), (("avx512_bf16",), "bfloat16")])
def test_auto_resolves_on_the_eval_device_as_training_does(monkeypatch, features, expected):
    monkeypatch.setattr(amp_optimizer, "cpu_bf16_features", lambda: features)
    monkeypatch.setattr(amp_optimizer, "onednn_isa_cap", lambda: None)  # the features decide, not this run's cap
    cfg = load_config(None, ["amp.generator.enabled=auto"])
    precision = evaluation_precision(cfg, "student", torch.device("cpu"))
    assert precision.name == expected
    assert precision.why.startswith("amp.generator.enabled: auto -> " + ("bf16" if features else "off"))
    with precision.autocast():
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == (torch.bfloat16 if features else torch.float32)


def test_the_teacher_runs_under_its_own_amp_else_the_generators():
    device = torch.device("cpu")
    cfg = load_config(None, ["amp.generator.enabled=true"])
    assert evaluation_precision(cfg, "teacher", device).key == "amp.generator.enabled"
    assert evaluation_precision(cfg, "teacher", device).name == "bfloat16"
    cfg = load_config(None, ["amp.generator.enabled=true", "amp.teacher.enabled=false"])
    teacher = evaluation_precision(cfg, "teacher", device)
    assert (teacher.key, teacher.name) == ("amp.teacher.enabled", "float32")


def test_predict_runs_a_checkpoint_in_its_runs_evaluation_precision(bf16_run, tmp_path, capsys):
    """The run's val images segmented: under the run's bf16 autocast the masks are G's argmax in
    bf16, with amp.generator.enabled=false its argmax in float32, and the two differ (this G has
    pixels near a class boundary); the console says which precision ran."""
    from segadv.checkpoint.inference import load_generator
    from segadv.data.bundle import build_val_dataset
    from segadv.export.sidecar import prepare_input

    loaded = load_generator(str(bf16_run), None, [])
    images = tmp_path / "images"
    images.mkdir()
    pictures = {}
    val = build_val_dataset(loaded.cfg.data)
    for index in range(len(val)):
        pictures[f"val_{index}"] = val.raw(index)[0]
        Image.fromarray(pictures[f"val_{index}"]).save(images / f"val_{index}.png")

    def argmax(picture, bf16):
        # A contiguous NCHW batch, as segadv-predict stacks its windows: the transposed view alone
        # would come out of numpy with channels-last strides, and where the CPU has no native bf16
        # oneDNN's channels-last bf16 kernels round otherwise (18 of 4,096 pixels moved on an AVX2 CPU).
        norm = loaded.cfg.data
        chw = np.ascontiguousarray(picture.transpose(2, 0, 1))
        x = torch.from_numpy(prepare_input(chw[None], "normalized", "float32", norm.mean, norm.std))
        assert x.is_contiguous()
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return loaded.model.eval()(x)[0].float().argmax(0).numpy()

    masks = {}
    for name, extra, line in (
            ("bf16", [], "precision  bfloat16 (amp.generator.enabled: true, dtype bfloat16)"),
            ("fp32", ["amp.generator.enabled=false"], "precision  float32 (amp.generator.enabled: false)")):
        out = tmp_path / name
        assert predict_cli.main(["--checkpoint", str(bf16_run), "--input", str(images), "--output", str(out),
                                 "--device", "cpu", "--batch-size", "1", *extra]) == 0
        assert f"\n{line}\n" in capsys.readouterr().out
        masks[name] = {stem: np.asarray(Image.open(out / f"{stem}.png")) for stem in pictures}
        for stem, picture in pictures.items():
            np.testing.assert_array_equal(masks[name][stem], argmax(picture, name == "bf16"))
    assert any((masks["bf16"][stem] != masks["fp32"][stem]).any() for stem in pictures)
