"""segadv-export --format exported: a torch.export program (.pt2, segadv/export/pt2_export.py), verified
against PyTorch eager like the other formats, dynamic where the network allows and static where it
does not (DINOv2); and segadv-predict running it (segadv/inference/backends.py)."""

import contextlib
import io
import json
import logging

import numpy as np
import pytest
import torch

from segadv.cli import export as cli
from segadv.config import load_config
from segadv.export.sidecar import prepare_input, sidecar_path
from segadv.models import build_generator

from test_export import eager_logits, images, save_segadv_checkpoint
from test_export import model  # noqa: F401  (the fixture: the tiny G and its checkpoint, built once per module)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZES = [(1, 64, 64), (3, 96, 128), (2, 32, 48)]  # the training size, a larger one, the least (two strides)
# A DINOv2 G as tests/integration/test_dinov2_run.py shrinks it: 2 blocks, a narrow head, 42 px (3 x 3 patches).
DINOV2 = ["model.generator.depth=2", "model.generator.head_features=16",
          "model.generator.head_out_channels=[8,16,32,64]", "data.synthetic.image_size=42", "model.discriminator.ndf=8"]




def export(ckpt, output, *extra):
    with contextlib.redirect_stdout(io.StringIO()) as report:
        code = cli.main(["--checkpoint", str(ckpt), "--output", str(output), *extra])
    return code, report.getvalue()


@pytest.fixture(scope="module")
def program(model, tmp_path_factory):
    """The default export, its format read from the suffix."""
    output = tmp_path_factory.mktemp("pt2") / "model.pt2"
    code, report = export(model[2], output)
    assert code == 0, report
    return output, report


def load(path):
    """As the issue's 'done when' says a host loads it."""
    return torch.export.load(path).module()


def normalized(cfg, pixels):
    return torch.from_numpy(prepare_input(pixels, "normalized", "float32", cfg.data.mean, cfg.data.std))


def test_the_pt2_runs_in_torch_export_load_and_matches_eager_within_the_verification_tolerance(model, program):
    cfg, generator, _ = model
    output, report = program
    assert "result     PASS" in report and report.count("   ok") == 2
    module = load(output)
    for batch, h, w in SIZES:
        pixels = images(batch, h, w, seed=h)
        out = module(normalized(cfg, pixels)).detach().numpy()  # no inference_mode: as a plain caller runs it
        ref = eager_logits(generator, cfg, pixels)
        assert out.shape == (batch, cfg.data.num_classes, h, w)
        assert np.abs(out - ref).max() <= 1e-4 + 1e-4 * np.abs(ref).max()  # the float32 verification's
        assert (out.argmax(1) == ref.argmax(1)).all()
    with pytest.raises(Exception, match=r"x\.size|shape\[2\]"):  # below two strides: the program's own guard refuses it
        module(torch.zeros(1, 3, 16, 16))


def test_the_sidecar_and_the_embedded_copy_describe_the_program(model, program):
    cfg, _, _ = model
    output, _ = program
    meta = json.loads(sidecar_path(output).read_text())
    assert meta["model_format"] == "exported" and meta["model_file"] == "model.pt2"
    assert meta["input"]["dynamic_axes"] == ["batch", "height", "width"] and meta["input"]["size_divisor"] == 16
    assert meta["input"]["example_shape"] == [1, 3, 64, 64]
    section = meta["exported"]
    assert section["dynamic"] is True and section["size_step"] == 16 and section["least_size"] == [32, 32]
    assert section["static_because"] is None and section["torch_version"] == torch.__version__
    checks = meta["verification"]["checks"]
    assert [c["shape"] for c in checks] == [[1, 3, 64, 64], [2, 3, 96, 80]] and meta["verification"]["passed"]
    assert all(c["max_abs"] <= 1e-4 + 1e-4 * c["max_ref"] for c in checks)
    extra = {"segadv.json": ""}
    torch.export.load(output, extra_files=extra)
    embedded = json.loads(extra["segadv.json"])
    assert embedded["classes"] == meta["classes"] and embedded["exported"] == section
    assert sorted(p.name for p in output.parent.iterdir()) == ["model.pt2", "model.pt2.json"]  # no temp file


def test_preprocess_and_argmax_go_into_the_program(model, tmp_path):
    cfg, generator, ckpt = model
    output = tmp_path / "labels.pt2"
    code, report = export(ckpt, output, "--format", "exported", "--with-preprocess", "uint8", "--with-argmax")
    assert code == 0, report
    meta = json.loads(sidecar_path(output).read_text())
    assert meta["input"]["dtype"] == "uint8" and meta["output"]["kind"] == "class_ids"
    module = load(output)
    for batch, h, w in SIZES[:2]:
        pixels = images(batch, h, w, seed=w)
        ids = module(torch.from_numpy(pixels)).numpy()
        assert ids.dtype == np.int64
        np.testing.assert_array_equal(ids, eager_logits(generator, cfg, pixels).argmax(1))


def test_a_failed_verification_writes_nothing_and_keeps_the_old_file(model, tmp_path, capsys):
    _, _, ckpt = model
    output = tmp_path / "half.pt2"
    output.write_bytes(b"previous export")
    code, report = export(ckpt, output, "--half", "--atol", "0", "--rtol", "0")
    assert code == 1 and "result     FAIL" in report and "torch.export.load" in report
    assert "nothing was written" in capsys.readouterr().err
    assert output.read_bytes() == b"previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half.pt2"]  # no temp file, no sidecar


@pytest.mark.parametrize("args, message", [
    (["--output", "m.pt", "--format", "exported"], "--format exported but the output suffix '.pt' is TorchScript's "
                                                   "(--format torchscript): name the file m.pt2"),
    (["--output", "m.pt2", "--format", "torchscript"], "the output suffix '.pt2' is torch.export's"),
    (["--output", "m.pt2", "--format", "onnx"], "the output suffix '.pt2' is torch.export's"),
    (["--output", "m.onnx", "--format", "exported"], "the output suffix '.onnx' is ONNX's"),
    (["--output", "m.bin"], "pass --format onnx, --format exported or --format torchscript"),
    (["--output", "m.pt2", "--opset", "13"], "ONNX exports only"),
])
def test_a_suffix_of_another_format_exits_2_naming_both(model, tmp_path, args, message, capsys):
    args = [str(tmp_path / a) if a.startswith("m.") else a for a in args]
    assert cli.main(["--checkpoint", str(model[2]), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1  # refused before anything loads
    assert list(tmp_path.iterdir()) == []


def test_a_verify_size_below_what_a_dynamic_program_takes_exits_2_before_the_export(model, tmp_path, capsys,
                                                                                    monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("exported although the verification size was refused")

    monkeypatch.setattr(torch.export, "export", never)
    code, _ = export(model[2], tmp_path / "m.pt2", "--verify-size", "16", "16")
    assert code == 2
    assert "--verify-size 16 16: a dynamic program takes heights and widths from 32" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def dinov2(tmp_path_factory):
    cfg = load_config("dinov2_tiny", DINOV2)
    torch.manual_seed(0)
    generator = build_generator(cfg.model.generator, cfg.data.num_classes).eval()
    return cfg, generator, save_segadv_checkpoint(tmp_path_factory.mktemp("dinov2") / "last.pt", cfg, generator)


def test_dinov2_is_exported_static_at_its_training_size_and_says_why(dinov2, tmp_path, caplog):
    """DINOv2 resamples its position embedding to the input's grid with Python integers: torch.export
    pins height and width, and the program is static, as DINOv2's ONNX graph is."""
    cfg, generator, ckpt = dinov2
    output = tmp_path / "dinov2.pt2"
    with caplog.at_level(logging.INFO, logger="segadv"):
        code, report = export(ckpt, output)
    assert code == 0, report
    assert "DinoV2DPT: its exported program takes one input size" in caplog.text
    assert "exported and verified at 42x42 only" in caplog.text
    assert "note       DinoV2DPT's program is static, 1x3x42x42 only" in report and report.count("   ok") == 1
    meta = json.loads(sidecar_path(output).read_text())
    assert meta["input"]["dynamic_axes"] == [] and meta["exported"]["dynamic"] is False
    assert "constant (42)" in meta["exported"]["static_because"]  # torch 2.5 "inferred", newer "specialized"
    assert meta["notes"] and meta["verification"]["checks"][0]["shape"] == [1, 3, 42, 42]
    pixels = images(1, 42, 42, seed=5)
    module = load(output)
    out = module(normalized(cfg, pixels)).detach().numpy()
    ref = eager_logits(generator, cfg, pixels)
    assert np.abs(out - ref).max() <= 1e-4 + 1e-4 * np.abs(ref).max()
    with pytest.raises(Exception, match=r"x\.size|shape\[2\]"):
        module(normalized(cfg, images(1, 56, 56)))
    from segadv.inference.backends import open_model

    backend = open_model(str(output), "cpu")  # segadv-predict's windows: the program's one shape
    assert backend.fixed_batch == 1 and backend.fixed_size == (42, 42) and backend.least_size is None


def test_predict_runs_a_pt2_padding_windows_below_its_least_size(model, program, tmp_path):
    """The backend's own checks; tests/export/test_predict.py compares its masks with eager's."""
    from segadv.inference.backends import ExportedProgramBackend, open_model

    cfg, generator, _ = model
    backend = open_model(str(program[0]), "cpu")
    assert isinstance(backend, ExportedProgramBackend) and backend.least_size == (32, 32)
    assert backend.fixed_batch is None and backend.fixed_size is None and backend.precision == "float32"
    x = prepare_input(images(2, 16, 48, seed=9), "normalized", "float32", cfg.data.mean, cfg.data.std)
    out = backend.run(x)  # a 16-high window: padded to 32 by reflection, cropped back
    padded = np.pad(x, ((0, 0), (0, 0), (0, 16), (0, 0)), mode="reflect")
    with torch.inference_mode():
        ref = generator(torch.from_numpy(padded)).numpy()[..., :16, :]
    assert out.shape == (2, cfg.data.num_classes, 16, 48)
    assert np.abs(out - ref).max() <= 1e-4 + 1e-4 * np.abs(ref).max()
