"""tools/experiment.py: a grid of configs x seeds, resumable, tabulated from metrics.jsonl."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from conftest import TINY_OVERRIDES

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("experiment", ROOT / "tools" / "experiment.py")
experiment = importlib.util.module_from_spec(spec)
sys.modules["experiment"] = experiment  # dataclasses look their module up there
spec.loader.exec_module(experiment)


def write_grid(path, rows, seeds=(0, 1), **extra):
    common = [*TINY_OVERRIDES, "train.max_steps=2", "train.eval_every=1", "log.tensorboard=false",
              "device_map=cpu"]
    path.write_text(yaml.safe_dump({"name": "t", "seeds": list(seeds), "rows": rows,
                                    "common_overrides": common, **extra}))
    return path


ROWS = [{"name": "CE only", "config": str(ROOT / "configs" / "default.yaml"), "overrides": ["loss.lambda_adv=0"]},
        {"name": "+ adversarial", "config": str(ROOT / "configs" / "default.yaml")}]


def test_grid_runs_tabulates_and_never_repeats_a_finished_run(tmp_path, monkeypatch):
    grid = write_grid(tmp_path / "grid.yaml", ROWS)
    out = tmp_path / "out"
    assert experiment.main([str(grid), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in results["rows"]] == ["CE only", "+ adversarial"]
    for row in results["rows"]:
        assert row["n"] == 2
        for run in row["runs"]:
            metrics = [json.loads(line) for line in (Path(run["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
            val = [m["val/mIoU"] for m in metrics if "val/mIoU" in m]
            assert run["final_mIoU"] == val[-1] and run["best_mIoU"] == max(val) and run["final_step"] == 2
    ce = results["rows"][0]
    assert ce["final_mean"] == pytest.approx(sum(r["final_mIoU"] for r in ce["runs"]) / 2)
    table = (out / "results.md").read_text()
    assert "| CE only | 2/2 |" in table and "+ adversarial" in table

    def no_run(*args, **kwargs):
        raise AssertionError("a finished run was started again")

    monkeypatch.setattr(experiment.subprocess, "run", no_run)
    assert experiment.main([str(grid), "--out", str(out)]) == 0


def test_a_failed_run_is_named_and_the_others_still_finish(tmp_path, caplog):
    rows = [{"name": "broken", "config": str(ROOT / "configs" / "default.yaml"), "overrides": ["train.max_stpes=3"]},
            ROWS[1]]
    grid = write_grid(tmp_path / "grid.yaml", rows, seeds=[0])
    with caplog.at_level("ERROR"):
        assert experiment.main([str(grid), "--out", str(tmp_path / "out")]) == 1
    assert "broken (seed 0)" in caplog.text and "train.max_stpes" in caplog.text
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["n"] for r in results["rows"]] == [0, 1]


@pytest.mark.parametrize("grid_text, message", [
    ("name: t\nrows: [{name: a, config: configs/default.yaml}]\nrepeats: 3\n", "unknown key(s) repeats"),
    ("name: t\nrows: [{name: a, config: nowhere.yaml}]\n", "config nowhere.yaml does not exist"),
    ("name: t\nrows: [{name: a, config: configs/default.yaml}, {name: a, config: configs/default.yaml}]\n",
     "row name 'a' is used twice"),
    ("name: t\nseeds: 3\nrows: [{name: a, config: configs/default.yaml}]\n", "seeds"),
])
def test_bad_grid_exits_2_naming_the_fault(tmp_path, capsys, monkeypatch, grid_text, message):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(experiment.subprocess, "run", lambda *a, **k: pytest.fail("nothing may run"))
    path = tmp_path / "grid.yaml"
    path.write_text(grid_text)
    assert experiment.main([str(path), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_metrics_reader_final_best_and_resumed_duplicates(tmp_path):
    lines = [{"step": 1, "train/loss_seg": 1.0}, {"step": 2, "val/mIoU": 0.5},
             {"step": 4, "val/mIoU": 0.7}, {"step": 4, "val/mIoU": 0.6},  # resumed: the last record wins
             {"step": 6, "val/mIoU": 0.65, "val/pixel_acc": 0.9}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 7, "val/mIo')  # cut short
    assert experiment.read_val_metrics(path) == {
        "final_step": 6, "final_mIoU": 0.65, "final_pixel_acc": 0.9, "best_step": 6, "best_mIoU": 0.65}
    assert experiment.read_val_metrics(tmp_path / "none.jsonl") == {}


def test_the_shipped_grid_is_valid(monkeypatch):
    monkeypatch.chdir(ROOT)
    grid = experiment.load_grid(ROOT / "configs" / "experiments" / "semi.yaml")
    assert [r.name for r in grid.rows] == ["CE only", "+ adversarial", "+ adversarial + semi"]
    assert grid.seeds == [0, 1, 2]
