"""A disk that fills in the middle of a run, at each kind of write (docs/failures.md, "Write failures"):
exit 4, one ``error:`` line naming the file and where the run can go on from (or that nothing was
saved), status.json recording ``failed`` with the exit code, no temp file left, and the run resumes
once there is room again."""

from __future__ import annotations

import builtins
import errno
import json
import logging
import os
import re
from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES
from segadv import fsutil
from segadv.cli import train as train_cli
from segadv.errors import WriteFailed
from segadv.monitor import writer
from segadv.monitor.status import rewrite_in_place

NO_SPACE = "No space left on device (ENOSPC)"


def no_space(path: object = None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([str(path)] if path is not None else []))


class FullDisk:
    """A disk that fills at the ``at``-th write of one kind (``metrics``: a metrics.jsonl record,
    ``tensorboard``: an event record from TensorBoard's thread, ``checkpoint``: a checkpoint's temp
    file, ``status``: status.json's temp file). From then on every write that needs room fails with
    ENOSPC, as on a real full disk: a new file's bytes (an atomic write's temp file), an append;
    writing over a file's existing bytes (status.json's last resort) still succeeds. ``only``: the
    writes of that kind alone fail (a file system of its own), so that its own path is what ends
    the run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kind: str, at: int, only: bool = False) -> None:
        self.kind, self.at, self.full, self.only, self.counts = kind, at, False, only, {}
        disk = self

        def counted(kind: str) -> None:
            disk.counts[kind] = disk.counts.get(kind, 0) + 1
            if kind == disk.kind and disk.counts[kind] == disk.at:
                disk.full = True

        class Appends:  # an open file whose writes need new room
            def __init__(self, fh, kind):
                self.fh, self.kind = fh, kind

            def write(self, data):
                counted(self.kind)
                if disk.fails(self.kind):
                    raise no_space()
                return self.fh.write(data)

            def __getattr__(self, name):
                return getattr(self.fh, name)

        def fsutil_open(file, mode="r", *args, **kwargs):
            name = Path(file).name
            if name == "metrics.jsonl" and "a" in mode:  # the run dir's appends open through fsutil too
                return Appends(builtins.open(file, mode, *args, **kwargs), "metrics")
            if "w" in mode or "a" in mode:
                kind = "checkpoint" if ".pt.tmp-" in name else "status" if name.startswith(".status.json.tmp-") \
                    else "other"
                counted(kind)
                if disk.fails(kind):
                    raise no_space(file)
            return builtins.open(file, mode, *args, **kwargs)

        real_init = writer.GuardedRecords.__init__

        def guarded_init(guard, records):
            real_init(guard, Appends(records, "tensorboard"))

        self.fails = lambda kind: self.full and (kind == self.kind or not self.only)
        monkeypatch.setattr(fsutil, "open", fsutil_open, raising=False)
        monkeypatch.setattr(writer.GuardedRecords, "__init__", guarded_init)


ARGS = ["--device-map", "cpu", *TINY_OVERRIDES, "train.max_steps=4", "train.log_every=1", "train.eval_every=2",
        "checkpoint.every=2"]


def temp_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*tmp-*"))


# The writes of ARGS's run, in order: metrics records at steps 1 and 2 and the evaluation's; best.pt,
# best.json and status.json ("running", with the scores) at step 2's evaluation; then last.pt and
# step_2.pt; the record of step 3; the same at step 4. TensorBoard's records go on between them.
@pytest.mark.parametrize("kind, at, file, saved", [
    ("metrics", 5, "metrics.jsonl", 2),  # the record of step 3, after step 2's checkpoints
    ("tensorboard", 1, "tensorboard", "any"),  # alone: raised at a later TensorBoard call, or as the files
    # close after the loop (its thread decides when)
    ("checkpoint", 1, "best.pt", None),  # best.pt at step 2, the first checkpoint: nothing saved
    ("checkpoint", 3, "step_2.pt", 2),  # step_2.pt, after best.pt and last.pt of step 2
    ("status", 2, "status.json", 2),  # "running" rewritten at step 2's evaluation, after its best.pt
    # alone, after step 4's checkpoints (this run writes 83 TensorBoard records by then, 105 in all, the
    # train/empty/* shares among them): raised as the files flush or close
    ("tensorboard", 95, "tensorboard", 4),
])
def test_a_disk_that_fills_mid_run_is_exit_4_recorded_in_status_json(tmp_path, monkeypatch, capsys, caplog, kind, at,
                                                                     file, saved):
    caplog.set_level(logging.INFO)
    run_dir = tmp_path / "run"
    disk = FullDisk(monkeypatch, kind, at, only=kind == "tensorboard")
    code = train_cli.main(["--run-dir", str(run_dir), *ARGS, f"log.tensorboard={kind == 'tensorboard'}"])
    err = capsys.readouterr().err
    assert disk.full, disk.counts  # the disk did fill where meant
    assert code == 4, err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: cannot write {run_dir}"), line
    assert f"{file}" in line.split(":")[1] and NO_SPACE in line, line
    if saved is None:
        assert line.endswith("; no checkpoint was written before it"), line
    elif saved == "any":
        assert re.search(r"; (no checkpoint was written before it|the last complete checkpoint is \S+ \(step \d+; "
                         r"resume: [^)]+\))$", line), line
    else:
        assert re.search(rf"; the last complete checkpoint is \S+ \(step {saved}; resume: [^)]+\)$", line), line
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["outcome"], status["exit_code"]) == ("failed", 4), status
    assert status["error"] == line.removeprefix("error: ")
    assert temp_files(run_dir) == []

    monkeypatch.undo()  # room again
    assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto", *ARGS, "log.tensorboard=false"]) == 0
    status = json.loads((run_dir / "status.json").read_text())
    if saved == 4:  # every step was saved: the resume finds the run finished and trains nothing
        assert "is finished: step 4 of train.max_steps=4" in caplog.text
        assert (status["outcome"], status["step"]) == ("failed", 4)  # this attempt's record stands
    else:
        assert (status["outcome"], status["step"]) == ("finished", 4)


def test_the_outcome_written_in_place_fits_the_file_and_reads_back(tmp_path):
    from segadv.monitor.status import RunRecord, read_status

    record = RunRecord(tmp_path, max_steps=4)
    record.begin(0, None)
    size = (tmp_path / "status.json").stat().st_size
    record.reached(2)
    # A long message, as a full disk leaves it: cut to fit the blocks the file holds.
    record._write("failed", in_place=True, exit_code=4, error="cannot write x: " + "y" * 20000)
    status = read_status(tmp_path)
    assert (status.outcome, status.exit_code, status.step) == ("failed", 4, 2)
    assert status.error.startswith("cannot write x: yyy") and status.error.endswith(" [...]")
    assert (tmp_path / "status.json").stat().st_size <= max(size, os.stat(tmp_path / "status.json").st_blocks * 512)

    record._write("failed", in_place=True, exit_code=4, error="short")  # shorter: padded, never cut
    assert read_status(tmp_path).error == "short"


def test_an_in_place_write_without_a_file_is_a_write_failure(tmp_path):
    with pytest.raises(WriteFailed, match=r"cannot write .*status\.json: No such file or directory"):
        rewrite_in_place(tmp_path / "status.json", b"{}")
    assert list(tmp_path.iterdir()) == []
