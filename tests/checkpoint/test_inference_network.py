"""``--network student|teacher`` (issue 47): the one inference loader picks the mean teacher's
student (the network the run scored as val/mIoU, by default) or its teacher; a checkpoint without
a teacher refuses ``--network teacher`` with exit 2."""

import json

import pytest
import torch

from segadv.checkpoint import read_checkpoint
from segadv.checkpoint.inference import load_generator
from segadv.cli import eval as eval_cli
from segadv.cli import predict as predict_cli
from segadv.errors import UserError
from segadv.training.loop import train

from helpers import resume_cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("network")
    mean_teacher = train(resume_cfg(tmp, "mt", "method.name=mean_teacher", "data.labeled_fraction=0.5",
                                    "train.max_steps=2"))
    plain = train(resume_cfg(tmp, "plain", "train.max_steps=1"))
    return mean_teacher.run_dir / "checkpoints" / "last.pt", plain.run_dir / "checkpoints" / "last.pt"


def test_the_loader_picks_the_student_by_default_and_the_teacher_when_asked(runs, monkeypatch):
    from segadv.checkpoint import inference

    said = []
    monkeypatch.setattr(inference.log, "info", lambda message, *args: said.append(message % args))
    path, _ = runs
    saved = read_checkpoint(path)
    default = load_generator(path)
    assert default.network == "student"
    assert any("the student (generator); the run scored it as val/mIoU" in line for line in said)
    teacher = load_generator(path, network="teacher")
    assert teacher.network == "teacher" and teacher.source_info()["network"] == "teacher"
    for name, tensor in teacher.model.state_dict().items():
        assert torch.equal(tensor, saved["teacher"][name]), name
    for name, tensor in load_generator(path, network="student").model.state_dict().items():
        assert torch.equal(tensor, saved["generator"][name]), name
    assert any(not torch.equal(saved["teacher"][n], saved["generator"][n]) for n in saved["teacher"])


def test_teacher_on_a_checkpoint_without_one_exits_2(runs, capsys):
    _, plain = runs
    with pytest.raises(UserError, match="holds no teacher"):
        load_generator(plain, network="teacher")
    assert eval_cli.main(["--checkpoint", str(plain), "--network", "teacher", "--device", "cpu"]) == 2
    assert "--network teacher" in capsys.readouterr().err


def test_eval_evaluates_the_network_asked_for(runs, capsys):
    path, _ = runs
    scores = {}
    for network in ("student", "teacher"):
        assert eval_cli.main(["--checkpoint", str(path), "--network", network, "--device", "cpu", "--json"]) == 0
        scores[network] = json.loads(capsys.readouterr().out)
    assert set(scores["student"]) == set(scores["teacher"])


def test_predict_and_export_take_the_option():
    assert predict_cli.build_parser().parse_args(["--checkpoint", "x.pt", "--input", "a.png", "--output", "o",
                                                  "--network", "teacher"]).network == "teacher"
    from segadv.cli import export as export_cli

    parser = export_cli.build_parser()
    assert any("--network" in action.option_strings for action in parser._actions)
