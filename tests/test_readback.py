"""segadv/readback.py: every way a file read back can fail is one Unreadable naming the file."""

import math
import os
import threading

import pytest

from segadv.errors import UserError
from segadv.readback import (TooLarge, Unreadable, parse_json, read_bytes, read_json, read_text, real_number,
                             whole_number)


def test_bytes_that_are_not_utf8_name_the_file_and_the_offset(tmp_path):
    path = tmp_path / "status.json"
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(Unreadable, match=r"status.json is not UTF-8 text: byte 7 is 0xff") as raised:
        read_text(path)
    assert isinstance(raised.value, UserError)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    done = []
    reader = threading.Thread(target=lambda: done.append(pytest.raises(Unreadable, read_bytes, fifo)), daemon=True)
    reader.start()
    reader.join(10)
    assert done, "reading a FIFO hung"
    assert "is a FIFO (named pipe), not a file" in str(done[0].value)


def test_links_that_lead_nowhere_and_directories(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(Unreadable, match=r"cannot be read: Too many levels of symbolic links \(ELOOP\)"):
        read_bytes(tmp_path / "a")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError):  # missing: the caller says what that means
        read_bytes(tmp_path / "dangling")
    with pytest.raises(Unreadable, match="is a directory, not a file"):
        read_bytes(tmp_path)


def test_the_size_cap_names_itself(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 2049)
    with pytest.raises(TooLarge, match=r"big is larger than 2 KiB \(the cap on a status file's size\)"):
        read_bytes(path, cap=2048, what="a status file")
    assert read_bytes(path, cap=4096) == b"x" * 2049


def test_json_failures_are_value_errors_never_recursion_or_overflow(tmp_path):
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_json("[" * 100_000)
    with pytest.raises(ValueError):
        parse_json("1" * 5000)  # more digits than int() converts
    assert parse_json('{"step": 1e400}') == {"step": math.inf}
    path = tmp_path / "best.json"
    path.write_text('{"step": ' + "[" * 50_000)
    with pytest.raises(Unreadable, match="best.json is not valid JSON"):
        read_json(path)


@pytest.mark.parametrize("value, expected", [
    (3, 3), (3.0, 3), (-1, None), (2**63, None), (math.inf, None), (math.nan, None), (1e400, None), (10**30, None),
    (2.5, None), ("3", None), (True, None), (None, None),
])
def test_whole_number(value, expected):
    assert whole_number(value) == expected


def test_real_number():
    assert real_number(0.5) == 0.5 and math.isnan(real_number(math.nan))
    assert real_number(math.inf) is None and real_number(10**400) is None and real_number("0.5") is None
    assert real_number(False) is None
