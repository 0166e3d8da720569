"""D's health in real runs (docs/training.md, "D's health"): a D given a learning rate 100 times
its default wins outright within a few log steps; the warning, ``health/d_state`` and status.json
say so, ``train.on_discriminator_collapse=stop`` ends the run there with a checkpoint, and a resume
(with ``warn``) goes on to the end, its files consistent with the first attempt's. The detector
itself, on synthetic values: tests/monitor/test_diagnostics.py."""

from __future__ import annotations

import json
import logging

import pytest

from segadv.checkpoint.io import read_checkpoint
from segadv.config import load_config
from segadv.monitor.status import read_status
from segadv.training.loop import train

from conftest import TINY_OVERRIDES

pytestmark = pytest.mark.slow  # two short trainings, about 20 s on a loaded 2-core machine

MAX_STEPS, WINDOW = 10, 3
STOP = "train.on_discriminator_collapse: stop"


def health_cfg(run_dir, *extra):
    """The supervised tiny run, logging every step, D at Adam 1e-2 (default 1e-4): it wins by about
    step 4 (loss_d, the sum of D's two halves, near 0; both accuracies 1)."""
    cfg = load_config(None, [*TINY_OVERRIDES, f"train.max_steps={MAX_STEPS}", "train.log_every=1",
                             "train.eval_every=100", "checkpoint.every=100", "log.tensorboard=false",
                             "optim.discriminator.lr=0.01", f"log.d_wins_steps={WINDOW}", *extra])
    cfg.run_dir, cfg.device_map = str(run_dir), "cpu"
    return cfg


def warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "segadv.monitor.diagnostics" and r.levelno == logging.WARNING]


def logged(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "train/loss_d" in r]


def test_the_tiny_run_at_d_default_learning_rate_does_not_warn(tmp_path, caplog):
    """The same run with D at its default learning rate: D stays near chance, nothing warns."""
    cfg = health_cfg(tmp_path / "run", "optim.discriminator.lr=0.0001", "train.max_steps=30")
    with caplog.at_level(logging.INFO):
        train(cfg)
    assert warnings(caplog) == []
    assert {r["health/d_state"] for r in logged(tmp_path / "run")} == {0.0}


def test_a_d_that_wins_outright_is_warned_about_and_stops_the_run_when_asked(tmp_path, caplog):
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        result = train(health_cfg(run_dir, "train.on_discriminator_collapse=stop"))

    # The warning within a few log steps, once, naming the values, the window and the cause.
    [warning] = warnings(caplog)
    stop = result.step
    assert WINDOW <= stop <= 8 < MAX_STEPS
    assert warning.startswith(f"D wins outright: loss_d below 0.04 (2 x the key's: loss_d sums D's two halves) at "
                              f"{WINDOW} consecutive log steps (steps {stop - WINDOW + 1}-{stop}; min ")
    assert "D's accuracy on real 1.000, on fake 1.000" in warning and "Likely cause: D overpowers G" in warning
    assert "Act: lower D's learning rate (optim.discriminator.lr)" in warning
    assert warning.endswith(f"stopping the run ({STOP}).")

    # Stopped cleanly at that step, with a checkpoint and the reason in status.json.
    assert result.stopped_by == f"D wins outright on loss_d, {STOP}"
    assert read_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == stop
    status = read_status(run_dir)
    assert (status.outcome, status.step, status.stopped_by, status.exit_code) == ("stopped", stop, result.stopped_by, 0)
    [episode] = status.discriminator_health
    assert (episode.condition, episode.loss, episode.since, episode.step, episode.until) == \
        ("wins", "loss_d", stop - WINDOW + 1, stop, None)
    assert episode.values["d_acc_real"] == episode.values["d_acc_fake"] == 1.0 and episode.values["loss_d"] < 0.4
    states = [r["health/d_state"] for r in logged(run_dir)]
    assert [r["step"] for r in logged(run_dir)] == list(range(1, stop + 1))
    assert states == [0.0] * (stop - 1) + [1.0]

    # A resume with warn goes on to the end: the check starts over, warns once more and stops nothing.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        resumed = train(health_cfg(run_dir, "train.on_discriminator_collapse=warn"), resume="auto")
    assert (resumed.step, resumed.stopped_by) == (MAX_STEPS, None)
    [again] = warnings(caplog)
    assert f"(steps {stop + 1}-{stop + WINDOW}; " in again and STOP not in again
    status = read_status(run_dir)
    assert (status.outcome, status.start_step, status.step) == ("finished", stop, MAX_STEPS)
    assert [(e.since, e.step, e.until) for e in status.discriminator_health] == \
        [(stop - WINDOW + 1, stop, None), (stop + 1, stop + WINDOW, None)]
    records = logged(run_dir)
    assert [r["step"] for r in records] == list(range(1, MAX_STEPS + 1))  # no step twice, none missing
    assert [r["health/d_state"] for r in records] == \
        [0.0] * (stop - 1) + [1.0] + [0.0] * (WINDOW - 1) + [1.0] * (MAX_STEPS - stop - WINDOW + 1)
