"""A checkpoint written before a method declared its networks: fixtures/minent_with_d.pt is a tiny
MinEnt run's (2 steps) from when every run trained a D, so it holds one MinEnt never uses."""

import json
import logging
from pathlib import Path

import torch

from segadv.checkpoint import read_checkpoint
from segadv.checkpoint.state import restore
from segadv.cli.eval import main as eval_main
from segadv.config.loading import config_from_dict
from segadv.parallel import parse_device_map
from segadv.training.build import build_training
from segadv.training.run_data import run_state

OLD_MINENT = Path(__file__).parent / "fixtures" / "minent_with_d.pt"


def test_an_old_minent_checkpoint_resumes_without_its_d(caplog):
    ckpt = read_checkpoint(OLD_MINENT)
    assert "discriminator" in ckpt and "optim_discriminator" in ckpt
    cfg = config_from_dict(ckpt["config"])
    parts = build_training(cfg, parse_device_map("cpu"))
    assert [net.role for net in parts.networks()] == ["generator"]  # MinEnt builds no D
    with caplog.at_level(logging.INFO, logger="segadv.checkpoint.state"):
        assert restore(ckpt, run_state(parts, None)) == 2
    said = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert said == ["the checkpoint holds the discriminator, which this run does not train: ignored"]
    for name, tensor in parts.g.bare.state_dict().items():
        assert torch.equal(tensor, ckpt["generator"][name]), name


def test_segadv_eval_reads_an_old_minent_checkpoint(capsys):
    assert eval_main(["--checkpoint", str(OLD_MINENT), "--json", "--device", "cpu"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["step"] == 2 and 0.0 <= metrics["mIoU"] <= 1.0


def test_an_old_checkpoints_poly_schedule_restores_at_its_saved_lr():
    """Its scheduler state predates optim.*.poly_lag (and warmup_steps): its config reads as their
    defaults, and the schedule resumes at the step and lr it was saved at."""
    ckpt = read_checkpoint(OLD_MINENT)
    saved = ckpt["optim_generator"]["scheduler"]
    assert "lag" not in saved and "poly_lag" not in ckpt["config"]["optim"]["generator"]
    cfg = config_from_dict(ckpt["config"])
    assert cfg.optim.generator.poly_lag == 0
    parts = build_training(cfg, parse_device_map("cpu"))
    restore(ckpt, run_state(parts, None))
    scheduler = parts.g.opt.scheduler
    assert (scheduler.last_epoch, scheduler.lag) == (saved["last_epoch"], 0)
    assert [group["lr"] for group in parts.g.opt.optimizer.param_groups] == saved["_last_lr"]
