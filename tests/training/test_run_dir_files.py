"""A run dir's files, the log and the lock included, follow segadv/fsutil.py's rule: a link there
is replaced by a regular file and never written through; a device, FIFO or socket there is exit 2
naming it, refused before anything is written; a full disk at the start names the file and leaves
no lock behind."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from conftest import TINY_OVERRIDES
from segadv import fsutil
from segadv.cli import train as train_cli
from segadv.training.lock import LOCK_FILE, RunDirLock
from segadv.training.process import LOG_FILE, run_log
from test_fsutil import char_device, snapshot


def test_a_train_log_linked_to_a_user_file_never_receives_the_run_s_log(tmp_path, caplog):
    run_dir, user = tmp_path / "run", tmp_path / "notes.txt"
    run_dir.mkdir()
    user.write_text("my notes\n")
    (run_dir / LOG_FILE).symlink_to(user)
    with caplog.at_level(logging.INFO), run_log(run_dir) as path:
        logging.getLogger("segadv.test").info("a line of the run")
    assert user.read_text() == "my notes\n"  # unchanged
    assert not path.is_symlink() and "a line of the run" in path.read_text()
    assert f"{run_dir / LOG_FILE} was a symbolic link to {user}: replaced by a regular file" in caplog.text


def test_a_lock_file_linked_to_a_user_file_is_replaced_not_written_through(tmp_path):
    run_dir, user = tmp_path / "run", tmp_path / "data.txt"
    run_dir.mkdir()
    user.write_text("keep")
    (run_dir / LOCK_FILE).symlink_to(user)
    with RunDirLock(run_dir):
        assert "pid" in (run_dir / LOCK_FILE).read_text()
    assert user.read_text() == "keep" and not (run_dir / LOCK_FILE).is_symlink()


def test_a_log_that_cannot_be_written_is_one_warning_naming_it_not_a_traceback_per_line(tmp_path, monkeypatch,
                                                                                       caplog, capsys):
    def full(fh, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    (tmp_path / "run").mkdir()
    with caplog.at_level(logging.INFO), run_log(tmp_path / "run"):
        monkeypatch.setattr(fsutil, "write_all", full)
        for n in range(5):
            logging.getLogger("segadv.test").info("line %d", n)
    warnings = [r.getMessage() for r in caplog.records if "cannot write the run's log" in r.getMessage()]
    assert warnings == [f"cannot write the run's log {tmp_path / 'run' / LOG_FILE}: No space left on device "
                        "(ENOSPC); the run goes on without it"]
    assert "Logging error" not in capsys.readouterr().err


@pytest.mark.parametrize("name", [LOG_FILE, LOCK_FILE, "metrics.jsonl", "status.json", "checkpoints/last.pt"])
@pytest.mark.parametrize("kind", ["fifo", "link to a device"])
def test_a_device_or_fifo_in_a_run_dir_is_exit_2_naming_it_before_anything_is_written(tmp_path, capsys, name, kind):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    path = run_dir / name
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(char_device(tmp_path))
    before, listing = snapshot(path), sorted(p.name for p in run_dir.iterdir())
    assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto", "--device-map", "cpu", *TINY_OVERRIDES]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert str(path) in line and ("FIFO" in line or "character device" in line), line
    assert snapshot(path) == before and sorted(p.name for p in run_dir.iterdir()) == listing


def test_a_full_disk_at_the_start_names_the_file_and_leaves_no_lock(tmp_path, monkeypatch, capsys):
    def full(fh, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fsutil, "write_all", full)
    run_dir = tmp_path / "run"
    code = train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES, "train.max_steps=2"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "Traceback" not in err and "Logging error" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: cannot write {run_dir / LOCK_FILE}: No space left on device (ENOSPC)"), line
    assert not (run_dir / LOCK_FILE).exists() and not run_dir.exists()  # the start left nothing behind
