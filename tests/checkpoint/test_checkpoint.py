"""Training checkpoints: exact round trip, unwrapped keys, atomic writes, clear errors."""

import pytest
import torch
from torch import nn

from segadv.training.build import build_training
from segadv.checkpoint import CheckpointManager, read_checkpoint, restore
from segadv.config import config_from_dict, config_to_dict
from segadv.data.streams import Streams
from segadv.errors import UserError
from segadv.parallel import parse_device_map
from segadv.training.run_data import run_state

from helpers import batch


def build(cfg, seed):
    torch.manual_seed(seed)
    return build_training(cfg, parse_device_map("g:cpu,d:cpu"))


def params(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_round_trip_restores_everything_and_continues_identically(tiny_cfg, tmp_path):
    tiny_cfg.amp.discriminator.enabled = True
    tiny_cfg.amp.discriminator.dtype = "float16"  # so a real scaler state is saved
    tiny_cfg.amp.discriminator.init_scale = 256.0
    parts = build(tiny_cfg, seed=0)
    for step in range(2):
        parts.method.iteration(*batch(tiny_cfg, seed=step), step=step)
    ckpt_path = CheckpointManager(tmp_path, run_state(parts, Streams()), every=2,
                                  config=config_to_dict(tiny_cfg)).save(2)
    assert ckpt_path.name == "step_2.pt" and (tmp_path / "checkpoints" / "last.pt").is_file()

    restored = build(tiny_cfg, seed=123)  # different init: everything must come from the file
    ckpt = read_checkpoint(ckpt_path)
    assert restore(ckpt, run_state(restored, Streams())) == 2
    assert config_from_dict(ckpt["config"]) == tiny_cfg
    assert_same(params(parts.g.module), params(restored.g.module))
    assert_same(params(parts.d.module), params(restored.d.module))
    assert restored.g.opt.lr == parts.g.opt.lr and restored.d.opt.lr == parts.d.opt.lr
    assert restored.d.opt.loss_scale() == parts.d.opt.loss_scale()

    # The next step from the original and from the restored state is the same step.
    for run in (parts, restored):
        torch.manual_seed(7)
        run.method.iteration(*batch(tiny_cfg, seed=2), step=2)
    assert_same(params(parts.g.module), params(restored.g.module))
    assert_same(params(parts.d.module), params(restored.d.module))


def test_wrapped_networks_are_saved_unwrapped(tiny_cfg, tmp_path):
    parts = build(tiny_cfg, seed=0)
    parts.g.module, parts.d.module = nn.DataParallel(parts.g.module), nn.DataParallel(parts.d.module)
    state = CheckpointManager(tmp_path, run_state(parts, Streams()), every=1).state_dict()
    for net in ("generator", "discriminator"):
        assert not any(k.startswith("module.") for k in state[net])
    build(tiny_cfg, seed=1).g.module.load_state_dict(state["generator"])  # strict by default


def test_atomic_save_leaves_no_temporary_files(tiny_cfg, tmp_path):
    parts = build(tiny_cfg, seed=0)
    CheckpointManager(tmp_path, run_state(parts, Streams()), every=5).save(3)  # not a multiple of every: last.pt only
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.pt"]


def test_corrupt_and_missing_checkpoints_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="checkpoint not found"):
        read_checkpoint(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(UserError, match=r"bad\.pt is truncated or corrupt"):
        read_checkpoint(bad)


class Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickled_code_is_refused(tmp_path, capsys):
    evil = tmp_path / "evil.pt"
    torch.save({"generator": Payload()}, evil)
    with pytest.raises(UserError, match=r"evil\.pt was refused: it needs arbitrary pickled code"):
        read_checkpoint(evil)
    assert "this must never run" not in capsys.readouterr().out


def test_truncated_checkpoint_is_a_user_error(tiny_cfg, tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(1000)}, good)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[:500])
    with pytest.raises(UserError, match=r"cut\.pt is truncated or corrupt"):
        read_checkpoint(cut)
