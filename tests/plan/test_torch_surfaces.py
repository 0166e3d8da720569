"""segadv/plan/torch_surfaces.py: each private torch surface the planner uses works on the running
torch, and segadv-plan refuses (exit 2, no traceback) a torch where one is gone or too old."""

import pytest
import torch

from conftest import TINY_OVERRIDES, needs_planner_torch
from segadv.plan import torch_surfaces
from segadv.cli.plan import main

SEMI_ON_TWO_GPUS = ["--config", "semi", "--device-map", "g:1,d:0", "--steps", "1"]


@needs_planner_torch
@pytest.mark.parametrize("key", sorted(torch_surfaces.SURFACES))
def test_each_surface_works_on_the_running_torch(key):
    torch_surfaces.SURFACES[key].probe()  # raises where it does not


@needs_planner_torch
def test_parse_to_reads_every_overload_of_tensor_to():
    assert torch_surfaces.parse_to("cpu") == (torch.device("cpu"), None, None)
    assert torch_surfaces.parse_to(torch.float16) == (None, torch.float16, None)
    assert torch_surfaces.parse_to(torch.empty(0, dtype=torch.bfloat16, device="meta")) == \
        (torch.device("meta"), torch.bfloat16, None)
    assert torch_surfaces.parse_to(device="meta", memory_format=torch.channels_last) == \
        (torch.device("meta"), None, torch.channels_last)


def _break_backend(monkeypatch):
    from torch.utils import backend_registration

    monkeypatch.delattr(backend_registration, "_setup_privateuseone_for_python_backend")


def _break_parse_to(monkeypatch):
    monkeypatch.delattr(torch._C._nn, "_parse_to")


def _break_kineto(monkeypatch):
    from torch.autograd import profiler

    monkeypatch.setattr(profiler.profile, "_stats", None, raising=False)
    original = profiler.profile.__exit__

    def exit_without_kineto(self, *args):
        result = original(self, *args)
        self.kineto_results = None  # what a torch whose profiler keeps its results elsewhere looks like
        return result

    monkeypatch.setattr(profiler.profile, "__exit__", exit_without_kineto)


def _break_autocast(monkeypatch, tmp_path):
    header = tmp_path / "autocast_mode.h"
    header.write_text("// a torch whose autocast lists moved\n")
    monkeypatch.setattr(torch_surfaces, "autocast_header", lambda: header)


BREAKS = {"backend": _break_backend, "parse_to": _break_parse_to, "kineto": _break_kineto,
          "autocast": lambda monkeypatch: _break_autocast(monkeypatch, monkeypatch.tmp_path)}


@needs_planner_torch
@pytest.mark.parametrize("key", sorted(BREAKS))
def test_a_surface_gone_makes_segadv_plan_exit_2_naming_it(key, monkeypatch, tmp_path, capsys):
    monkeypatch.tmp_path = tmp_path
    BREAKS[key](monkeypatch)
    torch_surfaces._works.cache_clear()
    try:
        argv = ["--device-map", "cpu", "--measure", "--steps", "1", *TINY_OVERRIDES] if key == "kineto" else SEMI_ON_TWO_GPUS
        assert main(argv) == 2
    finally:
        torch_surfaces._works.cache_clear()
    err = capsys.readouterr().err
    major, minor = torch_surfaces.torch_version()
    assert f"segadv-plan does not support torch {major}.{minor}: {torch_surfaces.SURFACES[key].name} changed" in err
    assert "Traceback" not in err


def test_a_torch_older_than_the_planner_needs_exits_2_naming_the_version(monkeypatch, capsys):
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    assert main(SEMI_ON_TWO_GPUS) == 2
    err = capsys.readouterr().err
    assert "segadv-plan needs torch 2.10 or newer" in err and "this is torch 2.9.1+cu128" in err
    assert "Traceback" not in err


@pytest.mark.skipif(torch_surfaces.torch_version() >= torch_surfaces.PLANNER_TORCH, reason="the planner's torch")
def test_on_a_torch_below_the_planner_segadv_plan_exits_2(capsys):
    assert main(SEMI_ON_TWO_GPUS) == 2
    assert "segadv-plan needs torch 2.10 or newer" in capsys.readouterr().err


def test_the_planner_needs_the_first_torch_with_python_backend_registration():
    assert torch_surfaces.PLANNER_TORCH == (2, 10)  # 2.9.1's backend_registration has no Python backend

