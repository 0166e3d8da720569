"""``--network student|teacher`` end to end (issue 47): a tiny mean_teacher run trained through the
loop, then segadv-eval, segadv-export and segadv-predict on its checkpoint, each asked for the
student or the teacher; and ``--network teacher`` on a checkpoint without a teacher, exit 2 from
each command naming the option. tests/checkpoint/test_inference_network.py holds the loader itself."""

import contextlib
import io
import json
import logging

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

from segadv import __version__
from segadv.checkpoint import inference, read_checkpoint
from segadv.cli import eval as eval_cli
from segadv.cli import export as export_cli
from segadv.cli import predict as predict_cli
from segadv.config import load_config
from segadv.data import SyntheticShapes
from segadv.export.sidecar import prepare_input, sidecar_path
from segadv.models import build_generator
from segadv.training.loop import train

from conftest import TINY_OVERRIDES

# A whole training run and three commands: left out of make test-fast, as the CLI trainings are.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A mean_teacher run (semi-supervised: the labeled and unlabeled streams) of 3 steps, and a
    supervised run of 1 step (no teacher). With DACS's warm-up (decay 0, 1/2, 2/3) the teacher after
    3 steps is an average of G's three states, not G."""
    tmp = tmp_path_factory.mktemp("network-e2e")
    paths = []
    for name, extra in (("mt", ["method.name=mean_teacher", "data.labeled_fraction=0.5", "train.max_steps=3"]),
                        ("plain", ["train.max_steps=1"])):
        cfg = load_config(None, [*TINY_OVERRIDES, *extra, "train.eval_every=100", "checkpoint.every=100",
                                 "log.tensorboard=false", "train.deterministic=true"])
        cfg.run_dir, cfg.device_map = str(tmp / name), "cpu"
        paths.append(train(cfg).run_dir / "checkpoints" / "last.pt")
    saved = read_checkpoint(paths[0])
    assert "teacher" in saved and "teacher" not in read_checkpoint(paths[1])
    # The premise of every test below: the two networks differ.
    assert any(not torch.equal(saved["teacher"][k], saved["generator"][k]) for k in saved["teacher"]
               if saved["teacher"][k].is_floating_point())
    return paths[0], paths[1], saved


def network_module(saved, key):
    cfg = load_config(None, [*TINY_OVERRIDES])
    module = build_generator(cfg.model.generator, cfg.data.num_classes)
    module.load_state_dict(saved[key])
    return module.eval(), cfg


@pytest.fixture
def loaded_weights(monkeypatch):
    """The state dict of every network the inference loader builds (its one weight path), in order."""
    seen = []
    real = inference._load_into

    def spy(*args, **kwargs):
        model = real(*args, **kwargs)
        seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return model

    monkeypatch.setattr(inference, "_load_into", spy)
    return seen


def loader_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == inference.log.name]


@pytest.mark.parametrize("network", ["student", "teacher"])
def test_eval_loads_and_scores_the_network_asked_for(runs, network, loaded_weights, caplog, capsys):
    path, _, saved = runs
    key = inference.NETWORKS[network]
    with caplog.at_level(logging.INFO, logger=inference.log.name):
        assert eval_cli.main(["--checkpoint", str(path), "--network", network, "--device", "cpu", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.0 <= metrics["mIoU"] <= 1.0
    # The log says which network, by its option value and its checkpoint key.
    assert any(f"the {network} ({key})" in line for line in loader_lines(caplog)), loader_lines(caplog)
    (weights,) = loaded_weights
    assert weights.keys() == saved[key].keys()
    assert all(torch.equal(weights[k], saved[key][k]) for k in weights)  # that entry, bitwise
    other = saved[inference.NETWORKS["teacher" if network == "student" else "student"]]
    assert any(not torch.equal(weights[k], other[k]) for k in weights if weights[k].is_floating_point())


def run_export(path, output, *extra):
    with contextlib.redirect_stdout(io.StringIO()) as report:
        code = export_cli.main(["--checkpoint", str(path), "--output", str(output), *extra])
    assert code == 0, report.getvalue()
    return output


def run_onnx(path, x):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory):
    path = runs[0]
    folder = tmp_path_factory.mktemp("exports")
    return {network: run_export(path, folder / f"{network}.onnx", "--network", network)
            for network in ("student", "teacher")}


def test_the_teacher_export_reproduces_the_teachers_logits_and_not_the_students(runs, exports):
    """The export's own verification runs against the loaded network in eager; here its ONNX is
    held to the checkpoint's ``teacher`` entry, built on its own, within the float32 export
    tolerance (2e-4 of the logits' range: fusions reorder sums); the student's export differs from
    it by far more than that."""
    _, _, saved = runs
    pixels = np.random.default_rng(0).integers(0, 256, size=(2, 3, 64, 96), dtype=np.uint8)
    eager, got = {}, {}
    for network in ("student", "teacher"):
        module, cfg = network_module(saved, inference.NETWORKS[network])
        x = prepare_input(pixels, "normalized", "float32", cfg.data.mean, cfg.data.std)
        with torch.inference_mode():
            eager[network] = module(torch.from_numpy(x)).numpy()
        got[network] = run_onnx(exports[network], x)
        assert got[network].shape == eager[network].shape
    tolerance = 2e-4 * max(1.0, float(np.abs(eager["teacher"]).max()))
    deviation = {n: float(np.abs(got[n] - eager[n]).max()) for n in got}
    assert all(v <= tolerance for v in deviation.values()), (deviation, tolerance)
    # Three steps apart, the networks' logits differ by about 1e-2 here (measured 1.1e-2): ten
    # times the tolerance, so each export matches its own network and not the other.
    student_gap = float(np.abs(got["student"] - got["teacher"]).max())
    assert student_gap > 10 * tolerance, (student_gap, tolerance)
    meta = json.loads(sidecar_path(exports["teacher"]).read_text())
    assert meta["source"]["network"] == "teacher"
    assert json.loads(sidecar_path(exports["student"]).read_text())["source"]["network"] == "student"


def teacher_as_generator(saved, path):
    """A checkpoint whose only network is ``saved``'s teacher, as its generator: what
    ``--network teacher`` must predict, through the same pipeline and the same eager code."""
    torch.save({"format": "segadv", "format_version": 1, "segadv_version": __version__, "step": saved["step"],
                "generator": saved["teacher"], "config": saved["config"]}, path)
    return path


def test_predict_with_the_teacher_predicts_what_the_teachers_weights_predict(runs, tmp_path, caplog):
    path, _, saved = runs
    images = tmp_path / "images"
    images.mkdir()
    for i, (h, w) in enumerate(((64, 64), (48, 112))):
        Image.fromarray(SyntheticShapes("val", 4, max(h, w), 5, seed=3).raw(i)[0][:h, :w]).save(images / f"{i}.png")
    alone = teacher_as_generator(saved, tmp_path / "teacher_alone.pt")
    outputs = {}
    for name, source in (("teacher", ["--checkpoint", path, "--network", "teacher"]),
                         ("alone", ["--checkpoint", alone])):
        outputs[name] = tmp_path / f"out-{name}"
        with caplog.at_level(logging.INFO, logger=inference.log.name), \
                contextlib.redirect_stdout(io.StringIO()):
            assert predict_cli.main([str(a) for a in (*source, "--input", images, "--output", outputs[name],
                                                      "--device", "cpu")]) == 0
    assert any("the teacher (teacher)" in line for line in loader_lines(caplog)), loader_lines(caplog)
    for i in range(2):
        with Image.open(outputs["teacher"] / f"{i}.png") as a, Image.open(outputs["alone"] / f"{i}.png") as b:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the same eager code: exact


@pytest.mark.parametrize("command", ["eval", "export", "predict"])
def test_teacher_on_a_checkpoint_without_one_exits_2_naming_the_option(runs, tmp_path, command, capsys):
    _, plain, _ = runs
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(tmp_path / "in.png")
    argv = {"eval": (eval_cli, ["--checkpoint", plain, "--device", "cpu"]),
            "export": (export_cli, ["--checkpoint", plain, "--output", tmp_path / "m.onnx"]),
            "predict": (predict_cli, ["--checkpoint", plain, "--input", tmp_path / "in.png",
                                      "--output", tmp_path / "out", "--device", "cpu"])}
    cli, args = argv[command]
    assert cli.main([str(a) for a in (*args, "--network", "teacher")]) == 2
    err = capsys.readouterr().err
    assert "--network teacher" in err and "holds no teacher" in err, err
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "out").exists()
