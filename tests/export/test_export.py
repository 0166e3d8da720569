"""segadv-export: ONNX / TorchScript of the bare generator, verified against PyTorch eager."""

import contextlib
import io
import json
import os
import runpy
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from segadv import __version__
from segadv.config import config_to_dict, dump_config, load_config
from segadv.data import class_names
from segadv.data.palette import palette
from segadv.cli import export as cli
from segadv.export.sidecar import prepare_input, sidecar_path
from segadv.fsutil import file_sha256
from segadv.export.torchscript_export import load_torchscript
from segadv.models import build_discriminator, build_generator

from conftest import TINY_OVERRIDES

SIZES = [(1, 64, 64), (3, 96, 128)]  # two batch sizes and two spatial sizes, none of them exported


def make_generator(cfg, seed=0):
    """A tiny generator whose eval-mode outputs are not near zero: BatchNorm statistics are
    calibrated on random images (as a few training steps would), so logit gaps are O(1) and
    argmax checks mean something."""
    torch.manual_seed(seed)
    generator = build_generator(cfg.model.generator, cfg.data.num_classes)
    for module in generator.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # cumulative average over the calibration batches
    generator.train()
    with torch.no_grad():
        for i in range(2):
            pixels = images(4, 64, 64, seed=100 + i)
            generator(torch.from_numpy(prepare_input(pixels, "normalized", "float32", cfg.data.mean, cfg.data.std)))
    return generator.eval()


def save_segadv_checkpoint(path, cfg, generator):
    torch.save({
        "format": "segadv", "format_version": 1, "segadv_version": __version__, "step": 7,
        "generator": generator.state_dict(),
        "discriminator": build_discriminator(cfg.model.discriminator, cfg.data.num_classes).state_dict(),
        "config": config_to_dict(cfg),
    }, path)
    return path


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    cfg = load_config(None, TINY_OVERRIDES)
    generator = make_generator(cfg)
    path = save_segadv_checkpoint(tmp_path_factory.mktemp("ckpt") / "last.pt", cfg, generator)
    return cfg, generator, path


def images(batch, h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(batch, 3, h, w), dtype=np.uint8)


def eager_logits(generator, cfg, pixels):
    x = prepare_input(pixels, "normalized", "float32", cfg.data.mean, cfg.data.std)
    with torch.inference_mode():
        return generator(torch.from_numpy(x)).numpy()


def assert_close(out, ref):
    """float32 export vs eager: within 2e-4 of the output's range (fusions reorder float sums)."""
    assert out.shape == ref.shape
    assert np.abs(out - ref).max() <= 2e-4 * max(1.0, float(np.abs(ref).max()))


def run_onnx(path, x):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def run_torchscript(path, x):
    with torch.inference_mode():
        return load_torchscript(path)(torch.from_numpy(x)).numpy()


RUNNERS = {"onnx": (".onnx", run_onnx), "torchscript": (".pt", run_torchscript)}


def export(tmp_path, ckpt, fmt, *extra, name="model"):
    suffix = RUNNERS[fmt][0]
    output = tmp_path / f"{name}{suffix}"
    code = cli.main(["--checkpoint", str(ckpt), "--output", str(output), "--format", fmt, *extra])
    return code, output


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    """``exported(fmt, *flags) -> (exit code, path, report)``, each export made once per module."""
    cache = {}

    def get(fmt, *extra):
        if (fmt, *extra) not in cache:
            with contextlib.redirect_stdout(io.StringIO()) as report:
                code, output = export(tmp_path_factory.mktemp("export"), model[2], fmt, *extra)
            cache[(fmt, *extra)] = (code, output, report.getvalue())
        return cache[(fmt, *extra)]

    return get


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_matches_eager_at_two_sizes_with_dynamic_axes(model, exported, fmt):
    cfg, generator, _ = model
    code, output, report = exported(fmt)
    assert code == 0, report
    assert "result     PASS" in report and report.count("   ok") == 2
    if fmt == "onnx":
        proto = onnx.load(str(output))
        onnx.checker.check_model(proto, full_check=True)
        dims = [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
        assert dims == ["batch", 3, "height", "width"]
    run = RUNNERS[fmt][1]
    for batch, h, w in SIZES:
        pixels = images(batch, h, w, seed=h)
        ref = eager_logits(generator, cfg, pixels)
        out = run(output, prepare_input(pixels, "normalized", "float32", cfg.data.mean, cfg.data.std))
        assert out.shape == (batch, cfg.data.num_classes, h, w)
        assert_close(out, ref)
        assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero maps
        assert (out.argmax(1) == ref.argmax(1)).mean() == 1.0


def test_sidecar_describes_the_export(model, exported):
    cfg, _, ckpt = model
    code, output, report = exported("onnx")
    assert code == 0, report
    meta = json.loads(sidecar_path(output).read_text())
    assert meta["classes"] == class_names(cfg.data)
    assert meta["palette"] == palette(cfg.data.num_classes).tolist()
    assert meta["normalization"]["mean"] == cfg.data.mean and meta["normalization"]["std"] == cfg.data.std
    assert meta["normalization"]["in_graph"] is False
    assert meta["input"]["layout"] == "NCHW" and meta["input"]["channels"] == "RGB"
    assert meta["input"]["kind"] == "normalized" and meta["input"]["dtype"] == "float32"
    assert meta["input"]["dynamic_axes"] == ["batch", "height", "width"] and meta["input"]["size_divisor"] == 16
    assert meta["output"] == {"name": "logits", "kind": "logits", "layout": "NCHW", "dtype": "float32"}
    assert meta["segadv_version"] == __version__
    assert meta["source"]["sha256"] == file_sha256(ckpt) and meta["source"]["step"] == 7
    assert meta["onnx"]["opset"] == 17 and meta["onnx"]["checker"] == "passed"
    assert meta["verification"]["passed"] and len(meta["verification"]["checks"]) == 2
    embedded = {p.key: p.value for p in onnx.load(str(output)).metadata_props}
    assert json.loads(embedded["segadv"])["classes"] == meta["classes"]
    assert sorted(p.name for p in output.parent.iterdir()) == ["model.onnx", "model.onnx.json"]  # no temp files


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_with_argmax_outputs_the_eager_argmax(model, exported, fmt):
    cfg, generator, _ = model
    code, output, report = exported(fmt, "--with-argmax")
    assert code == 0, report
    for batch, h, w in SIZES:
        pixels = images(batch, h, w, seed=w)
        ids = RUNNERS[fmt][1](output, prepare_input(pixels, "normalized", "float32", cfg.data.mean, cfg.data.std))
        assert ids.shape == (batch, h, w) and ids.dtype == np.int64
        np.testing.assert_array_equal(ids, eager_logits(generator, cfg, pixels).argmax(1))


@pytest.mark.parametrize("kind", ["uint8", "unit"])
def test_with_preprocess_on_raw_pixels_equals_eager_on_normalised_input(model, exported, kind):
    cfg, generator, _ = model
    code, output, report = exported("onnx", "--with-preprocess", kind)
    assert code == 0, report
    meta = json.loads(sidecar_path(output).read_text())
    assert meta["input"]["kind"] == kind and meta["normalization"]["in_graph"] is True
    for batch, h, w in SIZES:
        pixels = images(batch, h, w, seed=batch)
        raw = pixels if kind == "uint8" else pixels.astype(np.float32) / 255.0
        out = run_onnx(output, raw)
        ref = eager_logits(generator, cfg, pixels)
        assert_close(out, ref)
        assert (out.argmax(1) == ref.argmax(1)).mean() == 1.0


def test_export_from_a_dataparallel_prefixed_state_dict_needs_and_uses_a_config(model, tmp_path, capsys):
    cfg, generator, _ = model
    raw = tmp_path / "dp.pth"
    torch.save({f"module.{k}": v for k, v in generator.state_dict().items()}, raw)

    code = cli.main(["--checkpoint", str(raw), "--output", str(tmp_path / "a.onnx")])
    assert code == 2
    err = capsys.readouterr().err
    assert "carries no config" in err and "--config FILE" in err
    assert not (tmp_path / "a.onnx").exists()

    config_file = tmp_path / "config.yaml"
    g_only = [o for o in TINY_OVERRIDES if o.startswith("model.generator.")]
    dump_config(load_config(None, g_only), config_file)  # G's settings only ...
    overrides = [o for o in TINY_OVERRIDES if o.startswith("data.synthetic.image_size")]  # ... + overrides
    code = cli.main(["--checkpoint", str(raw), "--config", str(config_file), "--output", str(tmp_path / "dp.onnx"),
                     *overrides])
    assert code == 0, capsys.readouterr().out
    pixels = images(2, 64, 96)
    out = run_onnx(tmp_path / "dp.onnx", prepare_input(pixels, "normalized", "float32", cfg.data.mean, cfg.data.std))
    assert_close(out, eager_logits(generator, cfg, pixels))
    meta = json.loads(sidecar_path(tmp_path / "dp.onnx").read_text())
    assert meta["source"]["kind"] == "state dict" and meta["input"]["example_shape"] == [1, 3, 64, 64]


@pytest.mark.parametrize("wrong", ["discriminator", "other_encoder"])
def test_a_checkpoint_of_the_wrong_kind_gives_the_loaders_error(model, tmp_path, wrong, capsys):
    cfg, _, ckpt = model
    if wrong == "discriminator":
        path = tmp_path / "d.pth"
        torch.save(build_discriminator(cfg.model.discriminator, cfg.data.num_classes).state_dict(), path)
        config_file = tmp_path / "config.yaml"
        dump_config(cfg, config_file)
        argv = ["--checkpoint", str(path), "--config", str(config_file)]
        expected = "looks like a discriminator"
    else:  # a mobilenet_v2 generator's weights read as a resnet18 generator (a segadv checkpoint's
        # own config fixes its encoder: tests/checkpoint/test_inference_identity.py)
        from segadv.checkpoint.io import read_checkpoint

        path = tmp_path / "g.pth"
        torch.save(read_checkpoint(ckpt)["generator"], path)
        config_file = tmp_path / "config.yaml"
        dump_config(load_config(None, [*TINY_OVERRIDES, "model.generator.encoder=resnet18"]), config_file)
        argv = ["--checkpoint", str(path), "--config", str(config_file)]
        expected = "missing in file"
    code = cli.main([*argv, "--output", str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err
    assert code == 2
    assert "does not fit the generator" in err and expected in err
    assert "Traceback" not in err and not (tmp_path / "m.onnx").exists()


def test_failing_verification_exits_1_with_the_numbers_and_writes_nothing(model, tmp_path, capsys):
    _, _, ckpt = model
    output = tmp_path / "half.onnx"
    output.write_bytes(b"previous export")
    code, _ = export(tmp_path, ckpt, "onnx", "--half", "--atol", "0", "--rtol", "0", name="half")
    captured = capsys.readouterr()
    assert code == 1
    assert "result     FAIL" in captured.out and "max abs" in captured.out and "FAIL" in captured.out
    assert "float16" in captured.out  # the CPU float16 note says what was really computed
    assert "nothing was written" in captured.err
    assert output.read_bytes() == b"previous export"  # the old file is untouched
    assert not sidecar_path(output).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half.onnx"]  # no temp file left behind


def test_torchscript_falls_back_to_tracing_and_verification_checks_it(model, tmp_path, monkeypatch, capsys):
    cfg, generator, ckpt = model

    def refuse(*args, **kwargs):
        raise RuntimeError("this encoder does not script")

    monkeypatch.setattr(torch.jit, "script", refuse)
    code, output = export(tmp_path, ckpt, "torchscript")
    assert code == 0, capsys.readouterr().out
    meta = json.loads(sidecar_path(output).read_text())
    assert meta["torchscript"]["method"] == "trace"
    assert [c["shape"] for c in meta["verification"]["checks"]] == [[1, 3, 64, 64], [2, 3, 96, 80]]
    pixels = images(3, 96, 128)
    x = prepare_input(pixels, "normalized", "float32", cfg.data.mean, cfg.data.std)
    assert_close(run_torchscript(output, x), eager_logits(generator, cfg, pixels))


def test_a_missing_export_extra_is_a_user_error(model, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    code, output = export(tmp_path, model[2], "onnx")
    assert code == 2 and "pip install -e '.[export]'" in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--output", "m.bin"], "does not say which"),
        (["--output", "m.onnx", "--input-size", "60", "64"], "multiples of 16"),
        (["--output", "m.pt", "--opset", "13"], "ONNX exports only"),
        (["--output", "m.onnx", "--opset", "99"], "this torch exports opsets"),
        (["--output", "m.onnx", "--opset", "9"], "need opset 11 or newer"),
    ],
)
def test_user_errors_exit_2(model, tmp_path, args, message, capsys):
    _, _, ckpt = model
    args = [str(tmp_path / a) if a.startswith("m.") else a for a in args]
    assert cli.main(["--checkpoint", str(ckpt), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1  # one line: refused before any tracing


def test_the_opset_floor_is_the_models(model, tmp_path, capsys):
    """MODEL_MIN_OPSET is what G needs: the exporter itself fails one below it, and writes it."""
    from segadv.export.onnx_export import MODEL_MIN_OPSET, export_onnx

    _, generator, _ = model
    example = torch.zeros(1, 3, 64, 64)
    with pytest.raises(Exception):
        export_onnx(generator, example, tmp_path / "low.onnx", output_name="logits", argmax=False,
                    opset=MODEL_MIN_OPSET - 1, dynamic=False, embed="{}")
    meta = export_onnx(generator, example, tmp_path / "floor.onnx", output_name="logits", argmax=False,
                       opset=MODEL_MIN_OPSET, dynamic=False, embed="{}")
    assert meta["opset"] == MODEL_MIN_OPSET


def test_tools_export_is_the_same_entry_point():
    namespace = runpy.run_path(str(Path(__file__).resolve().parents[2] / "tools" / "export.py"), run_name="not_main")
    assert namespace["main"] is cli.main
    assert os.access(Path(__file__).resolve().parents[2] / "tools" / "export.py", os.R_OK)


def test_export_never_writes_over_its_checkpoint_or_config(model, tmp_path, capsys):
    """`--output X.pt` with `--checkpoint X.pt` used to replace the training checkpoint."""
    cfg, _, ckpt = model
    copy = tmp_path / "last.pt"
    copy.write_bytes(ckpt.read_bytes())
    config = tmp_path / "config.yaml"
    dump_config(cfg, config)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (copy, config)}
    for output, named in ((copy, "--checkpoint"), (config, "--config")):
        code = cli.main(["--checkpoint", str(copy), "--config", str(config), "--output", str(output),
                         "--format", "torchscript"])
        err = capsys.readouterr().err
        assert code == 2 and f"--output {output} is {named} {output}: nothing replaces an input" in err
    assert cli.main(["--checkpoint", str(copy), "--output", str(tmp_path)]) == 2  # an existing folder
    assert f"--output {tmp_path} is a directory; name the file to write" in capsys.readouterr().err
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (copy, config)} == before


def test_export_write_failures_exit_4_naming_the_file(model, tmp_path, monkeypatch, capsys):
    _, _, ckpt = model
    (tmp_path / "a_file").write_text("not a folder")
    out = tmp_path / "a_file" / "sub" / "m.pt"  # its folder cannot be made
    assert cli.main(["--checkpoint", str(ckpt), "--output", str(out)]) == 4
    err = capsys.readouterr().err
    assert f"error: cannot write {out.parent}: Not a directory (ENOTDIR)" in err and "Traceback" not in err
    beside = tmp_path / "a_file" / "m.onnx"  # the folder named is itself a file: as predict and convert answer
    assert cli.main(["--checkpoint", str(ckpt), "--output", str(beside)]) == 4
    err = capsys.readouterr().err
    assert f"error: cannot write {beside.parent}: Not a directory (ENOTDIR)" in err and "Traceback" not in err

    from segadv import fsutil

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "fsync", full_disk)
    target = tmp_path / "m.pt"
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["--checkpoint", str(ckpt), "--output", str(target), "--verify-size", "64", "64"])
    err = capsys.readouterr().err
    assert code == 4 and f"error: cannot write {target}: No space left on device (ENOSPC)" in err
    assert "Traceback" not in err and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.parametrize("option, value", [("--rtol", "nan"), ("--atol", "-1"), ("--rtol", "inf"),
                                           ("--min-agreement", "nan"), ("--min-agreement", "1.5")])
def test_tolerance_options_refused_before_loading(tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--checkpoint", str(tmp_path / "absent.pt"), "--output", str(tmp_path / "m.onnx"), option, value])
    assert stop.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_verification_removes_the_temp_file(model, tmp_path, monkeypatch):
    import signal

    _, _, ckpt = model
    seen = {}

    def terminated_mid_check(run, *args, **kwargs):
        seen["files"] = sorted(p.name for p in tmp_path.iterdir())
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread before the call returns
        raise AssertionError("SIGTERM did not stop the export")

    monkeypatch.setattr("segadv.export.verify.verify", terminated_mid_check)  # what cli.main imports when it runs
    before = signal.getsignal(signal.SIGTERM)
    code = cli.main(["--checkpoint", str(ckpt), "--output", str(tmp_path / "m.onnx")])  # answered by cli_entry
    assert code == 128 + signal.SIGTERM
    assert any(name.startswith(".m.onnx.tmp-") for name in seen["files"])  # the staged file existed
    assert list(tmp_path.iterdir()) == []  # and is gone, with nothing else written
    assert signal.getsignal(signal.SIGTERM) == before  # the command's handler is gone with it


def input_line(printed):
    """segadv-export's ``input`` line up to its dynamic axes."""
    line = next(line for line in printed.splitlines() if line.startswith("input "))
    return line[:line.index("dynamic axes")]


def test_a_caffe_bgr_model_reverses_the_channels_in_the_graph_and_its_sidecar_says_so(model, tmp_path, capsys):
    """data.normalization caffe_bgr: the exported graph takes RGB pixels and computes what the
    references feed their G (BGR less IMG_MEAN, no std); a normalized input is BGR, as the sidecar
    says, and prepare_input makes it from the sidecar."""
    _, generator, _ = model
    cfg = load_config(None, [*TINY_OVERRIDES, "data.normalization=caffe_bgr"])
    ckpt = save_segadv_checkpoint(tmp_path / "bgr.pt", cfg, generator)
    pixels = images(2, 64, 64, seed=3)
    img_mean = np.array((104.00698793, 116.66876762, 122.67891434), np.float32).reshape(1, 3, 1, 1)
    reference_input = pixels[:, ::-1].astype(np.float32) - img_mean  # AdaptSegNet's / ADVENT's arithmetic
    with torch.inference_mode():
        ref = generator(torch.from_numpy(np.ascontiguousarray(reference_input))).numpy()
    code, output = export(tmp_path, ckpt, "onnx", "--with-preprocess", "uint8", name="graph")
    printed = capsys.readouterr().out
    assert code == 0, printed
    meta = json.loads(sidecar_path(output).read_text())
    assert meta["format_version"] == 2 and meta["input"]["channels"] == "RGB"
    assert input_line(printed) == "input      input: uint8 NCHW RGB, uint8; "  # the graph reverses them
    assert meta["normalization"]["name"] == "caffe_bgr" and meta["normalization"]["channels"] == "BGR"
    np.testing.assert_allclose(np.array(meta["normalization"]["mean"]) * 255, img_mean.ravel(), rtol=1e-6)
    assert_close(run_onnx(output, pixels), ref)
    code, output = export(tmp_path, ckpt, "onnx", name="plain")
    printed = capsys.readouterr().out
    assert code == 0, printed
    meta = json.loads(sidecar_path(output).read_text())
    assert meta["input"]["channels"] == "BGR" and meta["input"]["kind"] == "normalized"
    # The console says what the sidecar says: a normalized input in BGR order.
    assert input_line(printed) == "input      input: float32 NCHW BGR, normalized; "
    norm = meta["normalization"]
    x = prepare_input(pixels, "normalized", "float32", norm["mean"], norm["std"], norm["channels"])
    np.testing.assert_allclose(x, reference_input, atol=2e-4)
    assert_close(run_onnx(output, x), ref)


def test_an_imagenet_model_keeps_version_1_sidecars(model, exported):
    code, output, report = exported("onnx")
    meta = json.loads(sidecar_path(output).read_text())
    assert meta["format_version"] == 1 and meta["normalization"]["name"] == "imagenet"
    assert meta["normalization"]["channels"] == "RGB"
