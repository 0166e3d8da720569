"""segadv-plan with the mean teacher's third network (issue 47): the teacher where the device map
puts it (t:0, D's card), its memory in that device's figure, the EMA's bytes between the devices,
and a planted EMA update that skips the copy onto the teacher's device caught."""

import json

import pytest
import torch

from conftest import needs_planner_torch
from segadv.cli.plan import main
from segadv.methods import mixing

pytestmark = needs_planner_torch

ARGV = ["--config", "uda", "method.name=mean_teacher", "--json", "--steps", "1"]


def plan(capsys, device_map, *extra):
    assert main([*ARGV, "--device-map", device_map, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_teacher_is_planned_on_the_device_the_map_names(capsys):
    on_d = plan(capsys, "g:1,d:0,t:0")
    assert list(on_d["devices"]) == ["cuda:1", "cuda:0"]
    teacher_row, g_row = on_d["devices"]["cuda:0"], on_d["devices"]["cuda:1"]
    # the teacher's weights (G's architecture), no gradients, no optimizer state, its own forward
    assert teacher_row["params_bytes"] == g_row["params_bytes"] > 0
    assert teacher_row["grads_bytes"] == teacher_row["optimizer_bytes"] == 0
    assert teacher_row["activations_bytes"] > 0 and teacher_row["flops_per_iteration"] > 0
    # every step the EMA copies G's floating weights to the teacher's card
    assert on_d["transfer_bytes_per_iteration"] >= teacher_row["params_bytes"] - 4096

    with_g = plan(capsys, "g:1")  # left out of the map, the teacher shares G's devices
    assert list(with_g["devices"]) == ["cuda:1"]
    assert with_g["devices"]["cuda:1"]["params_bytes"] == 2 * g_row["params_bytes"]
    assert with_g["transfer_bytes_per_iteration"] < teacher_row["params_bytes"]


def test_an_ema_update_that_reads_the_student_where_it_lives_is_caught(monkeypatch, capsys):
    """Planted bug: the EMA without its copy onto the teacher's device (G's weights read on G's
    card into the teacher's on D's): an op mixing the two devices, as CUDA would refuse it."""

    def uncopied(teacher, student, decay):
        teacher, student = list(teacher), [t.detach() for t in student]
        torch._foreach_mul_(teacher, decay)
        torch._foreach_add_(teacher, student, alpha=1.0 - decay)

    monkeypatch.setattr(mixing, "ema_update_", uncopied)
    assert main([*ARGV, "--device-map", "g:1,d:0,t:0"]) == 2
    err = capsys.readouterr().err
    assert "mixes devices" in err and "methods/ema_teacher.py" in err and "Traceback" not in err


def test_advise_considers_the_teacher_with_g_and_with_d():
    from segadv.plan.advise import device_maps

    assert device_maps(2, teacher=True) == ["g:0,d:0", "g:1,d:0", "g:1,d:0,t:0"]  # t left out: with G
    assert device_maps(2) == ["g:0,d:0", "g:1,d:0"]
    assert device_maps(1, teacher=True) == ["g:0,d:0"]
