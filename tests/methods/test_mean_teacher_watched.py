"""The mean teacher can be watched: segadv-ckpt inspect lists the teacher and convert writes it
(``--network``, the option segadv-eval/-export/-predict take), the teacher's val score is logged
beside val/mIoU at each evaluation, and unequal labeled/unlabeled batches are refused at the
start, before the run dir exists."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from segadv.checkpoint import read_checkpoint
from segadv.checkpoint.inference import NETWORKS
from segadv.cli import args as args_cli
from segadv.cli import ckpt as ckpt_cli
from segadv.cli import eval as eval_cli
from segadv.cli import export as export_cli
from segadv.cli import predict as predict_cli
from segadv.cli import train as train_cli
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from helpers import TARGET_DATA, resume_cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A mean-teacher run evaluated at steps 1 and 2 (TensorBoard on), and a plain one."""
    tmp = tmp_path_factory.mktemp("watched")
    mean_teacher = train(resume_cfg(tmp, "mt", "method.name=mean_teacher", "data.labeled_fraction=0.5",
                                    "train.max_steps=2", "train.eval_every=1", "checkpoint.every=1",
                                    "log.tensorboard=true"))
    plain = train(resume_cfg(tmp, "plain", "train.max_steps=1", "train.eval_every=1"))
    return mean_teacher.run_dir, plain.run_dir


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- 1: segadv-ckpt inspect / convert

def test_inspect_lists_the_teacher_of_a_mean_teacher_checkpoint_only(runs, capsys):
    mt, plain = runs
    saved = read_checkpoint(mt / "checkpoints" / "last.pt")
    params = sum(t.numel() for t in saved["teacher"].values())
    assert ckpt_cli.main(["inspect", str(mt / "checkpoints" / "last.pt")]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("teacher:")]
    assert f"{len(saved['teacher'])} tensors, {params:,} values" in line and "EMA of the generator" in line
    assert ckpt_cli.main(["inspect", str(plain / "checkpoints" / "last.pt")]) == 0
    assert not any(line.startswith("teacher:") for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("safetensors", [False, True])
def test_convert_writes_the_network_asked_for(runs, tmp_path, safetensors):
    mt, _ = runs
    last = mt / "checkpoints" / "last.pt"
    saved = read_checkpoint(last)
    extra = ["--safetensors"] if safetensors else []
    written = {}
    for network in ("default", "student", "teacher"):
        out = tmp_path / f"{network}.{'safetensors' if safetensors else 'pt'}"
        argv = ["convert", str(last), "--output", str(out), *extra]
        assert ckpt_cli.main(argv + ([] if network == "default" else ["--network", network])) == 0
        written[network] = load_file(str(out)) if safetensors else read_checkpoint(out)
    for network, key in (("default", "generator"), ("student", "generator"), ("teacher", "teacher")):
        assert set(written[network]) == set(saved[key])
        for name, tensor in written[network].items():
            assert torch.equal(tensor, saved[key][name]), (network, name)
    assert any(not torch.equal(written["teacher"][n], written["student"][n]) for n in written["teacher"])


def test_convert_teacher_of_a_checkpoint_without_one_exits_2_naming_it(runs, tmp_path, capsys):
    _, plain = runs
    last = plain / "checkpoints" / "last.pt"
    out = tmp_path / "t.pt"
    assert ckpt_cli.main(["convert", str(last), "--output", str(out), "--network", "teacher"]) == 2
    err = capsys.readouterr().err
    assert "--network teacher" in err and str(last) in err and "holds no teacher" in err
    assert not out.exists()


def test_every_command_taking_a_checkpoint_has_the_same_network_option():
    assert args_cli.NETWORK_CHOICES == tuple(NETWORKS)  # the loader's keys
    parsers = {"eval": eval_cli.build_parser(), "export": export_cli.build_parser(),
               "predict": predict_cli.build_parser(),
               "ckpt convert": ckpt_cli.build_parser()._subparsers._group_actions[0].choices["convert"]}
    for name, parser in parsers.items():
        [option] = [a for a in parser._actions if "--network" in a.option_strings]
        assert tuple(option.choices) == args_cli.NETWORK_CHOICES and option.default is None, name


# ---------------------------------------------------------------- 2: val/mIoU_teacher

def test_the_teachers_val_score_is_logged_beside_val_miou_at_each_evaluation(runs, capsys):
    mt, plain = runs
    logged = {r["step"]: r["val/mIoU_teacher"] for r in records(mt) if "val/mIoU_teacher" in r}
    assert sorted(logged) == [1, 2]
    assert {r["step"] for r in records(mt) if "val/mIoU" in r} == {1, 2}
    assert not any("val/mIoU_teacher" in r for r in records(plain))
    # the score segadv-eval --network teacher gives the checkpoint of that step
    assert eval_cli.main(["--checkpoint", str(mt / "checkpoints" / "step_2.pt"), "--network", "teacher",
                          "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mIoU"] == pytest.approx(logged[2], abs=1e-6)
    events = EventAccumulator(str(mt / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("val/mIoU_teacher")] == [1, 2]
    assert [e.value for e in events.Scalars("val/mIoU_teacher")] == pytest.approx([logged[1], logged[2]])


# ---------------------------------------------------------------- 2b: the mixed batch's panel

def test_the_mixed_batch_is_drawn_at_each_evaluation(runs):
    """``train/mixed_batch``: the last step's mixed images, their labels and the loss's pixel weights,
    one row per image (the batch of 2 under log.num_images=2), drawn as the panel function draws
    them (so the same size), at each evaluation."""
    from segadv.config.normalization import resolve as resolve_normalization
    from segadv.data.palette import palette
    from segadv.methods.base import TrainingViews
    from segadv.monitor.images import training_views_panel

    mt, _ = runs
    events = EventAccumulator(str(mt / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert "train/mixed_batch" in events.Tags()["images"]
    logged = events.Images("train/mixed_batch")
    assert [e.step for e in logged] == [1, 2]
    size = 64  # data.synthetic.image_size
    views = TrainingViews(torch.zeros(2, 3, size, size), torch.zeros(2, size, size, dtype=torch.long),
                          torch.zeros(2, size, size))
    names = ["background", "circle", "square", "triangle", "ring"]  # the synthetic data's classes
    expected = training_views_panel(views, palette(5), resolve_normalization("imagenet", [0.5] * 3, [0.5] * 3), names)
    assert all((e.width, e.height) == (expected.shape[2], expected.shape[1]) for e in logged)
    assert {name for name in events.Tags()["images"] if name.startswith("train/")} == {"train/mixed_batch"}


# ---------------------------------------------------------------- 3: unequal batches refused at the start

@pytest.mark.parametrize("setting, key", [
    ([], "method.mean_teacher.unlabeled_batch_size"),
    ([TARGET_DATA], "method.mean_teacher.target_batch_size"),
])
def test_unequal_batches_are_refused_at_the_start_naming_both_keys(tmp_path, capsys, setting, key):
    run_dir = tmp_path / "run"
    argv = ["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES, *setting, "method.name=mean_teacher",
            "train.max_steps=1"]
    assert train_cli.main([*argv, f"{key}=3"]) == 2
    err = capsys.readouterr().err
    assert f"{key}=3 differs from data.batch_size=2" in err
    assert not run_dir.exists()
    # the same batch, spelt out, starts as null does
    from segadv.config import load_config
    from segadv.methods import method_class

    cfg = load_config(None, [*TINY_OVERRIDES, *setting, "method.name=mean_teacher", f"{key}=2"])
    method_class("mean_teacher").check_config(cfg)
