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
    assert "c: mIoU >= 0.80 at never" in out
    assert "median 130 s, worst inf s over 3 run(s)" in out


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
