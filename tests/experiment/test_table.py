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


# 9 levels of 9 aliases: a few hundred bytes standing for 9**9 values (254 MB of Markdown unbounded).
ALIAS_BOMB = "a: &a [" + ",".join(["lol"] * 9) + "]\n" + "".join(
    f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def test_files_that_cannot_be_read_are_set_aside_with_a_warning(tmp_path, capsys, caplog):
    final = Score(step=8, mIoU=0.5, pixel_acc=0.9)
    good = make_run(tmp_path / "good", config(0), {"outcome": "finished", "step": 8, "max_steps": 8,
                                                   "final": final, "best": final, "exit_code": 0})
    bomb = make_run(tmp_path / "bomb", config(1), vals=[(4, 0.4)])
    (bomb / "config.yaml").write_text(ALIAS_BOMB)
    binary = make_run(tmp_path / "binary", config(2), {"outcome": "finished", "step": 8, "max_steps": 8,
                                                       "exit_code": 0}, vals=[(8, 0.3)])
    (binary / "status.json").write_bytes(b'{"outcome": "finished\xff"}')
    (binary / "metrics.jsonl").write_bytes(b'{"step": 8, "val/mIoU": 0.3}\n\xfe\n')
    deep = make_run(tmp_path / "deep", config(3), vals=[(8, 0.2)])
    (deep / "config.yaml").write_text("x: " + "[" * 3000 + "]" * 3000 + "\n")
    huge = make_run(tmp_path / "huge", config(4))  # steps no writer writes: out of range, not a crash
    (huge / "metrics.jsonl").write_text('{"step": 1e400, "val/mIoU": 0.5}\n{"step": NaN, "val/mIoU": 0.5}\n'
                                        '{"step": 4, "val/mIoU": 1e400}\n{"step": 6, "val/mIoU": 0.25}\n'
                                        '{"step": ' + "[" * 5000 + '\n')
    runs = [good, bomb, binary, deep, huge]
    with caplog.at_level("WARNING"):
        assert experiment.main(["table", *map(str, runs)]) == 0
    out = capsys.readouterr().out
    assert len(out) < 5000
    lines = out.splitlines()
    assert lines[2].startswith(f"| {good} | finished | 8/8 | 0.5000 (8) |")
    assert lines[3].startswith(f"| {bomb} | unknown | 4 | 0.4000 (4) |")  # its config set aside, not expanded
    assert lines[4].startswith(f"| {binary} | unknown | - | - | - |")  # status.json and metrics.jsonl set aside
    assert lines[5].startswith(f"| {deep} | unknown | 8 | 0.2000 (8) |")
    assert lines[6].startswith(f"| {huge} | unknown | 6/8 | 0.2500 (6) | 0.2500 (6) |")
    warnings = caplog.text
    assert f"{bomb / 'config.yaml'} is refused: its aliases expand to more than 100000 values" in warnings
    assert f"{binary / 'status.json'} is not UTF-8 text: byte 21 is 0xff: set aside" in warnings
    assert f"{binary / 'metrics.jsonl'} is not UTF-8 text: byte 29 is 0xfe: set aside" in warnings
    assert f"{deep / 'config.yaml'} is refused: values nested deeper than 64 levels" in warnings
    assert f"{huge / 'metrics.jsonl'}: line(s) 1, 2 set aside: their step is not a whole number" in warnings
