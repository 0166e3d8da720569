"""The exit-code contract of segadv/errors.py: what the OS refuses about a path or the output is
answered in one line, no traceback."""

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from segadv.errors import EXIT_USER_ERROR, EXIT_WRITE_FAILED, cli_entry, exit_code_of


def entry(err: BaseException):
    @cli_entry
    def main(argv=None):
        raise err

    return main


def test_a_path_the_os_refuses_is_a_user_error_naming_it(capsys):
    name = "r" * 300
    assert entry(OSError(errno.ENAMETOOLONG, "File name too long", name))([]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: {name}: File name too long (ENAMETOOLONG)"]
    assert exit_code_of(OSError(errno.ELOOP, "Too many levels of symbolic links", "run")) == EXIT_USER_ERROR


def test_a_full_or_closed_output_is_a_write_failure(capsys):
    assert entry(OSError(errno.ENOSPC, "No space left on device"))([]) == EXIT_WRITE_FAILED
    assert "cannot write the output: No space left on device (ENOSPC)" in capsys.readouterr().err


def test_any_other_os_error_keeps_its_traceback():
    with pytest.raises(FileNotFoundError):
        entry(FileNotFoundError(errno.ENOENT, "No such file or directory", "x"))([])
    with pytest.raises(OSError):
        entry(OSError(errno.ENOSPC, "No space left on device", "a-file-not-written-by-fsutil"))([])


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_print_config_to_a_full_device_exits_4_without_a_traceback():
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "segadv.cli.train", "--print-config"], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=120)
    assert result.returncode == EXIT_WRITE_FAILED
    assert result.stderr.strip().splitlines() == ["error: cannot write the output: No space left on device (ENOSPC)"]


class DistBackendError(RuntimeError):
    """Named as torch.distributed's: what a collective raises when its peer has gone."""


def test_a_collective_failing_after_a_stop_request_is_the_stop_not_a_fault(capsys):
    """A rank stopping on Ctrl-C whose peer ended first sees its collective fail: one line, the
    signal's exit code. The same error with no stop requested keeps its traceback."""
    import signal

    from segadv.signals import StopRequests

    @cli_entry
    def stopped(argv=None):
        with StopRequests() as stop:
            stop._handle(signal.SIGINT)
            raise DistBackendError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")

    assert stopped([]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: interrupted by SIGINT while another rank stopped first")
    with pytest.raises(DistBackendError):
        entry(DistBackendError("Connection closed by peer"))([])
