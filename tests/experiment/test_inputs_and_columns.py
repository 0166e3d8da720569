"""Fast checks of segadv-experiment without training: ``run`` and ``run --dry-run`` refuse a grid
whose runs would miss a file or a data folder at their start (every problem named with its rows,
before any run), and ``table`` shows only the config keys that differ between the runs that read
them, compactly."""

import shlex
from pathlib import Path

import pytest
import yaml

from segadv.cli import experiment
from segadv.config import dump_config, load_config
from segadv.errors import UserError
from segadv.experiment import launcher
from segadv.experiment.grid import load_grid
from segadv.methods import method_class
from segadv.monitor.status import RunStatus, Score
from segadv.training.preflight import check_files, missing_files

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = str(ROOT / "configs" / "default.yaml")


@pytest.fixture
def no_runs(monkeypatch):
    monkeypatch.setattr(launcher, "run_trainer", lambda *a, **k: pytest.fail("nothing may run"))


def write_grid(path, rows, seeds=(0,), **extra):
    path.write_text(yaml.safe_dump({"name": "t", "seeds": list(seeds), "rows": rows, **extra}, sort_keys=False))
    return path


def finished(run_dir, overrides=()):
    """A run dir as a finished run of ``default.yaml`` with ``overrides`` leaves it."""
    run_dir.mkdir(parents=True)
    dump_config(load_config(DEFAULT, list(overrides)), run_dir / "config.yaml")
    score = Score(step=4, mIoU=0.5, pixel_acc=0.9)
    (run_dir / "status.json").write_text(RunStatus(
        outcome="finished", step=4, max_steps=4, start_step=0, final=score, best=score, exit_code=0, wall_s=1.0,
        total_wall_s=1.0, started_at="2026-11-27T00:00:00+00:00", segadv_version="test").model_dump_json())


# ------------------------------------------------------------------ run: the inputs, checked first


def test_every_missing_input_is_named_with_its_rows_before_any_run(tmp_path, monkeypatch, capsys, no_runs):
    """A warm start every row reads (common_overrides), a data root, a target's root and local
    encoder weights, all missing: --dry-run and run both exit 2 naming each (key, path, rows), and
    nothing is written."""
    monkeypatch.chdir(tmp_path)
    pretext = "runs/pretext/checkpoints/last.pt"
    grid = write_grid(tmp_path / "grid.yaml", seeds=[0, 1], common_overrides=[f"init.generator.path={pretext}"], rows=[
        {"name": "source only", "config": DEFAULT, "overrides": ["loss.lambda_adv=0"]},
        {"name": "own images", "config": "folder", "overrides": ["data.root=mine",
                                                                 "model.generator.encoder_weights=weights/enc.pth"]},
        {"name": "adapted", "config": "uda", "overrides": ["target_data.kind=folder", "target_data.num_classes=5",
                                                           "target_data.root=target"]},
    ])
    for extra in (["--dry-run"], []):
        assert experiment.main(["run", str(grid), "--out", "out", *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "Traceback" not in captured.err
        lines = captured.err.splitlines()
        assert lines[0] == "error: grid t: 4 problem(s) with the files and data the runs read, so no run was started:"
        assert lines[1:] == [
            f"every row (3): init.generator.path: checkpoint not found: {pretext}",
            "row 'own images': model.generator.encoder_weights: file not found: weights/enc.pth",
            "row 'own images': data.root: mine does not exist",
            "row 'adapted': target_data: data.root: target does not exist",
        ]
        assert not (tmp_path / "out").exists()


def test_with_its_inputs_there_the_dry_run_prints_commands_a_shell_takes(tmp_path, monkeypatch, capsys, no_runs):
    monkeypatch.chdir(tmp_path)
    checkpoint = tmp_path / "runs" / "pretext" / "checkpoints" / "last.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")  # a start only checks that it is there; loading it comes later
    grid = write_grid(tmp_path / "grid.yaml", rows=[{"name": "warm", "config": DEFAULT, "overrides": [
        f"init.generator.path={checkpoint}", "init.generator.exclude=[segmentation_head.*]"]}])
    assert experiment.main(["run", str(grid), "--out", "out", "--dry-run"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    label, _, command = line.partition(": ")
    assert label == "warm, seed 0"
    spec = launcher.RunSpec.of(load_grid(grid), load_grid(grid).rows[0], 0, Path("out"))
    assert shlex.split(command) == spec.command()  # the exclude's brackets quoted, as a shell needs them
    assert "'init.generator.exclude=[segmentation_head.*]'" in command
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_an_earlier_row_writes_is_not_missing(tmp_path, monkeypatch, capsys, no_runs):
    monkeypatch.chdir(tmp_path)
    made = "out/pretext/seed0/checkpoints/last.pt"
    rows = [{"name": "pretext", "config": DEFAULT},
            {"name": "warm", "config": DEFAULT, "overrides": [f"init.generator.path={made}"]}]
    assert experiment.main(["run", str(write_grid(tmp_path / "grid.yaml", rows)), "--out", "out", "--dry-run"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    # ... but a row before it does not write it when it comes after, or when that run is done
    grid = write_grid(tmp_path / "grid.yaml", rows[::-1])
    assert experiment.main(["run", str(grid), "--out", "out", "--dry-run"]) == 2
    assert f"row 'warm': init.generator.path: checkpoint not found: {made}" in capsys.readouterr().err
    finished(tmp_path / "out" / "pretext" / "seed0")
    assert experiment.main(["run", str(write_grid(tmp_path / "grid.yaml", rows)), "--out", "out", "--dry-run"]) == 2
    assert f"row 'warm': init.generator.path: checkpoint not found: {made}" in capsys.readouterr().err


def test_rows_whose_runs_are_all_done_are_not_checked(tmp_path, monkeypatch, capsys, no_runs):
    """A finished run never runs again, so the files it started from may be gone: its row is
    not refused for them; a row with a run still to run is ("every row still to run")."""
    monkeypatch.chdir(tmp_path)
    gone = "runs/pretext/checkpoints/last.pt"
    rows = [{"name": "a", "config": DEFAULT}, {"name": "b", "config": DEFAULT, "overrides": ["loss.lambda_adv=0"]},
            {"name": "c", "config": DEFAULT, "overrides": ["loss.lambda_adv=0.5"]}]
    grid = write_grid(tmp_path / "grid.yaml", rows, common_overrides=[f"init.generator.path={gone}"])
    finished(tmp_path / "out" / "a" / "seed0", [f"init.generator.path={gone}"])
    assert experiment.main(["run", str(grid), "--out", "out", "--dry-run"]) == 2
    assert f"every row still to run (2): init.generator.path: checkpoint not found: {gone}" in capsys.readouterr().err
    for row in rows[1:]:
        finished(tmp_path / "out" / row["name"] / "seed0", [*row["overrides"], f"init.generator.path={gone}"])
    assert experiment.main(["run", str(grid), "--out", "out", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == ["a, seed 0: done", "b, seed 0: done", "c, seed 0: done"]


def test_a_row_that_does_not_load_and_a_missing_file_are_named_together(tmp_path, monkeypatch, capsys, no_runs):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path / "grid.yaml", rows=[
        {"name": "typo", "config": DEFAULT, "overrides": ["train.max_stpes=3"]},
        {"name": "warm", "config": DEFAULT, "overrides": ["init.discriminator.path=d.pt"]}])
    assert experiment.main(["run", str(grid), "--out", "out"]) == 2
    err = capsys.readouterr().err
    assert "grid t: 1 row(s) do not load and 1 problem(s) with the files and data the runs read" in err
    assert "row 'typo': invalid config" in err
    assert "row 'warm': init.discriminator.path: checkpoint not found: d.pt" in err


def test_the_trainers_start_names_every_missing_weights_file(tmp_path):
    """The one check segadv-train's start and the grid share (training/preflight.py): each file."""
    cfg = load_config(DEFAULT, [f"init.generator.path={tmp_path / 'g.pt'}",
                                f"init.discriminator.path={tmp_path / 'd.pt'}",
                                f"model.generator.encoder_weights={tmp_path / 'enc.pth'}"])
    method = method_class(cfg.method.name)
    missing = missing_files(cfg, str(tmp_path / "resume.pt"), method)
    assert [(m.key, m.path) for m in missing] == [
        ("model.generator.encoder_weights", str(tmp_path / "enc.pth")), ("init.generator.path", str(tmp_path / "g.pt")),
        ("init.discriminator.path", str(tmp_path / "d.pt")), ("--resume", str(tmp_path / "resume.pt"))]
    with pytest.raises(UserError, match="checkpoint not found") as info:
        check_files(cfg, None, method)
    assert str(tmp_path / "g.pt") in str(info.value) and str(tmp_path / "d.pt") in str(info.value)
    (tmp_path / "g.pt").write_bytes(b"")
    assert [m.key for m in missing_files(cfg, "auto", method)] == ["model.generator.encoder_weights",
                                                                   "init.discriminator.path"]
