"""Checkpoints written before the per-network config sections were generated from the role table
(fixtures/before_role_table_*.pt: step 2 of 4-step tiny runs, one supervised with G and D, one mean
teacher with G, its teacher and D, float32) still resume: read into a run built today from the
config they hold, every network's weights and every optimizer's state are the checkpoint's, and
``segadv-train --resume`` carries them on to step 4. (Bitwise equality with an uninterrupted run is
tests/integration/test_resume.py's, on one machine: a stored run's later steps would differ between
CPUs in their last bits.)"""

from pathlib import Path

import pytest
import torch

from segadv.checkpoint import read_checkpoint
from segadv.checkpoint.state import restore
from segadv.cli.train import main as train_main
from segadv.config.loading import config_from_dict
from segadv.parallel import parse_device_map
from segadv.training.build import build_training
from segadv.training.run_data import run_state

FIXTURES = Path(__file__).parent / "fixtures"
ROLES = {"supervised": ["generator", "discriminator"], "mean_teacher": ["generator", "teacher", "discriminator"]}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", sorted(ROLES))
def test_an_old_checkpoint_restores_exactly(name, one_torch_thread):
    old = read_checkpoint(FIXTURES / f"before_role_table_{name}.pt")
    parts = build_training(config_from_dict(old["config"]), parse_device_map("cpu"))
    assert sorted(net.role for net in parts.every_network()) == sorted(ROLES[name])
    assert restore(old, run_state(parts, None)) == 2
    for net in parts.every_network():
        assert same(net.bare.state_dict(), old[net.role]), net.role
        if net.trained:
            assert same(net.opt.optimizer.state_dict()["state"], old[f"optim_{net.role}"]["optimizer"]["state"]), net.role


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ROLES))
def test_an_old_checkpoint_trains_on(name, tmp_path, one_torch_thread):
    assert train_main(["--resume", str(FIXTURES / f"before_role_table_{name}.pt"), "--run-dir", str(tmp_path)]) == 0
    resumed = read_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert resumed["step"] == 4 and all(role in resumed for role in ROLES[name])
