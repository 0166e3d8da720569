"""segadv-eval scores a checkpoint in the precision its run's evaluations used (the config's
``amp.generator``, ``auto`` resolved as training resolves it): the run's best.json mIoU, to every
digit; ``amp.generator.enabled=false`` forces float32 (segadv/inference/scoring.py)."""

import json

import pytest
import torch

from segadv.cli import eval as eval_cli
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
