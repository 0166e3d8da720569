"""segadv-predict: masks from a checkpoint, an ONNX, a torch.export (.pt2) or a TorchScript export; large
images; errors."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

from segadv.cli import predict
from segadv.cli import train as train_cli
from segadv.data import SyntheticShapes
from segadv.data.palette import palette
from segadv.cli import export as export_cli
from segadv.export.sidecar import prepare_input, sidecar_path

from conftest import TINY_OVERRIDES
from test_export import make_generator, save_segadv_checkpoint

REPO = Path(__file__).resolve().parents[2]
# Image sizes are multiples of 16 (the encoder's stride), so no padding is involved and the masks
# must equal the eager argmax exactly.
SIZES = {"square": (64, 64), "wide": (48, 112), "tall": (96, 80)}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from segadv.config import load_config

    cfg = load_config(None, TINY_OVERRIDES)
    generator = make_generator(cfg, seed=1)
    path = save_segadv_checkpoint(tmp_path_factory.mktemp("ckpt") / "last.pt", cfg, generator)
    return cfg, generator, path


def run_export(ckpt, output, *extra):
    with contextlib.redirect_stdout(io.StringIO()) as report:
        code = export_cli.main(["--checkpoint", str(ckpt), "--output", str(output), *extra])
    assert code == 0, report.getvalue()
    return output


@pytest.fixture(scope="module")
def onnx_model(model, tmp_path_factory):
    return run_export(model[2], tmp_path_factory.mktemp("onnx") / "model.onnx")


def synthetic_image(h, w, index=0):
    return SyntheticShapes("val", 4, max(h, w), 5, seed=3).raw(index)[0][:h, :w]


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    pictures = {}
    for i, (stem, (h, w)) in enumerate(SIZES.items()):
        pictures[stem] = synthetic_image(h, w, i)
        Image.fromarray(pictures[stem]).save(folder / f"{stem}.png")
    (folder / "notes.txt").write_text("not an image")
    return folder, pictures


def eager_labels(generator, cfg, picture):
    x = prepare_input(picture.transpose(2, 0, 1)[None], "normalized", "float32", cfg.data.mean, cfg.data.std)
    with torch.inference_mode():
        return generator(torch.from_numpy(x))[0].argmax(0).numpy()


def predict_main(*argv):
    with contextlib.redirect_stdout(io.StringIO()) as report:
        code = predict.main([str(a) for a in argv])
    return code, report.getvalue()


def read_mask(path):
    with Image.open(path) as img:
        assert img.mode == "P"
        return np.asarray(img), np.asarray(img.getpalette(), dtype=np.uint8).reshape(-1, 3)


def assert_same_labels(mask, expected, exact=True):
    """Exact for PyTorch paths. ONNX Runtime's float32 arithmetic differs from eager by ~1e-5,
    enough to flip the argmax at a rare near-tie pixel, so allow at most 0.1% there."""
    if exact:
        np.testing.assert_array_equal(mask, expected)
    else:
        assert mask.shape == expected.shape
        assert (mask == expected).mean() >= 0.999, (mask != expected).sum()


@pytest.mark.parametrize("source", ["checkpoint", "onnx", "exported", "torchscript"])
def test_masks_equal_the_eager_argmax(model, onnx_model, image_dir, tmp_path, source):
    cfg, generator, ckpt = model
    folder, pictures = image_dir
    if source == "checkpoint":
        args = ["--checkpoint", ckpt]
    elif source == "onnx":
        args = ["--model", onnx_model, "--overlay"]
    else:
        args = ["--model", run_export(ckpt, tmp_path / ("model.pt2" if source == "exported" else "model.pt"))]
    out = tmp_path / "masks"
    code, report = predict_main(*args, "--input", folder, "--output", out, "--device", "cpu", "--batch-size", 2)
    assert code == 0, report
    # float32: the checkpoint's run evaluated in it (amp.generator.enabled: false), the models were exported in it
    why = "amp.generator.enabled: false" if source == "checkpoint" else "as exported"
    assert f"\nprecision  float32 ({why})\n" in report
    assert sorted(p.name for p in out.glob("*.png")) == sorted(f"{stem}.png" for stem in SIZES)
    classes_seen = set()
    for stem, picture in pictures.items():
        mask, colours = read_mask(out / f"{stem}.png")
        expected = eager_labels(generator, cfg, picture)
        assert_same_labels(mask, expected, exact=source != "onnx")
        np.testing.assert_array_equal(colours[: cfg.data.num_classes], palette(cfg.data.num_classes))
        classes_seen |= set(np.unique(expected).tolist())
    assert len(classes_seen) >= 2  # the masks are not one flat class
    if source == "onnx":
        for stem, picture in pictures.items():
            with Image.open(out / "overlay" / f"{stem}.png") as overlay:
                assert overlay.size == (picture.shape[1], picture.shape[0]) and overlay.mode == "RGB"


def test_sliding_windows_and_resize_for_large_images(model, onnx_model, tmp_path):
    cfg, generator, _ = model
    picture = synthetic_image(128, 128)
    odd = synthetic_image(150, 190, 1)
    folder = tmp_path / "in"
    folder.mkdir()
    Image.fromarray(picture).save(folder / "big.png")
    Image.fromarray(odd).save(folder / "odd.jpg")

    # Four 64x64 windows without overlap: each quarter is an independent forward pass.
    code, report = predict_main("--model", onnx_model, "--input", folder / "big.png", "--output", tmp_path / "slide",
                                "--max-size", 64, "--overlap", 0)
    assert code == 0, report
    assert "4 forward window(s)" in report
    mask, _ = read_mask(tmp_path / "slide" / "big.png")
    for y in (0, 64):
        for x in (0, 64):
            assert_same_labels(mask[y:y + 64, x:x + 64],
                               eager_labels(generator, cfg, picture[y:y + 64, x:x + 64]), exact=False)

    # Overlapping windows over a size that is no multiple of anything, and resize mode: full-size masks.
    for mode in ("slide", "resize"):
        out = tmp_path / mode
        code, report = predict_main("--model", onnx_model, "--input", str(folder / "*"), "--output", out,
                                    "--max-size", 64, "--mode", mode)
        assert code == 0, report
        assert read_mask(out / "odd.png")[0].shape == (150, 190)
        assert read_mask(out / "big.png")[0].shape == (128, 128)
    assert "windows    2 forward window(s); mode resize" in report


def test_static_onnx_model_runs_windows_of_its_fixed_size(model, tmp_path):
    cfg, generator, ckpt = model
    path = run_export(ckpt, tmp_path / "static.onnx", "--no-dynamic", "--input-size", "64", "64")
    dims = [d.dim_value for d in onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 64, 64]
    folder = tmp_path / "in"
    folder.mkdir()
    exact, other = synthetic_image(64, 64), synthetic_image(100, 70, 1)
    Image.fromarray(exact).save(folder / "exact.png")
    Image.fromarray(other).save(folder / "other.png")
    code, report = predict_main("--model", path, "--input", folder, "--output", tmp_path / "out", "--batch-size", 4)
    assert code == 0, report
    assert_same_labels(read_mask(tmp_path / "out" / "exact.png")[0], eager_labels(generator, cfg, exact), exact=False)
    assert read_mask(tmp_path / "out" / "other.png")[0].shape == (100, 70)


def test_metadata_comes_from_the_file_or_else_its_sidecar(model, onnx_model, image_dir, tmp_path, capsys):
    cfg, generator, _ = model
    folder, pictures = image_dir
    lonely = tmp_path / "lonely.onnx"  # copied without its sidecar: the embedded copy is used
    shutil.copy(onnx_model, lonely)
    stripped = tmp_path / "stripped.onnx"  # metadata removed from the file: the sidecar is used
    proto = onnx.load(str(onnx_model))
    del proto.metadata_props[:]
    onnx.save(proto, str(stripped))
    shutil.copy(sidecar_path(onnx_model), sidecar_path(stripped))
    for path in (lonely, stripped):
        out = tmp_path / path.stem
        code, report = predict_main("--model", path, "--input", folder / "square.png", "--output", out)
        assert code == 0, report
        assert_same_labels(read_mask(out / "square.png")[0], eager_labels(generator, cfg, pictures["square"]),
                           exact=False)
    sidecar_path(stripped).unlink()  # neither: a clear error
    code, _ = predict_main("--model", stripped, "--input", folder / "square.png", "--output", tmp_path / "x")
    assert code == 2 and "no segadv metadata" in capsys.readouterr().err


def test_input_errors_exit_2(model, onnx_model, image_dir, tmp_path, capsys):
    _, _, ckpt = model
    folder, _ = image_dir
    empty = tmp_path / "empty"
    empty.mkdir()
    clash = tmp_path / "clash"
    clash.mkdir()
    for name in ("a.png", "a.jpg"):
        Image.fromarray(synthetic_image(32, 32)).save(clash / name)
    cases = [
        (["--model", onnx_model, "--input", tmp_path / "missing.png"], "no such file or folder"),
        (["--model", onnx_model, "--input", empty], "no image files"),
        (["--model", onnx_model, "--input", str(tmp_path / "*.webp")], "no files match"),
        (["--model", onnx_model, "--input", clash], "would be written twice"),
        (["--model", onnx_model, "--input", folder, "--output", folder], "would overwrite an input image"),
        (["--model", ckpt, "--input", folder], "use --checkpoint"),
        (["--model", onnx_model, "--input", folder, "--config", "x.yaml"], "apply to --checkpoint only"),
        (["--model", onnx_model, "--input", folder, "--device", "gpu0"], "expected cpu, cuda"),
    ]
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        cases.append((["--model", onnx_model, "--input", folder, "--device", "cuda"], "has no CUDA provider"))
    for argv, message in cases:
        if "--output" not in argv:
            argv = [*argv, "--output", tmp_path / "out"]
        code, _ = predict_main(*argv)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert message in err and "Traceback" not in err, (argv, err)


def snapshot(folder):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()}


def test_predict_never_writes_into_a_folder_of_files_it_did_not_write(onnx_model, image_dir, tmp_path, capsys):
    """Predicting into a folder of ground-truth masks used to overwrite them silently."""
    folder, _ = image_dir
    truth = tmp_path / "truth"
    truth.mkdir()
    for stem in SIZES:
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(truth / f"{stem}.png")
    (truth / "README.txt").write_text("ground truth")
    before = snapshot(truth)
    code, _ = predict_main("--model", onnx_model, "--input", folder, "--output", truth, "--device", "cpu")
    err = capsys.readouterr().err
    assert code == 2 and f"--output {truth} holds files segadv-predict did not write" in err and "--overwrite" in err
    assert snapshot(truth) == before

    out = tmp_path / "masks"  # its own files: a second run may replace them
    for _ in range(2):
        code, report = predict_main("--model", onnx_model, "--input", folder, "--output", out, "--device", "cpu")
        assert code == 0, report
    code, _ = predict_main("--model", onnx_model, "--input", folder, "--output", truth, "--device", "cpu",
                           "--overwrite")
    assert code == 0
    assert snapshot(truth)["README.txt"] == before["README.txt"]  # only the masks it names are replaced
    assert all((truth / f"{stem}.png").read_bytes() == (out / f"{stem}.png").read_bytes() for stem in SIZES)


def test_predict_on_error_skip_segments_the_readable_inputs_and_lists_the_rest(onnx_model, image_dir, tmp_path,
                                                                               capsys):
    from data_builders import declared_size_png

    folder, _ = image_dir
    mixed = tmp_path / "mixed"
    shutil.copytree(folder, mixed)
    data = (mixed / "wide.png").read_bytes()
    (mixed / "wide.png").write_bytes(data[: len(data) // 2])  # its header reads, its pixels do not
    os.symlink(tmp_path / "gone.png", mixed / "link.png")
    declared_size_png(mixed / "aerial.png", 20000, 9000)
    run = ("--model", onnx_model, "--input", mixed, "--device", "cpu", "--batch-size", 4)

    code, _ = predict_main(*run, "--output", tmp_path / "raise")
    err = capsys.readouterr().err
    assert code == 2 and "2 unreadable inputs:" in err and "Traceback" not in err
    assert f"cannot read image {mixed / 'aerial.png'}: Image size (180000000 pixels) exceeds limit" in err
    assert f"cannot read image {mixed / 'link.png'}: broken symlink to {tmp_path / 'gone.png'}" in err
    assert not (tmp_path / "raise").exists()  # found before the model was loaded: nothing written

    code, report = predict_main(*run, "--output", tmp_path / "skip", "--on-error", "skip")
    assert code == 0, report
    assert sorted(p.name for p in (tmp_path / "skip").glob("*.png")) == ["square.png", "tall.png"]
    assert "wrote      2 mask(s)" in report and "skipped    3 unreadable input(s) (--on-error skip):" in report
    for name in ("aerial.png", "link.png", "wide.png"):
        assert f"cannot read image {mixed / name}" in report

    for name in ("aerial.png", "link.png"):
        (mixed / name).unlink()
    code, _ = predict_main(*run, "--output", tmp_path / "late")  # found while reading: the batch's good ones kept
    err = capsys.readouterr().err
    assert code == 2 and f"cannot read image {mixed / 'wide.png'}" in err and "2 mask(s) written before it" in err
    assert sorted(p.name for p in (tmp_path / "late").glob("*.png")) == ["square.png", "tall.png"]


def test_predict_write_failure_exits_4(onnx_model, image_dir, tmp_path, capsys):
    folder, _ = image_dir
    (tmp_path / "a_file").write_text("not a folder")
    out = tmp_path / "a_file" / "masks"
    code, _ = predict_main("--model", onnx_model, "--input", folder, "--output", out, "--device", "cpu")
    err = capsys.readouterr().err
    assert code == 4 and f"error: cannot write {out}: Not a directory (ENOTDIR)" in err and "Traceback" not in err


@pytest.mark.cuda
@pytest.mark.parametrize("source", ["checkpoint", "exported", "torchscript"])
def test_predict_on_cuda_matches_the_cpu_masks(model, image_dir, tmp_path, source, no_tf32):
    """float32 against float32 (TF32 off): with cuDNN's default TF32 convolutions 0.4% of this
    barely trained G's pixels flipped class on an H100 (near-ties in its logits)."""
    cfg, generator, ckpt = model
    folder, pictures = image_dir
    suffix = ".pt2" if source == "exported" else ".pt"
    args = ["--checkpoint", ckpt] if source == "checkpoint" else ["--model", run_export(ckpt, tmp_path / f"m{suffix}")]
    code, report = predict_main(*args, "--input", folder, "--output", tmp_path / "out", "--device", "cuda:0")
    assert code == 0, report
    assert "cuda:0" in report
    for stem, picture in pictures.items():
        mask, _ = read_mask(tmp_path / "out" / f"{stem}.png")
        assert (mask == eager_labels(generator, cfg, picture)).mean() > 0.999  # cuDNN sums in another order


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert train_cli.main(["--run-dir", str(run_dir), "--device-map", "g:cpu,d:cpu", *TINY_OVERRIDES]) == 0
    return run_dir


PREDICT_AND_LIST_IMPORTS = """
import json, sys
from segadv.cli.predict import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "torchvision", "segmentation_models_pytorch",
               "albumentations", "timm", "tensorboard"} or m in {"segadv.training.loop", "segadv.models",
               "segadv.engine", "segadv.checkpoint", "segadv.training.build", "segadv.checkpoint.inference"}
               # the data package's torch-free helpers (the image reader, the palette, the mask writer) are predict's own
               or (m.startswith("segadv.data.") and m not in {"segadv.data.images", "segadv.data.palette",
                                                              "segadv.data.masks"}))
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


def test_trained_run_exports_and_predicts_on_onnxruntime_without_torch(trained_run, image_dir, tmp_path):
    """The issue's 'done when': segadv-export, then segadv-predict --model, on a run's last.pt; the
    ONNX path imports neither torch nor the training code (checked in a fresh process)."""
    ckpt = trained_run / "checkpoints" / "last.pt"
    fp32 = run_export(ckpt, tmp_path / "exports" / "model.onnx")
    fp16 = run_export(ckpt, tmp_path / "exports" / "model_fp16.onnx", "--half", "--with-preprocess")
    assert json.loads(sidecar_path(fp16).read_text())["input"]["dtype"] == "uint8"
    folder, pictures = image_dir
    argvs = [["--model", str(path), "--input", str(folder), "--output", str(tmp_path / path.stem), "--overlay"]
             for path in (fp32, fp16)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", PREDICT_AND_LIST_IMPORTS, json.dumps(argvs)],
                            capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary == {"codes": [0, 0], "heavy": []}, result.stderr
    for stem in SIZES:
        mask32, _ = read_mask(tmp_path / "model" / f"{stem}.png")
        mask16, _ = read_mask(tmp_path / "model_fp16" / f"{stem}.png")
        assert mask32.shape == pictures[stem].shape[:2]
        assert (mask32 == mask16).mean() > 0.99
        assert (tmp_path / "model" / "overlay" / f"{stem}.png").is_file()


def test_an_overlay_keeps_the_images_brightness_where_the_mask_is_background():
    """Class 0 is black in the palette: blending with it would halve the image's brightness."""
    import io

    import numpy as np
    from PIL import Image

    from segadv.data.palette import palette
    from segadv.data.masks import overlay_png

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    labels = np.zeros((16, 16), dtype=np.int64)
    labels[4:8, 4:8] = 1
    colours = palette(3)
    out = np.asarray(Image.open(io.BytesIO(overlay_png(image, labels, colours, 0.5))))
    background = labels == 0
    assert np.array_equal(out[background], image[background])
    expected = np.clip(image[~background] * 0.5 + colours[1] * 0.5 + 0.5, 0, 255).astype(np.uint8)
    assert np.array_equal(out[~background], expected)


def test_legal_long_input_names_are_all_written_or_refused_before_any(onnx_model, image_dir, tmp_path, capsys):
    folder, _ = image_dir
    inputs = tmp_path / "in"
    inputs.mkdir()
    first = sorted(folder.glob("*.png"))[0]
    shutil.copy(first, inputs / "a.png")
    long_name = "b" * 250 + ".png"  # 254 bytes: its temp file's name would be longer than 255
    shutil.copy(first, inputs / long_name)
    code, _ = predict_main("--model", onnx_model, "--input", inputs, "--output", tmp_path / "out", "--device", "cpu")
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(["a.png", long_name])
    # An input named with any suffix whose mask name would pass 255 bytes: refused before any mask.
    odd = tmp_path / "odd"
    odd.mkdir()
    name = "c" * 253 + ".x"
    shutil.copy(first, odd / name)
    code, _ = predict_main("--model", onnx_model, "--input", odd / name, "--output", tmp_path / "out2", "--device",
                           "cpu")
    err = capsys.readouterr().err
    assert code == 2 and "would have a name of 257 bytes, longer than the 255" in err
    assert not (tmp_path / "out2").exists()
