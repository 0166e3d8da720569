"""What a run keeps for its user across attempts: its time (perf/train_seconds, the profile,
status.json's total_wall_s continue from the checkpoint's clock), its console log (RUN/train.log),
its config in TensorBoard, and --resume last / best (issue 50)."""

from __future__ import annotations

import json
import logging

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from segadv.checkpoint import read_checkpoint
from segadv.cli import train as train_cli
from segadv.monitor.profile import PhaseTimer, RunClock, RunProfile
from segadv.monitor.progress import Progress
from segadv.training.process import RunLogHandler

from conftest import TINY_OVERRIDES
from helpers import records

RUN_ARGS = ["--device-map", "cpu", *TINY_OVERRIDES]


def evaluations(run_dir) -> dict[int, float]:
    return {r["step"]: r["perf/train_seconds"] for r in records(run_dir) if "perf/train_seconds" in r}


def status(run_dir) -> dict:
    return json.loads((run_dir / "status.json").read_text())


@pytest.fixture
def two_step_run(tmp_path):
    """2 steps of an intended 4, evaluated and checkpointed at step 2."""
    run_dir = tmp_path / "run"
    assert train_cli.main(["--run-dir", str(run_dir), *RUN_ARGS, "train.max_steps=2"]) == 0
    return run_dir


def test_train_seconds_and_the_profile_continue_from_the_checkpoint_after_a_resume(two_step_run, caplog):
    clock = read_checkpoint(two_step_run / "checkpoints" / "last.pt")["clock"]
    assert clock["train_s"] >= evaluations(two_step_run)[2] > 0
    assert clock["wall_s"] >= clock["train_s"] and clock["phases"]["evaluation"] > 0
    with caplog.at_level("INFO"):
        assert train_cli.main(["--run-dir", str(two_step_run), "--resume", "auto", "train.max_steps=4"]) == 0
    seconds = evaluations(two_step_run)
    assert seconds[4] > clock["train_s"]  # not restarted at 0 in the resumed process
    profile = [r for r in records(two_step_run) if "perf/time/wall" in r][-1]
    assert profile["step"] == 4
    assert profile["perf/time/wall"] > clock["train_s"]
    assert profile["perf/time/evaluation"] > clock["phases"]["evaluation"]  # both attempts' evaluations
    saved = read_checkpoint(two_step_run / "checkpoints" / "last.pt")["clock"]["train_s"]  # after step 4's evaluation
    assert seconds[4] <= saved <= profile["perf/time/wall"]


def test_a_rewind_continues_from_the_time_of_the_step_it_rewinds_to(tmp_path):
    run_dir = tmp_path / "run"
    assert train_cli.main(["--run-dir", str(run_dir), *RUN_ARGS]) == 0  # 4 steps
    first = status(run_dir)
    step_2 = read_checkpoint(run_dir / "checkpoints" / "step_2.pt")["clock"]
    assert train_cli.main(["--run-dir", str(run_dir), "--resume", str(run_dir / "checkpoints" / "step_2.pt")]) == 0
    rewound = status(run_dir)
    assert rewound["start_step"] == 2
    # the abandoned steps 3-4's time is not counted: the checkpoint's wall time up to step 2, then this attempt's
    assert rewound["total_wall_s"] == pytest.approx(step_2["wall_s"] + rewound["wall_s"], abs=0.11)
    assert rewound["total_wall_s"] < first["total_wall_s"] + rewound["wall_s"]
    assert evaluations(run_dir)[4] > step_2["train_s"]


def test_a_checkpoint_without_a_clock_resumes_with_the_time_of_this_process(two_step_run, caplog):
    """A checkpoint written before the clock was kept: resumes, its time counted from the resume."""
    from segadv.checkpoint.io import save_checkpoint

    path = two_step_run / "checkpoints" / "last.pt"
    ckpt = read_checkpoint(path)
    del ckpt["clock"]
    save_checkpoint(ckpt, path)
    assert train_cli.main(["--run-dir", str(two_step_run), "--resume", "last", "train.max_steps=4"]) == 0
    assert 0 < evaluations(two_step_run)[4]
    assert status(two_step_run)["outcome"] == "finished"


def test_a_clock_entry_that_is_no_time_record_starts_again_at_0(caplog):
    clock = RunClock()
    with caplog.at_level(logging.WARNING):
        clock.load_state_dict({"train_s": float("nan"), "wall_s": 1.0, "phases": {}})
    assert clock.earlier is None and "not a time record" in caplog.text
    clock.load_state_dict({"train_s": 5.0, "wall_s": 6.0, "phases": {"evaluation": 2.0}})
    profile = RunProfile(PhaseTimer(), clock.earlier)
    clock.attach(profile, lambda: 1.5)
    state = clock.state_dict()
    assert state["train_s"] >= 5.0 and state["wall_s"] == 7.5 and state["phases"] == {"evaluation": 2.0}
    wall, seconds = profile.table()
    assert seconds["evaluation"] == 2.0 and sum(seconds.values()) == pytest.approx(wall)


def test_resume_best_and_last_name_the_run_dirs_own_checkpoints(two_step_run, caplog, capsys):
    with caplog.at_level("INFO"):
        assert train_cli.main(["--run-dir", str(two_step_run), "--resume", "best", "train.max_steps=4"]) == 0
    assert f"resumed from {two_step_run / 'checkpoints' / 'best.pt'} at step 2" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        assert train_cli.main(["--run-dir", str(two_step_run), "--resume", "last", "train.max_steps=6"]) == 0
    assert f"resumed from {two_step_run / 'checkpoints' / 'last.pt'} at step 4" in caplog.text


def test_resume_best_without_a_best_or_a_run_dir_is_a_user_error_naming_what_to_do(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train_cli.main(["--run-dir", str(run_dir), *RUN_ARGS, "train.max_steps=2"]) == 0
    for name in ("best.pt", "best.json"):  # as a run stopped before its first evaluation has none
        (run_dir / "checkpoints" / name).unlink()
    assert train_cli.main(["--run-dir", str(run_dir), "--resume", "best", "train.max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert f"--resume best: {run_dir / 'checkpoints' / 'best.pt'} does not exist" in err
    assert "--resume auto continues from the newest checkpoint" in err and "Traceback" not in err
    assert train_cli.main(["--resume", "last", *RUN_ARGS]) == 2
    assert "--resume last needs --run-dir" in capsys.readouterr().err


def test_the_console_log_is_kept_in_the_run_dir_and_appended_on_resume(two_step_run):
    log_file = two_step_run / "train.log"
    first = log_file.read_text()
    assert "an attempt starts in" in first and "done: 2 steps, final val mIoU" in first
    assert "checkpoint saved at step 2" in first and "time profile" in first
    assert train_cli.main(["--run-dir", str(two_step_run), "--resume", "auto", "train.max_steps=4"]) == 0
    both = log_file.read_text()
    assert both.startswith(first) and both.count("an attempt starts in") == 2
    assert "resumed from" in both[len(first):] and "done: 4 steps" in both[len(first):]
    assert not any(isinstance(h, RunLogHandler) for h in logging.getLogger().handlers)  # closed with the run


def test_an_error_that_ends_the_run_is_written_to_its_log(two_step_run, monkeypatch):
    from segadv.training import loop

    def fail(*args, **kwargs):
        raise RuntimeError("boom in evaluation")

    monkeypatch.setattr(loop, "evaluate_all", fail)
    with pytest.raises(RuntimeError, match="boom"):  # cli_entry's own test: tests/test_errors.py
        train_cli.main(["--run-dir", str(two_step_run), "--resume", "auto", "train.max_steps=4"])
    assert "ERROR segadv.training.process: the run ended with RuntimeError: boom in evaluation" in \
        (two_step_run / "train.log").read_text()


def test_the_resolved_config_is_in_tensorboard_as_text(tmp_path):
    run_dir = tmp_path / "run"
    assert train_cli.main(["--run-dir", str(run_dir), *RUN_ARGS, "train.max_steps=2", "log.tensorboard=true"]) == 0
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    [tag] = [t for t in events.Tags()["tensors"] if t.startswith("config")]
    [event] = events.Tensors(tag)
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 0 and "      max_steps: 2" in text and "    encoder: mobilenet_v2" in text


def test_the_progress_bar_counts_every_step():
    progress = Progress(10, start=2, bar=True)
    try:
        for step in (3, 4, 5):
            progress.advance(step)
            assert progress._bar.n == step
        assert progress._bar.postfix in (None, "")  # no losses read before a log step
        progress.update(6, {"loss_seg": 0.5})
        assert progress._bar.n == 6 and "loss_seg=0.5000" in progress._bar.postfix
        progress.advance(6)  # the log step's own advance does not count twice
        assert progress._bar.n == 6
    finally:
        progress.close()
