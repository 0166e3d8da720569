"""segadv-experiment table: any run dirs side by side, their outcome from status.json (or unknown,
from metrics.jsonl), steps, scores, wall time and the config keys that differ."""

import json

import yaml

from segadv.cli import experiment
from segadv.monitor.status import RunStatus, Score
from segadv.training.lock import RunDirLock


def make_run(run_dir, config, status=None, vals=()):
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "val/mIoU": miou, "val/pixel_acc": 0.9}) + "\n" for step, miou in vals))
    if status is not None:
        (run_dir / "status.json").write_text(RunStatus(**{
            "start_step": 0, "wall_s": 30.0, "total_wall_s": 30.0, "started_at": "2026-11-25T00:00:00+00:00",
            "segadv_version": "0.1.0", **status}).model_dump_json())
    return run_dir


def config(seed, lambda_adv=0.01, run_dir="x"):
    return {"run_dir": run_dir, "train": {"seed": seed, "max_steps": 8}, "loss": {"lambda_adv": lambda_adv},
            "data": {"mean": [0.5, 0.5, 0.5]}}


def test_outcomes_scores_and_only_the_keys_that_differ(tmp_path, capsys):
    final = Score(step=8, mIoU=0.61234, pixel_acc=0.9)
    a = make_run(tmp_path / "a", config(0, run_dir="a"), {
        "outcome": "finished", "step": 8, "max_steps": 8, "final": final, "best": final, "exit_code": 0})
    b = make_run(tmp_path / "b", config(1, 0.0, run_dir="b"), {
        "outcome": "stopped", "step": 5, "max_steps": 8, "stopped_by": "SIGTERM", "exit_code": 0,
        "final": Score(step=4, mIoU=0.5), "best": Score(step=4, mIoU=0.5), "wall_s": 700.0, "total_wall_s": 700.0})
    c = make_run(tmp_path / "c", config(2, run_dir="c"), vals=[(4, 0.4), (8, 0.3)])  # no status.json
    d = make_run(tmp_path / "d", config(0, run_dir="d"), {"outcome": "diverged", "step": 3, "max_steps": 8,
                                                           "error": "training diverged: ...", "exit_code": 3})
    assert experiment.main(["table", str(a), str(b), str(c), str(d)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| run | outcome | steps | final mIoU (step) | best mIoU (step) | wall | loss.lambda_adv | train.seed |"  # config.yaml's order
    assert lines[2] == f"| {a} | finished | 8/8 | 0.6123 (8) | 0.6123 (8) | 30 s | 0.01 | 0 |"
    assert lines[3] == f"| {b} | stopped (SIGTERM) | 5/8 | 0.5000 (4) | 0.5000 (4) | 11.7 min | 0.0 | 1 |"
    assert lines[4] == f"| {c} | unknown | 8/8 | 0.3000 (8) | 0.4000 (4) | - | 0.01 | 2 |"
    assert lines[5] == f"| {d} | diverged (exit 3) | 3/8 | - | - | 30 s | 0.01 | 0 |"
    assert any(line.startswith("unknown: no status.json") for line in lines)

    assert experiment.main(["table", str(a), str(c), "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["differing_keys"] == ["train.seed"]
    first, second = table["runs"]
    assert first == {"run_dir": str(a), "outcome": "finished", "stopped_by": None, "exit_code": 0, "step": 8,
                     "max_steps": 8, "final": final.model_dump(), "best": final.model_dump(), "wall_s": 30.0,
                     "config": {"train.seed": 0}}
    assert (second["outcome"], second["final"], second["wall_s"]) == (
        "unknown", {"step": 8, "mIoU": 0.3, "pixel_acc": 0.9}, None)


def test_a_running_status_is_killed_once_no_process_holds_the_run_dir(tmp_path, capsys):
    run = make_run(tmp_path / "r", config(0), {"outcome": "running", "step": 4, "max_steps": 8})
    with RunDirLock(run):
        assert experiment.main(["table", str(run)]) == 0
        assert f"| {run} | running | 4/8 |" in capsys.readouterr().out
    assert experiment.main(["table", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"| {run} | killed | 4/8 |" in out and "killed: its status.json says running" in out


def test_a_directory_that_is_no_run_exits_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert experiment.main(["table", str(tmp_path / "empty")]) == 2
    assert f"{tmp_path / 'empty'} is not a run dir: it has none of status.json, config.yaml, metrics.jsonl" in \
        capsys.readouterr().err
