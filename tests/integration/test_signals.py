"""SIGTERM, SIGHUP and SIGINT at several points of a command, sent to a real process
(docs/failures.md, "Signals"): the exit code, one ``error:`` line (none after a clean stop at a
checkpoint), no temp file left, and the same command started again works.

Each process is held at its point by tests/integration/signal_driver.py until the signal comes, and
the test waits for the line saying so: no sleep decides where a signal lands.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES
from segadv.cli import train as train_cli

DRIVER = Path(__file__).with_name("signal_driver.py")
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600  # generous: a busy machine is slow, never wrong
# Three steps, a checkpoint at each, one evaluation at the end: a stop requested during step 1's
# checkpoint lands after step 2 (the loop sees it at the next step boundary).
TRAIN = ["--device-map", "cpu", *TINY_OVERRIDES, "log.tensorboard=false", "train.max_steps=3",
         "checkpoint.every=1", "train.eval_every=3"]


class Held:
    """A command under the driver, held at ``point``; its stderr collected by a thread."""

    def __init__(self, point: str, command: str, *argv: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, str(DRIVER), point, command, *argv], cwd=ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str) -> None:
        while True:
            try:
                line = self.lines.get(timeout=TIMEOUT)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no {text!r} in {TIMEOUT} s:\n" + "".join(self.seen)) from None
            if line is None:
                raise AssertionError(f"the process ended before {text!r}:\n" + "".join(self.seen))
            self.seen.append(line)
            if text in line:
                return

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def finish(self) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        while (line := self.lines.get(timeout=TIMEOUT)) is not None:
            self.seen.append(line)
        return code, "".join(self.seen)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def temp_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*tmp-*")) if root.exists() else []


def assert_clean(code: int, stderr: str, expected: int, root: Path) -> list[str]:
    assert code == expected, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert temp_files(root) == []
    errors = error_lines(stderr)
    assert len(errors) == (0 if expected == 0 else 1), stderr[-3000:]
    return errors


def status_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("point", ["placement", "write:config.yaml"])
def test_a_signal_before_the_first_step_unwinds_the_start(tmp_path, sig, point):
    run_dir = tmp_path / "run"
    held = Held(point, "segadv-train", "--run-dir", str(run_dir), *TRAIN)
    held.wait_for(f"waiting at {point}")
    held.send(sig)
    code, stderr = held.finish()
    name = signal.Signals(sig).name
    [error] = assert_clean(code, stderr, 128 + sig, tmp_path)
    assert error == (f"error: interrupted by {name} before the first step; nothing was trained or saved, and "
                     f"what the start wrote in {run_dir} was removed: run the same command again to start")
    assert not run_dir.exists()  # the start made it, and took it away

    assert train_cli.main(["--run-dir", str(run_dir), *TRAIN]) == 0  # a plain restart: no "already holds a run"
    assert status_of(run_dir)["outcome"] == "finished"


# What a start writes before its first step, in order (a file of a name not here is a test to add):
# the run dir's write probe, the lock's holder line, train.log, the data split, config.yaml; a
# resume's also metrics.jsonl, its records past the step resumed at taken out.
START_FILES = ["write-probe", ".segadv.lock", "train.log", "data_split.json", "config.yaml"]
RESUME_START_FILES = ["write-probe", ".segadv.lock", "train.log", "data_split.json", "metrics.jsonl", "config.yaml"]


def test_the_files_a_start_writes_are_those_the_signal_tests_cover(tmp_path, monkeypatch):
    from segadv import fsutil
    from segadv.training.run_dir import StartCleanup

    written: list[str] = []
    started: list[bool] = []
    real_write_all, real_opener, real_done = fsutil.write_all, fsutil._new_file_opener, StartCleanup.done

    def note(path: str) -> None:
        name = os.path.basename(path)
        name = "write-probe" if name.startswith(".write-probe-") else name.split(".tmp-")[0].removeprefix(".") \
            if ".tmp-" in name else name
        if not started and name not in written:
            written.append(name)

    def write_all(fh, data):
        note(fh.name if isinstance(fh.name, str) else os.readlink(f"/proc/self/fd/{fh.fileno()}"))
        return real_write_all(fh, data)

    def opener(path, flags):
        note(path)
        return real_opener(path, flags)

    monkeypatch.setattr(fsutil, "write_all", write_all)
    monkeypatch.setattr(fsutil, "_new_file_opener", opener)
    monkeypatch.setattr(StartCleanup, "done", lambda self: (started.append(True), real_done(self)))
    assert train_cli.main(["--run-dir", str(tmp_path / "run"), *TRAIN, "train.max_steps=1"]) == 0
    assert written == START_FILES
    written.clear(), started.clear()
    assert train_cli.main(["--run-dir", str(tmp_path / "run"), "--resume", "auto", *TRAIN, "train.max_steps=2"]) == 0
    assert written == RESUME_START_FILES


@pytest.mark.parametrize("name, resume", [
    *(pytest.param(name, False, id=f"{name}-fresh") for name in START_FILES),
    *(pytest.param(name, True, id=f"{name}-resume") for name in RESUME_START_FILES),
])
def test_a_signal_inside_any_write_of_a_start_unwinds_it(tmp_path, name, resume):
    """The command signals itself in the middle of the write (no timing decides where it lands):
    from the first file a start writes, a signal ends it with its line, the start's files put back
    and no temp file left."""
    run_dir = tmp_path / "run"
    before = {}
    if resume:
        assert train_cli.main(["--run-dir", str(run_dir), *TRAIN, "train.max_steps=1"]) == 0
        before = files_of(run_dir)
    held = Held(f"self-SIGTERM:{name}", "segadv-train", "--run-dir", str(run_dir), *(["--resume", "auto"] * resume),
                *TRAIN)
    code, stderr = held.finish()
    assert "SIGNAL-DRIVER: SIGTERM to itself in" in stderr, stderr[-3000:]
    [error] = assert_clean(code, stderr, 143, tmp_path)
    if resume:
        assert error == (f"error: interrupted by SIGTERM before the first step; the run stands at "
                         f"{run_dir / 'checkpoints' / 'last.pt'} (step 1): run the same command again to go on")
        assert files_of(run_dir) == before  # bytes and mtimes: the lock, train.log, config.yaml as they were
    else:
        assert error == (f"error: interrupted by SIGTERM before the first step; nothing was trained or saved, and "
                         f"what the start wrote in {run_dir} was removed: run the same command again to start")
        assert not run_dir.exists()


def files_of(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of the run dir (checkpoints included): its bytes and its mtime."""
    return {str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_signal_before_the_first_step_of_a_resume_leaves_the_run_as_it_was(tmp_path):
    run_dir = tmp_path / "run"
    assert train_cli.main(["--run-dir", str(run_dir), *TRAIN, "train.max_steps=1"]) == 0
    before = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()}
    every_file = files_of(run_dir)
    assert {"status.json", "train.log", ".segadv.lock"} <= set(every_file)
    held = Held("placement", "segadv-train", "--run-dir", str(run_dir), "--resume", "auto", *TRAIN)
    held.wait_for("waiting at placement")
    held.send(signal.SIGTERM)
    code, stderr = held.finish()
    [error] = assert_clean(code, stderr, 143, tmp_path)
    assert error == (f"error: interrupted by SIGTERM before the first step; the run stands at "
                     f"{run_dir / 'checkpoints' / 'last.pt'} (step 1): run the same command again to go on")
    assert {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()} == before
    after = files_of(run_dir)
    assert after.keys() == every_file.keys()
    for name in every_file:  # status.json, train.log and the lock too: bytes and mtime as they were
        assert after[name] == every_file[name], name

    assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto", *TRAIN]) == 0
    assert status_of(run_dir)["outcome"] == "finished" and status_of(run_dir)["step"] == 3


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: signal.Signals(s).name)
def test_a_second_signal_while_the_stopped_run_ends_changes_nothing(tmp_path, sig):
    """The first signal's answer stands: a repeat after the loop stopped (here while status.json's
    last record is written) is logged, and the exit code and status.json still agree on 0."""
    run_dir = tmp_path / "run"
    held = Held("write:last.pt+end", "segadv-train", "--run-dir", str(run_dir), *TRAIN)
    held.wait_for("waiting at write:last.pt")
    held.send(sig)
    held.wait_for("waiting at end")
    held.send(sig)
    code, stderr = held.finish()
    assert_clean(code, stderr, 0, tmp_path)
    name = signal.Signals(sig).name
    assert f"{name}: already stopping on {name}" in stderr
    status = status_of(run_dir)
    assert (status["outcome"], status["stopped_by"], status["exit_code"]) == ("stopped", name, 0)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_during_the_first_checkpoint_write_stops_there_with_it_saved(tmp_path, sig):
    run_dir = tmp_path / "run"
    held = Held("write:last.pt", "segadv-train", "--run-dir", str(run_dir), *TRAIN)
    held.wait_for("waiting at write:last.pt")
    held.send(sig)
    code, stderr = held.finish()
    assert_clean(code, stderr, 0, tmp_path)
    name = signal.Signals(sig).name
    assert f"{name} received: stopping after the current step" in stderr
    status = status_of(run_dir)
    assert (status["outcome"], status["stopped_by"], status["step"], status["exit_code"]) == ("stopped", name, 2, 0)
    assert (run_dir / "checkpoints" / "last.pt").is_file()

    assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto", *TRAIN]) == 0
    assert status_of(run_dir)["outcome"] == "finished" and status_of(run_dir)["step"] == 3


def test_a_signal_during_the_first_status_write_stops_after_the_first_step(tmp_path):
    run_dir = tmp_path / "run"
    held = Held("write:status.json", "segadv-train", "--run-dir", str(run_dir), *TRAIN)
    held.wait_for("waiting at write:status.json")
    held.send(signal.SIGTERM)
    code, stderr = held.finish()
    assert_clean(code, stderr, 0, tmp_path)
    status = status_of(run_dir)
    assert (status["outcome"], status["stopped_by"], status["step"]) == ("stopped", "SIGTERM", 1)  # seen after step 1


def test_a_second_ctrl_c_during_the_checkpoint_write_ends_at_once_without_a_temp_file(tmp_path):
    run_dir = tmp_path / "run"
    held = Held("write:last.pt", "segadv-train", "--run-dir", str(run_dir), *TRAIN)
    held.wait_for("waiting at write:last.pt")
    held.send(signal.SIGINT)
    held.wait_for("stopping after the current step")
    held.send(signal.SIGINT)
    code, stderr = held.finish()
    [error] = assert_clean(code, stderr, 130, tmp_path)
    assert error == ("error: interrupted by SIGINT again (a stop was requested by SIGINT); no checkpoint was "
                     "written before it")
    status = status_of(run_dir)
    assert (status["outcome"], status["stopped_by"], status["exit_code"]) == ("stopped", "SIGINT", 130)
    assert not (run_dir / "checkpoints" / "last.pt").exists()

    assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto", *TRAIN]) == 0  # nothing saved: from 0
    assert status_of(run_dir)["outcome"] == "finished"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("signals") / "run"
    assert train_cli.main(["--run-dir", str(run_dir), *TRAIN, "train.max_steps=1"]) == 0
    return run_dir / "checkpoints" / "last.pt"


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_during_export_verification_removes_the_temp_file(checkpoint, tmp_path, sig):
    out = tmp_path / "out"
    out.mkdir()
    held = Held("verify", "segadv-export", "--checkpoint", str(checkpoint), "--output", str(out / "m.onnx"))
    held.wait_for("waiting at verify")
    assert [p.name for p in out.iterdir()] != []  # the temp file is there while it verifies
    held.send(sig)
    code, stderr = held.finish()
    [error] = assert_clean(code, stderr, 128 + sig, out)
    assert error == f"error: interrupted by {signal.Signals(sig).name}; nothing was written to {out / 'm.onnx'}"
    assert list(out.iterdir()) == []
