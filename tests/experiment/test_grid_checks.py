"""A grid is checked whole before its first run (segadv/experiment/grid.py, launcher.check_runs), and
segadv-experiment passes SIGTERM / SIGINT on to its trainer and waits for it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from segadv.cli import experiment
from segadv.experiment import launcher

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = "configs/default.yaml"


def run_grid(tmp_path, monkeypatch, grid, *argv):
    """experiment.main on ``grid`` (text or bytes) from the repository root, where nothing may run."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(launcher, "run_trainer", lambda *a, **k: pytest.fail("nothing may run"))
    path = tmp_path / "grid.yaml"
    path.write_bytes(grid if isinstance(grid, bytes) else grid.encode())
    return experiment.main(["run", str(path), "--out", str(tmp_path / "out"), *argv])


@pytest.mark.parametrize("grid, message", [
    # a typo or an out-of-range value in the second row: found before the first row runs
    (f"name: t\nrows: [{{name: a, config: {DEFAULT}}}, {{name: b, config: {DEFAULT}, "
     "overrides: [train.max_stpes=3]}]\n", "row 'b': invalid config"),
    (f"name: t\nrows: [{{name: a, config: {DEFAULT}}}, {{name: b, config: {DEFAULT}, "
     "overrides: [data.num_classes=1000]}]\n", "data.num_classes: masks are 8-bit"),
    (f"name: t\ncommon_overrides: [train.max_stpes=3]\nrows: [{{name: a, config: {DEFAULT}}}]\n",
     "train.max_stpes: unknown key; did you mean 'train.max_steps'?"),
    # duplicate keys, as config files refuse them
    (f"name: t\nrows: [{{name: a, config: {DEFAULT}}}]\nrows: [{{name: b, config: {DEFAULT}}}]\n",
     "found duplicate key 'rows'"),
    (f"name: t\nrows: [{{name: a, config: {DEFAULT}, config: configs/semi.yaml}}]\n", "found duplicate key 'config'"),
    # seeds out of train.seed's range
    (f"name: t\nseeds: [-3]\nrows: [{{name: a, config: {DEFAULT}}}]\n", "seed -3 is out of range"),
    (f"name: t\nrows: [{{name: a, config: {DEFAULT}, seeds: [2147483648]}}]\n", "seed 2147483648 is out of range"),
    # a row's override a common override replaces, in either form
    (f"name: t\ncommon_overrides: ['train.max_steps=2']\n"
     f"rows: [{{name: a, config: {DEFAULT}, overrides: ['train={{max_steps: 1}}']}}]\n",
     "rows[0].overrides: train.max_steps also in common_overrides"),
    (f"name: t\ncommon_overrides: ['train={{max_steps: 2}}']\n"
     f"rows: [{{name: a, config: {DEFAULT}, overrides: ['train.max_steps=1']}}]\n",
     "rows[0].overrides: train.max_steps also in common_overrides"),
    # the grid file through the config reader and its caps
    ("name: t\n" + "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n"
                          for p, c in zip("abcdefgh", "bcdefghi")).replace("b: &b [*a", "a: &a [1]\nb: &b [*a"),
     "aliases expand to more than 100000 values"),
])
def test_a_bad_grid_is_refused_whole_before_any_run(tmp_path, monkeypatch, capsys, grid, message):
    assert run_grid(tmp_path, monkeypatch, grid) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, fix", [(".", "letters, digits and -"), ("..", "letters, digits and -"),
                                       ("a/b", "e.g. 'a-b'"), ("", "letters, digits and -"),
                                       ("..\\x", "e.g. 'x'")])
def test_a_grid_name_that_is_not_one_directory_is_refused(tmp_path, monkeypatch, capsys, name, fix):
    """The name is the output directory under runs/experiments/: `.` would write the rows into
    runs/experiments itself, `../x` outside it. Nothing is written."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": name, "rows": [{"name": "a", "config": str(ROOT / DEFAULT)}]}))
    assert experiment.main(["run", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"name: {name!r} cannot name the grid's output directory (runs/experiments/<name>)" in err
    assert fix in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("where", ["row", "common"])
@pytest.mark.parametrize("override", ["run_dir=/tmp/elsewhere", "run_dir=null"])
def test_an_override_of_the_run_dir_is_refused_naming_the_row(tmp_path, monkeypatch, capsys, where, override):
    """The launcher gives each run OUT/<row>/seed<k> as --run-dir, which would replace it silently."""
    row = {"name": "warm start", "config": DEFAULT, **({"overrides": [override]} if where == "row" else {})}
    grid = yaml.safe_dump({"name": "t", "rows": [{"name": "a", "config": DEFAULT}, row],
                           **({"common_overrides": [override]} if where == "common" else {})})
    assert run_grid(tmp_path, monkeypatch, grid, "--dry-run") == 2
    err = capsys.readouterr().err
    named = "rows[1] ('warm start').overrides" if where == "row" else "common_overrides"
    assert f"{named}: {override!r} sets run_dir, which segadv-experiment sets for each run" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_grid_that_is_not_utf8_names_the_byte(tmp_path, monkeypatch, capsys):
    assert run_grid(tmp_path, monkeypatch, b"name: t\xff\n") == 2
    assert "grid.yaml is not UTF-8 text: byte 7 is 0xff" in capsys.readouterr().err


@pytest.mark.parametrize("seed", ["-1", "2147483648"])
def test_seeds_option_out_of_range_exits_2(tmp_path, monkeypatch, capsys, seed):
    grid = f"name: t\nrows: [{{name: a, config: {DEFAULT}}}]\n"
    assert run_grid(tmp_path, monkeypatch, grid, "--seeds", seed) == 2
    assert f"--seeds: [0]: seed {seed} is out of range: a seed is 0 .. 2**31-1" in capsys.readouterr().err


def test_overrides_of_other_keys_in_the_same_section_are_fine(tmp_path, monkeypatch, capsys):
    grid = (f"name: t\ncommon_overrides: ['train.eval_every=1']\n"
            f"rows: [{{name: a, config: {DEFAULT}, overrides: ['train={{max_steps: 1}}']}}]\n")
    assert run_grid(tmp_path, monkeypatch, grid, "--dry-run") == 0
    assert "a, seed 0: " in capsys.readouterr().out


# ---------------------------------------------------------------- signals reach the trainer

TRAINER = """\
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(signum, frame):
    (out / "trainer.got").write_text(signal.Signals(signum).name)
    time.sleep(1.0)  # saving its checkpoint: the launcher must wait for this
    (out / "trainer.done").write_text("")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
(out / "trainer.pid").write_text(str(os.getpid()))
time.sleep(120)
"""

DRIVER = """\
import sys
from segadv.cli import experiment
from segadv.experiment import launcher
trainer, out, grid = sys.argv[1:]
launcher.RunSpec.command = lambda self: [sys.executable, trainer, out]
sys.exit(experiment.main(["run", grid, "--out", out + "/grid"]))
"""


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)])
def test_a_signal_to_segadv_experiment_reaches_its_trainer_and_is_waited_for(tmp_path, signum, code):
    (tmp_path / "trainer.py").write_text(TRAINER)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"name": "t", "seeds": [0, 1], "rows": [
        {"name": "a", "config": str(ROOT / DEFAULT)}]}))
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "trainer.py"), str(tmp_path), str(grid)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "trainer.pid").exists():
            assert driver.poll() is None, driver.communicate()
            assert time.monotonic() < deadline, "the trainer never started"
            time.sleep(0.1)
        trainer_pid = int((tmp_path / "trainer.pid").read_text())
        driver.send_signal(signum)
        _, err = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == code, err
    assert (tmp_path / "trainer.got").read_text() == signal.Signals(signum).name
    assert (tmp_path / "trainer.done").exists()  # the launcher waited for the trainer to finish saving
    with pytest.raises(ProcessLookupError):  # no orphaned trainer
        os.kill(trainer_pid, 0)
    assert not (tmp_path / "grid" / "a" / "seed1").exists()  # the grid stopped: seed 1 never started
    assert "Traceback" not in err
