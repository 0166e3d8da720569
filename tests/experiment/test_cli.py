"""segadv-experiment run: a grid of configs x seeds, resumable, its completion read from each run's
status.json, tabulated with statistics against a baseline row."""

import json
import shlex
import signal
from pathlib import Path

import pytest
import yaml

from conftest import TINY_OVERRIDES
from segadv.cli import train as train_cli
from segadv.config import dump_config, load_config
from segadv.cli import experiment
from segadv.experiment import launcher
from segadv.experiment.grid import load_grid
from segadv.experiment.results import diagnostics_table, stat_cell
from segadv.experiment.runs import ValScores, read_train_diagnostics, read_val_metrics
from segadv.experiment.stats import WelchTest
from segadv.methods import method_class
from segadv.monitor.status import RunStatus, Score

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*argv):
    """``segadv-experiment run ...``"""
    return experiment.main(["run", *map(str, argv)])


def write_grid(path, rows, seeds=(0, 1), **extra):
    common = [*TINY_OVERRIDES, "train.max_steps=2", "train.eval_every=1", "log.tensorboard=false",
              "device_map=cpu"]
    path.write_text(yaml.safe_dump({"name": "t", "seeds": list(seeds), "rows": rows,
                                    "common_overrides": common, **extra}))
    return path


def run_grid_text(tmp_path, monkeypatch, grid_text):
    """experiment.main on a grid written from text, from the repository root, where nothing may run."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(launcher, "run_trainer", lambda *a, **k: pytest.fail("nothing may run"))
    path = tmp_path / "grid.yaml"
    path.write_text(grid_text)
    return run_cli(path, "--out", tmp_path / "out")


ROWS = [{"name": "CE only", "config": str(ROOT / "configs" / "default.yaml"), "overrides": ["loss.lambda_adv=0"]},
        {"name": "+ adversarial", "config": str(ROOT / "configs" / "default.yaml")}]


def test_grid_runs_tabulates_and_never_repeats_a_finished_run(tmp_path, monkeypatch):
    grid = write_grid(tmp_path / "grid.yaml", ROWS)
    out = tmp_path / "out"
    assert run_cli(grid, "--out", out) == 0
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
    assert set(ce["diagnostics"]) >= {"loss_seg", "loss_d"} and "| row | loss_seg | loss_d |" in table

    def no_run(*args, **kwargs):
        raise AssertionError("a finished run was started again")

    monkeypatch.setattr(launcher, "run_trainer", no_run)
    assert run_cli(grid, "--out", out) == 0

    # --baseline: every row against another row, in a table of its own; results.md stays.
    before = (out / "results.md").read_text()
    assert run_cli(grid, "--out", out, "--table-only", "--baseline", "+ adversarial") == 0
    versus = json.loads((out / "results_vs_adversarial.json").read_text())
    adv = results["rows"][1]
    assert versus["rows"][0]["baseline"] == "+ adversarial" and "baseline" not in versus["rows"][1]
    assert versus["rows"][0]["diff"] == pytest.approx(ce["final_mean"] - adv["final_mean"])
    assert (out / "results.md").read_text() == before
    assert run_cli(grid, "--out", out, "--table-only", "--baseline", "nope") == 2


def test_a_failed_run_is_named_and_the_others_still_finish(tmp_path, caplog):
    # A failure only the run meets (the config loads and its init file is there, but holds no weights).
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    rows = [{"name": "broken", "config": str(ROOT / "configs" / "default.yaml"),
             "overrides": [f"init.generator.path={tmp_path / 'garbage.pt'}"]}, ROWS[1]]
    grid = write_grid(tmp_path / "grid.yaml", rows, seeds=[0])
    with caplog.at_level("ERROR"):
        assert run_cli(grid, "--out", tmp_path / "out") == 1
    assert "broken (seed 0)" in caplog.text and "garbage.pt is truncated or corrupt" in caplog.text
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["n"] for r in results["rows"]] == [0, 1]


@pytest.mark.parametrize("grid_text, message", [
    ("name: t\nrows: [{name: a, config: configs/default.yaml}]\nrepeats: 3\n",
     "unknown key(s) repeats; keys: baseline, common_overrides, name, rows, seeds"),
    ("name: t\nrows: [{name: a, config: nowhere.yaml}]\n", "config nowhere.yaml does not exist"),
    ("name: t\nrows: [{name: a, config: semii}]\n", "rows[0]: unknown config 'semii': no such file, nor a shipped config of that name; shipped: adaptsegnet"),
    ("name: t\nrows: [{name: a, config: configs/default.yaml}, {name: a, config: configs/default.yaml}]\n",
     "row name 'a' is used twice"),
    ("name: t\nseeds: 3\nrows: [{name: a, config: configs/default.yaml}]\n", "seeds"),
    # the common overrides come last on the command line: a row's own value for the key would never run
    ("name: t\ncommon_overrides: [model.generator.norm=frozen, train.max_steps=3]\n"
     "rows: [{name: a, config: configs/default.yaml, overrides: [train.max_steps=5, model.generator.norm=train]}]\n",
     "rows[0].overrides: model.generator.norm, train.max_steps also in common_overrides, which come after a row's "
     "and would win"),
])
def test_bad_grid_exits_2_naming_the_fault(tmp_path, capsys, monkeypatch, grid_text, message):
    assert run_grid_text(tmp_path, monkeypatch, grid_text) == 2
    assert message in capsys.readouterr().err


def test_metrics_reader_final_best_and_resumed_duplicates(tmp_path):
    lines = [{"step": 1, "train/loss_seg": 1.0}, {"step": 2, "val/mIoU": 0.5},
             {"step": 4, "val/mIoU": 0.7}, {"step": 4, "val/mIoU": 0.6},  # resumed: the last record wins
             {"step": 6, "val/mIoU": 0.65, "val/pixel_acc": 0.9}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 7, "val/mIo')  # cut short
    assert read_val_metrics(path) == ValScores(final=Score(step=6, mIoU=0.65, pixel_acc=0.9),
                                               best=Score(step=6, mIoU=0.65, pixel_acc=0.9))
    assert read_val_metrics(tmp_path / "none.jsonl") == ValScores(None, None)


def test_diagnostics_are_the_last_quarters_means_and_reach_the_table(tmp_path):
    """``read_train_diagnostics`` averages each logged train/ diagnostic over the steps past 3/4 of
    the run (non-finite values and val records skipped); the table shows the keys any row logged."""
    path = tmp_path / "metrics.jsonl"
    records = [{"step": s, "train/loss_d": s / 100, "train/d_acc_real": 0.5} for s in (100, 200, 300, 350, 400)]
    records[3]["train/loss_d"] = float("nan")
    records.append({"step": 400, "val/mIoU": 0.5})
    path.write_text("\n".join(json.dumps(r) for r in records) + "\nnot json\n")
    assert read_train_diagnostics(path) == {"loss_d": 4.0, "d_acc_real": 0.5}
    assert read_train_diagnostics(tmp_path / "none.jsonl") == {}
    lines = diagnostics_table({"a": {"loss_d": 4.0, "d_acc_real": 0.5}, "b": {}})
    assert "| row | loss_d | d_acc_real |" in lines and "| a | 4.000 | 0.500 |" in lines and "| b | - | - |" in lines
    assert diagnostics_table({"b": {}}) == []


def test_a_p_value_below_a_thousandth_is_shown_as_such():
    assert stat_cell(WelchTest(diff=0.05, t=12.0, df=None, p=1e-5)) == "+5.0 (t 12.00, p < 0.001)"
    assert stat_cell(WelchTest(diff=0.05, t=2.0, df=None, p=0.0006)) == "+5.0 (t 2.00, p 0.001)"


def test_the_shipped_grid_is_valid(monkeypatch):
    monkeypatch.chdir(ROOT)
    grid = load_grid(ROOT / "configs" / "experiments" / "semi.yaml")
    assert [r.name for r in grid.rows] == [
        "CE only, warm", "AdvSemiSeg (adversarial + semi), warm", "s4GAN, warm", "s4GAN, threshold 0.5, warm",
        "pseudo-labels only (no D), warm", "CE only, all labeled, warm (reference)", "CE only, scratch",
        "AdvSemiSeg (adversarial + semi), scratch"]
    assert grid.seeds == [0, 1, 2] and [len(grid.seeds_of(r)) for r in grid.rows] == [5, 3, 5, 5, 3, 2, 3, 3]
    assert [grid.baseline_of(r) for r in grid.rows] == [None, *["CE only, warm"] * 6, "CE only, scratch"]
    rules = load_grid(ROOT / "configs" / "experiments" / "semi-rules.yaml")  # issue 31's re-run
    assert [len(rules.seeds_of(r)) for r in rules.rows] == [5, 5, 5, 5]
    assert [rules.baseline_of(r) for r in rules.rows] == ["pseudo-labels only (no D), warm", None,
                                                          *["pseudo-labels only (no D), warm"] * 2]
    uda = load_grid(ROOT / "configs" / "experiments" / "uda.yaml")
    assert all(len(uda.seeds_of(r)) >= 3 for r in uda.rows if "oracle" not in r.name)
    assert all(uda.baseline_of(r) == "source only, warm" for r in uda.rows[1:])
    for name in ("uda-frozen-bn", "semi-frozen-bn"):  # issue 42's grids: BatchNorm frozen, 5 seeds a row
        frozen = load_grid(ROOT / "configs" / "experiments" / f"{name}.yaml")
        assert all(len(frozen.seeds_of(r)) == 5 for r in frozen.rows)
        assert "model.generator.norm=frozen" in frozen.common_overrides
    bn = load_grid(ROOT / "configs" / "experiments" / "uda-bn.yaml")  # the other two BatchNorm settings, by row
    assert [o for r in bn.rows for o in r.overrides if o.startswith("model.generator.norm=")] == [
        *["model.generator.norm=frozen_affine"] * 3, *["model.generator.norm=train"] * 3]
    assert all(len(bn.seeds_of(r)) == 5 for r in bn.rows)
    for name in ("semi-mean-teacher", "uda-mean-teacher"):  # 5 seeds a row, D on top of the teacher
        grid = load_grid(ROOT / "configs" / "experiments" / f"{name}.yaml")
        assert all(len(grid.seeds_of(r)) == 5 for r in grid.rows)
        assert "checkpoint.every=250" in grid.common_overrides  # the label-free scores read every evaluation's
        with_d = [i for i, r in enumerate(grid.rows) if "+ D" in r.name]
        assert len(with_d) == 2  # one per teacher setting
        for index in with_d:  # D on top: G's adversarial weight (loss.lambda_adv) above 0, the teacher's
            row, alone = grid.rows[index], grid.rows[index - 1]  # settings those of the row before it
            cfg, cfg_alone = load_config(row.config, row.overrides), load_config(alone.config, alone.overrides)
            assert cfg.method.name == "mean_teacher" and method_class("mean_teacher").adversarial_weight(cfg) > 0
            assert cfg.method.mean_teacher == cfg_alone.method.mean_teacher
            assert grid.baseline_of(row) == alone.name  # compared with the teacher alone


def test_a_shipped_grid_by_name_from_any_directory(tmp_path, monkeypatch, capsys):
    """``semi`` is configs/experiments/semi.yaml, whose rows name the shipped config ``semi``: a
    dry run from a directory without configs/ lists the commands once the pretext checkpoint its
    warm rows start from is there (before, it names it); --list-grids names the grids."""
    monkeypatch.chdir(tmp_path)
    assert run_cli("semi", "--dry-run", "--out", tmp_path / "out") == 2
    assert "init.generator.path: checkpoint not found: runs/pretext/checkpoints/last.pt" in capsys.readouterr().err
    checkpoint = tmp_path / "runs" / "pretext" / "checkpoints" / "last.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")
    assert run_cli("semi", "--dry-run", "--out", tmp_path / "out") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 29 and all(" -m segadv.cli.train --config semi --run-dir " in line for line in lines)
    assert run_cli("semii") == 2
    assert "unknown grid 'semii'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        experiment.main(["--list-grids"])
    assert info.value.code == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [
        "semi", "semi-frozen-bn", "semi-mean-teacher", "semi-rules", "semi-unimatch", "semi-unimatch-dinov2", "uda",
        "uda-bn", "uda-frozen-bn", "uda-mean-teacher"]


# ---------------------------------------------------------------- no training: a fake trainer


def write_status(run_dir, outcome, step, max_steps, final=None, best=None, wall_s=10.0, total_wall_s=None,
                 stopped_by=None):
    status = RunStatus(outcome=outcome, step=step, max_steps=max_steps, start_step=0, final=final, best=best,
                       stopped_by=stopped_by, exit_code=0, wall_s=wall_s, total_wall_s=total_wall_s or wall_s,
                       started_at="2026-11-25T00:00:00+00:00", segadv_version="test")
    (run_dir / "status.json").write_text(status.model_dump_json())


def fake_trainer(val_steps, max_steps=4, code=0, during=None):
    """A stand-in for launcher.run_trainer: parses the command as segadv-train does, writes the run dir's
    config.yaml, val records at ``val_steps`` (appended, as a resumed run would) and a status.json
    (finished at ``max_steps``, else stopped by SIGTERM; its wall time added to the earlier
    attempt's), records the command, exits ``code``."""
    calls = []

    def run(command, stdout=None, stderr=None):
        calls.append(command)
        args = train_cli.build_parser().parse_intermixed_args(command[3:])
        run_dir = Path(args.run_dir)
        cfg = load_config(args.config, args.overrides)
        cfg.run_dir = args.run_dir
        dump_config(cfg, run_dir / "config.yaml")
        with open(run_dir / "metrics.jsonl", "a") as fh:
            for step in val_steps:
                fh.write(json.dumps({"step": step, "val/mIoU": step / 10, "val/pixel_acc": 0.9}) + "\n")
        final = Score(step=val_steps[-1], mIoU=val_steps[-1] / 10, pixel_acc=0.9)
        earlier = json.loads((run_dir / "status.json").read_text())["total_wall_s"] if args.resume else 0.0
        write_status(run_dir, "finished" if final.step == max_steps else "stopped", final.step, max_steps, final,
                     final, 10.0, earlier + 10.0, None if final.step == max_steps else "SIGTERM")
        stdout.write("fake trainer\n")
        if during is not None:
            during()
        return launcher.subprocess.CompletedProcess(command, code)

    run.calls = calls
    return run


def one_row_grid(tmp_path, overrides=(), seeds=(0,)):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "seeds": list(seeds), "rows": [
        {"name": "a", "config": str(ROOT / "configs" / "default.yaml"), "overrides": list(overrides)}]}))
    return path


def test_a_run_stopped_early_with_exit_0_is_not_done_and_resumes(tmp_path, monkeypatch, caplog):
    """The trainer exits 0 when a SIGTERM stops it at a checkpoint: that run is not finished."""
    grid, out = one_row_grid(tmp_path), tmp_path / "out"
    run_dir = out / "a" / "seed0"
    monkeypatch.setattr(launcher, "run_trainer", fake_trainer([2]))
    with caplog.at_level("ERROR"):
        assert run_cli(grid, "--out", out) == 1
    assert "stopped (SIGTERM) at step 2/4: a, seed 0; run again to continue it" in caplog.text
    assert json.loads((out / "results.json").read_text())["rows"][0]["n"] == 0  # not counted as done

    second = fake_trainer([4])
    monkeypatch.setattr(launcher, "run_trainer", second)
    assert run_cli(grid, "--out", out) == 0
    assert second.calls[0][-2:] == ["--resume", "auto"]
    (done,) = json.loads((out / "results.json").read_text())["rows"][0]["runs"]
    assert done["run_dir"] == str(run_dir)
    assert (done["final_step"], done["final_mIoU"], done["best_step"]) == (4, 0.4, 4)
    assert done["wall_s"] == pytest.approx(20.0)  # both attempts' (status.json's total_wall_s)
    assert "| a | 1/1 | 40.0 ± - | 40.0 ± - | 40.0 |" in (out / "results.md").read_text()


def test_ctrl_c_lets_the_run_save_a_checkpoint_then_exits_130(tmp_path, monkeypatch, capsys):
    grid, out = one_row_grid(tmp_path, seeds=[0, 1]), tmp_path / "out"
    before = signal.getsignal(signal.SIGINT)
    fake = fake_trainer([2], during=lambda: signal.raise_signal(signal.SIGINT))
    monkeypatch.setattr(launcher, "run_trainer", fake)
    assert run_cli(grid, "--out", out) == 130  # the fake "trainer" stopped at step 2
    assert len(fake.calls) == 1  # seed 1 never started
    assert "interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before
    monkeypatch.setattr(launcher, "run_trainer", lambda *a, **k: pytest.fail("nothing may run"))
    capsys.readouterr()
    assert run_cli(grid, "--out", out, "--dry-run") == 0  # not done: the next run resumes it
    assert "a, seed 0: " + shlex.join(launcher.RunSpec.of(load_grid(grid), load_grid(grid).rows[0], 0, out).command()) \
        in capsys.readouterr().out


def test_a_done_run_whose_row_changed_is_kept_with_a_warning(tmp_path, monkeypatch, caplog, capsys):
    grid, out = one_row_grid(tmp_path, ["loss.lambda_adv=0"]), tmp_path / "out"
    monkeypatch.setattr(launcher, "run_trainer", fake_trainer([2, 4]))
    assert run_cli(grid, "--out", out) == 0
    monkeypatch.setattr(launcher, "run_trainer", lambda *a, **k: pytest.fail("a finished run was started again"))
    with caplog.at_level("INFO"):  # the same row: a plain skip, also from another --out spelling
        assert run_cli(grid, "--out", out / ".." / "out") == 0
    assert "skip (done): a, seed 0" in caplog.text and "skip (done, but" not in caplog.text
    caplog.clear()
    grid = one_row_grid(tmp_path, ["loss.lambda_adv=0.5"])
    with caplog.at_level("WARNING"):
        assert run_cli(grid, "--out", out) == 0
    assert "skip (done, but its row's config differs: loss.lambda_adv 0.0 -> 0.5; delete" in caplog.text
    capsys.readouterr()
    assert run_cli(grid, "--out", out, "--dry-run") == 0
    assert "a, seed 0: done (but its row's config differs: loss.lambda_adv 0.0 -> 0.5)" in capsys.readouterr().out


@pytest.mark.parametrize("grid_text, message", [
    ("name: t\nseeds: [0, 0]\nrows: [{name: a, config: configs/default.yaml}]\n", "seed(s) 0 listed twice"),
    ("name: t\nseeds: [true]\nrows: [{name: a, config: configs/default.yaml}]\n", "seeds"),
    ("name: t\nrows: [{name: a, config: configs/default.yaml, overrides: [lambda_adv]}]\n",
     "rows[0].overrides[0]: 'lambda_adv' is not a dotted key=value override"),
    ("name: t\nrows: [{name: a, config: configs/default.yaml}]\ncommon_overrides: [--resume]\n",
     "common_overrides[0]: '--resume' is not"),
    ("name: t\nrows: [{name: CE only, config: configs/default.yaml}, {name: ce-only, config: configs/default.yaml}]\n",
     "share the run directory ce-only"),
    ("name: t\nrows: [{config: configs/default.yaml}]\n", "rows[0].name: missing required key"),
    ("name: t\nrows: [{name: a, config: configs/default.yaml, seeds: [1, 1]}]\n", "rows[0].seeds: seed(s) 1 listed twice"),
])
def test_more_bad_grids_exit_2(tmp_path, capsys, monkeypatch, grid_text, message):
    assert run_grid_text(tmp_path, monkeypatch, grid_text) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_seeds_option_replaces_the_grids_seeds(tmp_path, monkeypatch, capsys):
    grid, out = one_row_grid(tmp_path, seeds=[0, 1, 2]), tmp_path / "out"
    monkeypatch.setattr(launcher, "run_trainer", lambda *a, **k: pytest.fail("nothing may run"))
    assert run_cli(grid, "--out", out, "--seeds", "5", "--dry-run") == 0
    printed = capsys.readouterr().out
    assert "a, seed 5:" in printed and "train.seed=5" in printed and "seed 0" not in printed
    assert run_cli(grid, "--out", out, "--seeds", "1", "1") == 2
    assert "--seeds: seed(s) 1 listed twice" in capsys.readouterr().err


def test_metrics_reader_ignores_non_numeric_and_nan_for_best(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "val/mIoU": 0.3}\n[1, 2]\n{"step": 2, "val/mIoU": null}\n'
                    '{"step": 3, "val/mIoU": 0.2}\n{"step": 4, "val/mIoU": NaN}\n')
    got = read_val_metrics(path)
    assert (got.best.step, got.best.mIoU, got.final.step) == (1, 0.3, 4)


def test_a_row_may_run_its_own_seeds(tmp_path, monkeypatch, capsys):
    path = tmp_path / "grid.yaml"
    default = str(ROOT / "configs" / "default.yaml")
    path.write_text(yaml.safe_dump({"name": "t", "seeds": [0, 1], "rows": [
        {"name": "a", "config": default}, {"name": "ref", "config": default, "seeds": [0]}]}))
    trainer = fake_trainer([2, 4])
    monkeypatch.setattr(launcher, "run_trainer", trainer)
    out = tmp_path / "out"
    assert run_cli(path, "--out", out) == 0
    seeds_run = [(c[c.index("--run-dir") + 1].split("/")[-2], c[-1]) for c in trainer.calls]
    assert seeds_run == [("a", "train.seed=0"), ("a", "train.seed=1"), ("ref", "train.seed=0")]
    table = (out / "results.md").read_text()
    assert "| a | 2/2 |" in table and "| ref | 1/1 |" in table and "(seed 0)" in table


# ---------------------------------------------------------------- statistics against a baseline row


def write_done(out, row_slug, seed, final, best):
    run_dir = out / row_slug / f"seed{seed}"
    run_dir.mkdir(parents=True)
    write_status(run_dir, "finished", 4, 4, Score(step=4, mIoU=final), Score(step=4, mIoU=best))


def test_rows_are_compared_with_their_baseline(tmp_path, monkeypatch, caplog):
    """Hand-made finished runs; reference numbers from scipy.stats.ttest_ind(equal_var=False) and ttest_rel."""
    default = str(ROOT / "configs" / "default.yaml")
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "seeds": [0, 1, 2, 3], "baseline": "base", "rows": [
        {"name": "base", "config": default}, {"name": "a", "config": default},
        {"name": "c", "config": default, "seeds": [0], "baseline": "a"}]}))
    out = tmp_path / "out"
    for seed, (final, best) in enumerate([(0.58, 0.60), (0.59, 0.61), (0.60, 0.60), (0.57, 0.59)]):
        write_done(out, "base", seed, final, best)
    for seed, (final, best) in enumerate([(0.61, 0.65), (0.64, 0.66), (0.60, 0.62)]):  # seed 3 unfinished
        write_done(out, "a", seed, final, best)
    write_done(out, "c", 0, 0.70, 0.70)
    monkeypatch.setattr(launcher, "run_trainer", lambda *a, **k: pytest.fail("nothing may run"))
    with caplog.at_level("WARNING"):
        assert run_cli(path, "--out", out, "--table-only") == 0
    assert "row 'c' runs 1 seed(s); a comparison wants at least 3" in caplog.text
    results = json.loads((out / "results.json").read_text())
    base, a, c = results["rows"]
    assert results["baseline"] == "base" and "diff" not in base
    assert a["baseline"] == "base"
    assert a["diff"] == pytest.approx(0.0316666666666667, abs=1e-12)
    assert (a["t"], a["df"], a["p"]) == pytest.approx((2.321219442769802, 3.1457603363700075, 0.09890655608471415))
    assert a["paired"]["seeds"] == [0, 1, 2]
    assert (a["paired"]["diff"], a["paired"]["t"], a["paired"]["df"], a["paired"]["p"]) == pytest.approx(
        (0.0266666666666667, 1.8353258709644942, 2, 0.20788196561866057))
    assert (a["best_diff"], a["best_t"], a["best_df"], a["best_p"]) == pytest.approx(
        (0.0433333333333333, 3.4139672543527926, 2.466275659824047, 0.056350658843505166))
    assert (a["best_paired"]["t"], a["best_paired"]["p"]) == pytest.approx((4.0, 0.05719095841793663))
    # |diff| 3.2 points is within two stds (2 x 2.1): 5 seeds wanted, and neither row has them.
    assert a["seeds_wanted"] == 5 and a["seeds_note"] == "'a' vs 'base': 3 and 4 finished seeds, 5 wanted (Δ final within two standard deviations)"
    # One seed against three: a difference, no test.
    assert c["baseline"] == "a" and c["diff"] == pytest.approx(0.7 - 0.6166666666666667)
    assert (c["t"], c["p"], c["paired"], c["seeds_wanted"]) == (None, None, None, 3)
    assert "more seeds wanted: 'a' vs 'base'" in caplog.text and "more seeds wanted: 'c' vs 'a'" in caplog.text
    table = (out / "results.md").read_text()
    assert "| a | 3/4 | 61.7 ± 2.1 | 64.3 ± 2.1 | 61.0 / 64.0 / 60.0 / missing | 10 | base | +3.2 (t 2.32, p 0.099) | " \
           "+2.7 (3 seeds, t 1.84, p 0.208) | +4.3 (t 3.41, p 0.056) |" in table
    assert "| base | 4/4 |" in table and table.split("| base | 4/4 |")[1].split("\n")[0].endswith("| - | - | - | - |")
    assert "| c | 1/1 |" in table and "| a | +8.3 (t -) | - | +5.7 (t -) |" in table
    assert "- More seeds wanted: 'a' vs 'base': 3 and 4 finished seeds, 5 wanted" in table


@pytest.mark.parametrize("grid_text, message", [
    ("name: t\nbaseline: b\nrows: [{name: a, config: configs/default.yaml}]\n", "baseline: no row is named 'b'; rows: 'a'"),
    ("name: t\nrows: [{name: a, config: configs/default.yaml, baseline: z}]\n", "rows[0].baseline: no row is named 'z'"),
    ("name: t\nrows: [{name: a, config: configs/default.yaml, baseline: a}]\n", "row 'a' names itself as its baseline"),
    ("name: t\nbaseline: [a]\nrows: [{name: a, config: configs/default.yaml}]\n", "baseline: Input should be a valid string"),
])
def test_bad_baselines_exit_2(tmp_path, capsys, monkeypatch, grid_text, message):
    monkeypatch.chdir(ROOT)
    path = tmp_path / "grid.yaml"
    path.write_text(grid_text)
    assert run_cli(path, "--out", tmp_path / "out") == 2
    assert message in capsys.readouterr().err
