"""What a checkpoint fixes for every command that runs its G (segadv/checkpoint/inference.py
INFERENCE_FIXED): eval, export and predict refuse a key=value or --config that changes its classes,
input normalisation or network (exit 2 naming the key and both values); other keys pass."""

import numpy as np
import pytest
from PIL import Image

from conftest import TINY_OVERRIDES
from segadv.checkpoint.inference import load_generator
from segadv.cli.eval import main as eval_main
from segadv.cli.export import main as export_main
from segadv.cli.predict import main as predict_main
from segadv.config import dump_config, load_config
from segadv.errors import UserError
from test_inference_loader import save_checkpoint, tiny_generator

EVAL = ["data.synthetic.image_size=64", "data.synthetic.val_size=4", "data.val_batch_size=4"]


@pytest.fixture
def checkpoint(tmp_path):
    cfg, g = tiny_generator(*EVAL)
    return save_checkpoint(tmp_path / "g.pt", cfg, g)


def run(command, checkpoint, tmp_path, *overrides):
    if command == "eval":
        return eval_main(["--checkpoint", str(checkpoint), *overrides])
    if command == "export":
        return export_main(["--checkpoint", str(checkpoint), "--output", str(tmp_path / "m.ts"), *overrides])
    images = tmp_path / "in"
    images.mkdir(exist_ok=True)
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(images / "a.png")
    return predict_main(["--checkpoint", str(checkpoint), "--input", str(images), "--output",
                         str(tmp_path / "out"), "--device", "cpu", *overrides])


@pytest.mark.parametrize("command", ["eval", "export", "predict"])
@pytest.mark.parametrize("override,key,then", [
    ("data.normalization=caffe_bgr", "data.normalization", '"imagenet"'),
    ("data.mean=[0.5,0.5,0.5]", "data.mean", "[0.485, 0.456, 0.406]"),
    ("data.num_classes=4", "data.num_classes", "5"),
])
def test_an_override_the_checkpoint_fixes_exits_2_naming_both_values(command, override, key, then, checkpoint,
                                                                     tmp_path, capsys):
    assert run(command, checkpoint, tmp_path, override) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {key}=") and f"checkpoint's {then}" in err[0], err
    assert not (tmp_path / "m.ts").exists() and not (tmp_path / "out").exists()


def test_a_config_file_that_disagrees_is_refused_too_and_one_that_agrees_loads(checkpoint, tmp_path):
    other = tmp_path / "other.yaml"
    dump_config(load_config(None, [*TINY_OVERRIDES, *EVAL, "data.normalization=caffe_rgb"]), other)
    with pytest.raises(UserError, match=r"data.normalization=\"caffe_rgb\" \(--config .*checkpoint's \"imagenet\""):
        load_generator(checkpoint, str(other))
    same = tmp_path / "same.yaml"
    dump_config(load_config(None, [*TINY_OVERRIDES, *EVAL, "data.val_batch_size=2"]), same)
    assert load_generator(checkpoint, str(same)).cfg.data.val_batch_size == 2


def test_keys_that_do_not_change_what_g_computes_pass(checkpoint):
    loaded = load_generator(checkpoint, None, ["data.val_batch_size=2", "model.generator.activation_checkpointing=true",
                                               "model.generator.norm=frozen"])
    assert loaded.cfg.data.val_batch_size == 2 and loaded.cfg.model.generator.norm == "frozen"
    with pytest.raises(UserError, match="model.generator.output_stride=8 .* checkpoint's 16"):
        load_generator(checkpoint, None, ["model.generator.output_stride=8"])
