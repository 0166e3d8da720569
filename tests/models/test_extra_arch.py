"""A generator arch added as a folder of its own outside segadv (arch_folder/tinyconv: its section,
its network and builder, one line adding its row to the arch table), with a key DeepLab does not
take; trained through segadv-train, checkpointed, resumed bitwise from a mid-run checkpoint into a
new run dir, and exported to ONNX. No segadv file names it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from segadv.checkpoint import read_checkpoint
from segadv.config import load_config
from segadv.errors import UserError
from segadv.models.registry import unregister_arch

FOLDER = Path(__file__).resolve().parent / "arch_folder"
SEGADV = Path(__file__).resolve().parents[2] / "segadv"


@pytest.fixture
def tiny_arch(monkeypatch):
    monkeypatch.syspath_prepend(str(FOLDER))
    import tinyconv
    import tinyconv.model

    yield tinyconv
    unregister_arch("tinyconv")
    for name in [m for m in sys.modules if m == "tinyconv" or m.startswith("tinyconv.")]:
        del sys.modules[name]


def test_no_segadv_file_names_the_arch():
    assert not [p for p in SEGADV.rglob("*.py") if "tinyconv" in p.read_text()]


OVERRIDES = ["model.generator.arch=tinyconv", "model.generator.width=6", "model.discriminator.ndf=8",
             "data.synthetic.image_size=32", "data.synthetic.train_size=8", "data.synthetic.val_size=4",
             "data.batch_size=2", "data.val_batch_size=2", "data.num_workers=0", "train.max_steps=6",
             "train.log_every=1", "train.eval_every=100", "checkpoint.every=3", "train.deterministic=true",
             "log.tensorboard=false", "log.num_images=0", "log.diagnostic_images=0", "loss.lambda_adv=0.01"]


def train_cli(*args: str) -> int:
    from segadv.cli.train import main

    return main(["--device-map", "cpu", *args, *OVERRIDES])


def test_the_arch_takes_its_own_keys_and_deeplab_does_not(tiny_arch):
    cfg = load_config(None, ["model.generator.arch=tinyconv", "model.generator.width=5"])
    assert type(cfg.model.generator) is tiny_arch.TinyConvConfig and cfg.model.generator.width == 5
    assert cfg.model.generator.trains_on_one_sample  # its own class says: no image pooling
    with pytest.raises(UserError, match="model.generator.encoder"):
        load_config(None, ["model.generator.arch=tinyconv", "model.generator.encoder=resnet18"])
    with pytest.raises(UserError, match="model.generator.width"):
        load_config(None, ["model.generator.width=5"])  # deeplabv3plus takes no width
    with pytest.raises(UserError, match="'deeplabv2', 'dinov2', 'dinov3' or 'tinyconv'"):
        load_config(None, ["model.generator.arch=unet"])


def test_the_arch_trains_resumes_bitwise_and_exports(tiny_arch, tmp_path, capsys):
    from segadv.cli.export import main as export_main

    full, split = tmp_path / "full", tmp_path / "split"
    assert train_cli("--run-dir", str(full)) == 0
    saved = yaml.safe_load((full / "config.yaml").read_text())
    assert saved["model"]["generator"] == {**saved["model"]["generator"], "arch": "tinyconv", "width": 6}
    ended = read_checkpoint(full / "checkpoints" / "last.pt")
    assert set(ended["generator"]) == set(tiny_arch.model.TinyConv(6, 5, 3).state_dict())

    # A new run dir resumed from the uninterrupted run's mid-run checkpoint ends where it ended.
    assert train_cli("--run-dir", str(split), "--resume", str(full / "checkpoints" / "step_3.pt")) == 0
    resumed = read_checkpoint(split / "checkpoints" / "last.pt")
    assert resumed["step"] == ended["step"] == 6
    for role in ("generator", "discriminator"):
        for name, tensor in ended[role].items():
            assert torch.equal(tensor, resumed[role][name]), (role, name)

    onnx = pytest.importorskip("onnx")
    output = tmp_path / "tiny.onnx"
    assert export_main(["--checkpoint", str(split / "checkpoints" / "last.pt"), "--output", str(output),
                        "--input-size", "32", "32"]) == 0
    onnx.checker.check_model(str(output))
    sidecar = json.loads((tmp_path / "tiny.onnx.json").read_text())
    assert sidecar["generator"] == {"arch": "tinyconv"}


def test_the_row_serves_the_head_split_and_activation_checkpointing(tiny_arch):
    from segadv.config.schema import OptimizerConfig
    from segadv.engine.optim import build_optimizer
    from segadv.models import build_generator
    from segadv.parallel.activation_checkpoint import apply_activation_checkpointing

    g = build_generator(tiny_arch.TinyConvConfig(width=4), num_classes=3)
    opt = build_optimizer(g, OptimizerConfig(name="sgd", lr=0.1, head_lr_mult=10.0))
    backbone, head = opt.param_groups
    assert {id(p) for p in backbone["params"]} == {id(p) for p in g.body.parameters()}
    assert head["lr"] == pytest.approx(1.0) and {id(p) for p in head["params"]} == {id(p) for p in g.head.parameters()}
    assert apply_activation_checkpointing(g) == ["body"]
