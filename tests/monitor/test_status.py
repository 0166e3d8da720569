"""RUN/status.json: how a run ended (finished, stopped, diverged, failed), its step and scores."""

import json
import math
import signal
from pathlib import Path

import pytest
import torch

from segadv import __version__
from segadv.cli import train as train_cli
from segadv.training import session as run_session
from segadv.data.streams import Stream
from segadv.errors import Diverged, UserError, cli_entry, exit_code_of
from segadv.monitor.status import RunRecord, read_status
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from helpers import records


def at_draw(monkeypatch, draw, action):
    """``action(batch)`` runs when the labeled stream hands out its ``draw``-th batch."""
    original = Stream.next

    def next_batch(self):
        batch = original(self)
        if self.drawn == draw:
            batch = action(batch)
        return batch

    monkeypatch.setattr(Stream, "next", next_batch)


def status_of(run_dir):
    return json.loads((run_dir / "status.json").read_text())


def val_records(run_dir):
    return [r for r in records(run_dir) if "val/mIoU" in r]


def test_a_stopped_run_then_its_resume_to_the_end(tiny_cfg):
    first = train(tiny_cfg, stop_at=2)
    status = status_of(first.run_dir)
    assert (status["outcome"], status["stopped_by"], status["step"], status["start_step"]) == ("stopped", "stop_at", 2, 0)
    assert status["exit_code"] == 0 and status["error"] is None and status["segadv_version"] == __version__
    val = val_records(first.run_dir)[-1]
    assert status["final"] == {"step": 2, "mIoU": val["val/mIoU"], "pixel_acc": val["val/pixel_acc"]}
    assert status["best"] == status["final"] and status["total_wall_s"] == status["wall_s"] > 0
    first_wall = status["wall_s"]

    done = train(tiny_cfg, resume="auto")
    status = status_of(done.run_dir)
    assert (status["outcome"], status["stopped_by"], status["step"], status["start_step"]) == ("finished", None, 4, 2)
    assert status["max_steps"] == 4 and status["exit_code"] == 0 and status["ended_at"] >= status["started_at"]
    by_step = {r["step"]: r for r in val_records(done.run_dir)}
    assert status["final"] == {"step": 4, "mIoU": by_step[4]["val/mIoU"], "pixel_acc": by_step[4]["val/pixel_acc"]}
    best = json.loads((done.run_dir / "checkpoints" / "best.json").read_text())
    assert status["best"] == {"step": best["step"], "mIoU": best["mIoU"],
                              "pixel_acc": by_step[best["step"]]["val/pixel_acc"]}
    assert status["total_wall_s"] == pytest.approx(first_wall + status["wall_s"], abs=0.11)  # both attempts


def test_a_sigterm_stops_the_run_and_says_so(tiny_cfg, monkeypatch):
    tiny_cfg.train.max_steps = 8

    def terminate(batch):
        signal.raise_signal(signal.SIGTERM)  # as a scheduler's preemption: caught, the run stops at the step's end
        return batch

    at_draw(monkeypatch, 3, terminate)
    result = train(tiny_cfg)
    status = status_of(result.run_dir)
    assert (status["outcome"], status["stopped_by"], status["step"], status["exit_code"]) == ("stopped", "SIGTERM", 3, 0)
    assert status["final"]["step"] == 2  # the last evaluation before the stop


def test_a_diverged_run_says_so_with_the_step_and_exit_3(tiny_cfg, monkeypatch):
    tiny_cfg.train.log_every = 1
    at_draw(monkeypatch, 3, lambda batch: (torch.full_like(batch[0], math.nan), *batch[1:]))
    with pytest.raises(Diverged) as raised:
        train(tiny_cfg)
    status = status_of(Path(tiny_cfg.run_dir))
    assert (status["outcome"], status["step"], status["exit_code"]) == ("diverged", 3, 3)
    assert status["error"] == str(raised.value) and status["error"].startswith("training diverged")
    assert status["final"]["step"] == 2 and status["best"]["step"] == 2


def test_a_failed_run_keeps_its_error_and_exit_code(tmp_path, monkeypatch, capsys):
    """Through segadv-train's entry point: the error reaches the user unchanged (exit 2, its
    message), and status.json records the same."""
    def bad_sample(batch):
        raise UserError("cannot read data/x.png: not an image")

    at_draw(monkeypatch, 3, bad_sample)
    run_dir = tmp_path / "r"
    code = train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES, "log.tensorboard=false"])
    err = capsys.readouterr().err
    assert code == 2 and "error: cannot read data/x.png: not an image; " in err and "Traceback" not in err
    status = status_of(run_dir)
    assert (status["outcome"], status["step"], status["exit_code"]) == ("failed", 2, 2)
    assert status["error"].startswith("cannot read data/x.png: not an image; ")


def test_a_failed_start_writes_nothing_new_and_leaves_an_earlier_status_as_it_was(tiny_cfg, monkeypatch):
    """A refused start of a resume changes nothing in the run dir (docs/failures.md): the earlier
    run's status.json stays, byte for byte, what its last attempt wrote."""
    def refuse(*args, **kwargs):
        raise UserError("init.generator.path: no such file")

    monkeypatch.setattr(run_session, "build_training", refuse)
    with pytest.raises(UserError):
        train(tiny_cfg)
    run_dir = Path(tiny_cfg.run_dir)
    assert not (run_dir / "status.json").exists()  # no run began: nothing to describe
    monkeypatch.undo()

    train(tiny_cfg, stop_at=2)
    earlier = (run_dir / "status.json").read_bytes()
    assert status_of(run_dir)["outcome"] == "stopped"
    monkeypatch.setattr(run_session, "build_training", refuse)
    with pytest.raises(UserError):
        train(tiny_cfg, resume="auto")
    assert (run_dir / "status.json").read_bytes() == earlier


def test_record_units(tmp_path):
    """A second Ctrl-C is a stop (exit 130); another rank writes nothing; an unreadable file reads as none."""
    with pytest.raises(KeyboardInterrupt):
        with RunRecord(tmp_path, max_steps=10) as record:
            record.begin(0, None)
            record.reached(5)
            raise KeyboardInterrupt
    status = read_status(tmp_path)
    assert (status.outcome, status.stopped_by, status.step, status.exit_code) == ("stopped", "SIGINT", 5, 130)
    other = tmp_path / "other"
    other.mkdir()
    with RunRecord(other, max_steps=10, enabled=False) as record:
        record.begin(0, None)
        record.end(None)
    assert list(other.iterdir()) == []
    (other / "status.json").write_text("{not json")
    assert read_status(other) is None


@pytest.mark.parametrize("err", [UserError("x"), Diverged("x"), RuntimeError("x"), KeyboardInterrupt(),
                                 RuntimeError("Wrong input shape height=30, width=30. Expected image height "
                                              "and width divisible by 16")])
def test_exit_code_of_is_what_cli_entry_returns(err):
    @cli_entry
    def main(argv=None):
        raise err

    try:
        code = main([])
    except RuntimeError:
        code = 1  # let through with its traceback: Python exits 1
    assert exit_code_of(err) == code
