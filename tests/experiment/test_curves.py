"""segadv-curves: accuracy against training time from metrics.jsonl."""

import builtins
import json
from pathlib import Path

from segadv.cli import curves


def write_run(run_dir: Path, points) -> Path:
    run_dir.mkdir(parents=True)
    lines = [json.dumps({"step": 1, "train/loss_seg": 1.0})]  # not an evaluation
    lines += [json.dumps({"step": step, "val/mIoU": miou, "perf/train_seconds": t}) for t, step, miou in points]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_time_to_threshold_is_the_first_evaluation_at_or_above_it(tmp_path, capsys):
    a = write_run(tmp_path / "a", [(50.0, 100, 0.6), (100.0, 200, 0.80), (150.0, 300, 0.79), (200.0, 400, 0.86)])
    b = write_run(tmp_path / "b", [(60.0, 100, 0.5), (130.0, 200, 0.81), (210.0, 300, 0.85)])
    c = write_run(tmp_path / "c", [(70.0, 100, 0.5), (140.0, 200, 0.7)])
    assert curves.main([str(a), str(b), str(c), "--threshold", "0.8"]) == 0
    out = capsys.readouterr().out
    assert "a: mIoU >= 0.80 at 100 s (step 200, mIoU 0.800); final 0.860 at 200 s (step 400)" in out
    assert "c: did not reach 0.80 (best mIoU 0.700 at step 200); final 0.700 at 140 s (step 200)" in out
    assert ("time to mIoU >= 0.80: median 130 s, worst: not reached (1 of 3 runs did not reach 0.80) over 3 run(s)"
            in out)
    assert "never" not in out and "inf" not in out


def test_a_dir_without_metrics_exits_2(tmp_path, capsys):
    assert curves.main([str(tmp_path / "nothing")]) == 2
    assert "metrics.jsonl: no such file" in capsys.readouterr().err


def test_png_without_matplotlib_exits_2_naming_the_extra(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "a", [(50.0, 100, 0.6)])
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.partition(".")[0] == "matplotlib":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert curves.main([str(run), "--png", str(tmp_path / "c.png")]) == 2
    captured = capsys.readouterr()
    assert 'pip install "segadv[plot]"' in captured.err and captured.out == ""  # said before reading any run
    assert not (tmp_path / "c.png").exists()


def test_a_metrics_file_that_cannot_be_read_is_set_aside(tmp_path, capsys, caplog):
    good, bad = tmp_path / "good", tmp_path / "bad"
    for run in (good, bad):
        run.mkdir()
    (good / "metrics.jsonl").write_text(
        '{"step": 1e400, "val/mIoU": 0.9, "perf/train_seconds": 1}\n'
        '{"step": 2, "val/mIoU": 0.9, "perf/train_seconds": "soon"}\n'
        '{"step": 4, "val/mIoU": 0.85, "perf/train_seconds": 12.0}\n')
    (bad / "metrics.jsonl").write_bytes(b'{"step": 2, "val/mIoU": 0.9, "perf/train_seconds": 1}\n\xff\n')
    with caplog.at_level("WARNING"):
        assert curves.main([str(good), str(bad)]) == 0
    out = capsys.readouterr().out
    assert f"{good}: mIoU >= 0.80 at 12 s (step 4" in out and str(bad) not in out
    assert f"{bad / 'metrics.jsonl'} is not UTF-8 text: byte 54 is 0xff: set aside" in caplog.text
    assert curves.main([str(bad)]) == 2
    assert "no run left to report" in capsys.readouterr().err


def test_all_runs_reaching_it_give_the_worst_time_and_most_missing_give_no_median(tmp_path, capsys):
    a = write_run(tmp_path / "a", [(50.0, 100, 0.85)])
    b = write_run(tmp_path / "b", [(70.0, 100, 0.9)])
    assert curves.main([str(a), str(b)]) == 0
    assert "median 60 s, worst 70 s over 2 run(s)" in capsys.readouterr().out
    c = write_run(tmp_path / "c", [(70.0, 100, 0.5)])
    d = write_run(tmp_path / "d", [(70.0, 100, 0.5)])
    assert curves.main([str(a), str(c), str(d)]) == 0
    assert ("median: not reached (by half the runs or more), worst: not reached (2 of 3 runs did not reach 0.80)"
            in capsys.readouterr().out)


def test_records_are_taken_by_step_the_last_record_of_a_step_winning(tmp_path, capsys):
    """A resumed run's metrics.jsonl after a rewind: steps 200-300 logged again, out of file order;
    the final evaluation is the last step's, not the last line's."""
    run = write_run(tmp_path / "a", [(100.0, 200, 0.5), (150.0, 300, 0.6), (160.0, 325, 0.7),
                                     (150.0, 300, 0.82), (100.0, 200, 0.55)])
    with (run / "metrics.jsonl").open("a") as out:
        out.write(json.dumps({"step": 250, "train/loss_seg": 0.4, "train/loss_d": 1.2, "train/lr_g": 0.1}) + "\n")
        out.write(json.dumps({"step": 250, "train/loss_seg": 0.3}) + "\n")
    curve = curves.read_curve(run)
    assert curve.points == [(100.0, 200, 0.55), (150.0, 300, 0.82), (160.0, 325, 0.7)]
    assert curve.losses == {"loss_d": [(250, 1.2)], "loss_seg": [(1, 1.0), (250, 0.3)]}
    assert curves.main([str(run)]) == 0
    assert f"{run}: mIoU >= 0.80 at 150 s (step 300, mIoU 0.820); final 0.700 at 160 s (step 325)" in \
        capsys.readouterr().out


def test_a_time_that_goes_back_is_said(tmp_path, caplog):
    """A run resumed by a segadv that restarted perf/train_seconds at 0 draws a V: said, not hidden."""
    run = write_run(tmp_path / "a", [(100.0, 200, 0.5), (300.0, 300, 0.6), (20.0, 325, 0.7)])
    with caplog.at_level("WARNING"):
        curves.read_curve(run)
    assert "perf/train_seconds goes back at step 325" in caplog.text


class FakeAxes:
    def __init__(self):
        self.lines = []

    def plot(self, x, y, **kwargs):
        self.lines.append((list(x), list(y), kwargs.get("label")))

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class FakePyplot:
    def __init__(self):
        self.axes = (FakeAxes(), FakeAxes())

    def subplots(self, *args, **kwargs):
        fig = type("Fig", (), {"tight_layout": lambda self: None,
                               "savefig": lambda self, out, format: out.write(b"\x89PNG")})()
        return fig, self.axes

    def close(self, fig):
        pass


def test_the_png_draws_the_losses_beside_the_miou(tmp_path):
    run = write_run(tmp_path / "a", [(50.0, 100, 0.6), (100.0, 200, 0.8)])
    plt = FakePyplot()
    curves.plot(plt, [curves.read_curve(run)], 0.8, tmp_path / "out" / "c.png", "title")
    miou_ax, loss_ax = plt.axes
    assert miou_ax.lines == [([50.0, 100.0], [0.6, 0.8], "a")]
    assert loss_ax.lines == [([1], [1.0], "a loss_seg")]
    assert (tmp_path / "out" / "c.png").read_bytes() == b"\x89PNG"


def test_the_threshold_is_a_finite_score_within_0_and_1(tmp_path, capsys):
    import pytest

    run = write_run(tmp_path / "a", [(50.0, 100, 0.6)])
    for bad in ("2", "-1", "nan", "inf"):
        with pytest.raises(SystemExit) as stop:
            curves.main([str(run), "--threshold", bad])
        assert stop.value.code == 2
        assert f"argument --threshold: expected a number within 0..1, got '{bad}'" in capsys.readouterr().err
    assert curves.main([str(run), "--threshold", "1"]) == 0
