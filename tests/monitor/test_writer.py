"""monitor/writer.py: metrics.jsonl read defensively at resume, TensorBoard write failures raised
on the main thread (never the writer thread's own traceback)."""

import errno
import threading

import pytest

from segadv.errors import UserError, WriteFailed
from segadv.monitor.writer import MetricWriter


def test_a_disk_that_fills_under_tensorboards_writer_thread_is_one_write_failure(tmp_path, monkeypatch):
    from tensorboard.summary.writer.record_writer import RecordWriter

    thread_errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: thread_errors.append(args.exc_value))
    writer = MetricWriter(tmp_path, tensorboard=True)

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RecordWriter, "write", full)
    with pytest.raises(WriteFailed, match=r"cannot write .*tensorboard: No space left on device \(ENOSPC\)"):
        for step in range(1, 50):
            writer.scalars(step, {"train/loss": 1.0})
        writer.flush()
    writer.close()  # reported once: close does not raise it again
    assert thread_errors == []


def test_metrics_jsonl_keeps_records_to_the_step_and_drops_a_record_cut_short(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a": 3}\n{"step": 4, "a"')
    MetricWriter(tmp_path, tensorboard=False, resume_step=2).close()
    assert path.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'


@pytest.mark.parametrize("content", [b"\x80\x81binary\n{\"step\": 1}\n", b"[1, 2]\n{\"step\": 1}\n",
                                     b"\x00\x01\x02\x03"])
def test_a_garbled_metrics_jsonl_is_a_user_error_naming_it_and_left_as_it_is(tmp_path, content):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(content)
    with pytest.raises(UserError, match=rf"{path}: line 1 is not a metrics record"):
        MetricWriter(tmp_path, tensorboard=False, resume_step=1)
    assert path.read_bytes() == content
