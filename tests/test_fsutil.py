"""segadv/fsutil.py's rule for every output path: a regular file (or a new name) is written
atomically; a character device, FIFO, socket, directory, or a link (to links) to one is a user
error naming it, and is left exactly as it was. Devices are made in tmp dirs (never /dev)."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from segadv import fsutil
from segadv.errors import EXIT_USER_ERROR, UserError, WriteFailed, exit_code_of
from segadv.fsutil import NotAFile


def char_device(folder: Path) -> Path:
    """A character device in ``folder``, the null device's numbers (harmless if ever opened); skipped
    where this process may not make one."""
    path = folder / "null-device"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (OSError, AttributeError) as err:
        pytest.skip(f"cannot make a character device here: {err}")
    return path


def not_files(tmp_path: Path) -> dict[str, Path]:
    """Every kind of thing that is not a regular file, and links (and links to links) to them."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    sock.close()
    paths = {"fifo": tmp_path / "fifo", "folder": tmp_path / "folder", "socket": tmp_path / "sock",
             "device": char_device(tmp_path)}
    for name, target in list(paths.items()):
        (tmp_path / f"link-{name}").symlink_to(target)
        (tmp_path / f"link-link-{name}").symlink_to(tmp_path / f"link-{name}")
        paths[f"link to {name}"] = tmp_path / f"link-{name}"
        paths[f"link to a link to {name}"] = tmp_path / f"link-link-{name}"
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    paths["link loop"] = tmp_path / "loop"
    return paths


def snapshot(path: Path) -> tuple:
    st, target = os.lstat(path), os.stat(path) if not path.name == "loop" else None
    return st.st_mode, st.st_ino, st.st_rdev, (target.st_mode, target.st_ino, target.st_rdev) if target else None


def test_every_writer_refuses_what_is_not_a_regular_file_and_leaves_it_as_it_was(tmp_path):
    paths = not_files(tmp_path)
    before = {name: snapshot(path) for name, path in paths.items()}
    writers = {
        "atomic_write_bytes": lambda p: fsutil.atomic_write_bytes(p, b"data"),
        "atomic_write_text": lambda p: fsutil.atomic_write_text(p, "data"),
        "staged": lambda p: fsutil.staged(p).__enter__(),
        "open_append": lambda p: fsutil.open_append(p),
        "open_run_file": lambda p: fsutil.open_run_file(p, os.O_WRONLY | os.O_CREAT),
        "check_output": lambda p: fsutil.check_output(p, "--output"),
        "output_file": lambda p: fsutil.output_file(p, "--output"),
    }
    for name, path in paths.items():
        for writer, write in writers.items():
            with pytest.raises(NotAFile) as err:
                write(path)
            assert str(path) in str(err.value), (writer, name)
            assert exit_code_of(err.value) == EXIT_USER_ERROR
            assert "\n" not in str(err.value)
    assert {name: snapshot(path) for name, path in paths.items()} == before
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no temp file left either


def test_the_message_says_what_stands_there_through_the_links(tmp_path):
    paths = not_files(tmp_path)
    with pytest.raises(NotAFile, match=r"^--png \S+link-link-device is a symbolic link to \S+null-device, "
                                       r"a character device, not a regular file"):
        fsutil.check_output(paths["link to a link to device"], "--png")
    with pytest.raises(NotAFile, match=r"fifo is a FIFO \(named pipe\), not a regular file"):
        fsutil.check_output(paths["fifo"])
    with pytest.raises(NotAFile, match=r"sock is a socket"):
        fsutil.check_output(paths["socket"])
    with pytest.raises(NotAFile, match=r"folder is a directory, not a regular file: .*name a file to write in it"):
        fsutil.check_output(paths["folder"])
    with pytest.raises(NotAFile, match=r"fifo is a FIFO \(named pipe\), not a folder"):
        fsutil.check_output_dir(paths["fifo"], "--show-dir")


def test_a_regular_file_is_replaced_atomically_and_a_new_name_created(tmp_path):
    target = tmp_path / "out.png"
    target.write_bytes(b"old")
    inode = target.stat().st_ino
    fsutil.atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and target.stat().st_ino != inode  # a new file renamed over it
    fsutil.atomic_write_bytes(tmp_path / "fresh", b"x")
    assert (tmp_path / "fresh").read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "out.png"]


def test_a_writer_never_writes_through_a_link_and_a_command_output_is_resolved(tmp_path):
    user = tmp_path / "user.txt"
    user.write_text("mine")
    (tmp_path / "link").symlink_to(user)
    fsutil.atomic_write_bytes(tmp_path / "link", b"run data")  # the name gets the file
    assert user.read_text() == "mine" and not (tmp_path / "link").is_symlink()
    assert (tmp_path / "link").read_bytes() == b"run data"
    (tmp_path / "link2").symlink_to(tmp_path / "link-to-user")
    (tmp_path / "link-to-user").symlink_to(user)
    assert fsutil.output_file(tmp_path / "link2", "--output") == user  # a command's output: where it leads


def test_a_stale_temp_name_that_is_a_fifo_or_a_link_is_never_opened(tmp_path):
    target = tmp_path / "out.bin"
    os.mkfifo(fsutil._temp_path(target))  # would block an open for writing
    fsutil.atomic_write_bytes(target, b"x")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    fsutil._temp_path(target).symlink_to(victim)
    fsutil.atomic_write_bytes(target, b"y")
    assert target.read_bytes() == b"y" and victim.read_text() == "keep"


def test_a_full_disk_in_the_one_writer_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    target = tmp_path / "config.yaml"
    target.write_text("old")

    def full(fh, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fsutil, "write_all", full)
    with pytest.raises(WriteFailed, match=rf"cannot write {target}: No space left on device \(ENOSPC\)"):
        fsutil.atomic_write_text(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_an_output_folder_is_never_an_input_folder_inside_one_or_holding_one(tmp_path):
    root = tmp_path / "data"
    (root / "val").mkdir(parents=True)
    (tmp_path / "link").symlink_to(root)
    inputs = [("data.root", root)]
    for folder, relation in ((tmp_path / "link", "is"), (root / "val" / "new", "lies inside"), (tmp_path, "holds")):
        with pytest.raises(UserError, match=f"--show-dir {folder} {relation} data.root {root}"):
            fsutil.refuse_folder_overlap("--show-dir", folder, inputs)
    fsutil.refuse_folder_overlap("--show-dir", tmp_path / "elsewhere", inputs)


@pytest.mark.parametrize("writer", ["atomic_write_bytes", "staged"])
def test_a_stop_raised_mid_write_leaves_no_temp_file_and_the_old_file(tmp_path, monkeypatch, writer):
    """A signal's exception (segadv/signals.py's Interrupted, a KeyboardInterrupt) raised inside a
    write, half of the bytes in the temp file: the temp file is removed, the file as it was."""
    from segadv.signals import Interrupted
    import signal

    target = tmp_path / "out.bin"
    target.write_bytes(b"before")
    real = fsutil.write_all

    def half_then_signal(fh, data):
        real(fh, data[:len(data) // 2])
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(fsutil, "write_all", half_then_signal)
    with pytest.raises(Interrupted):
        if writer == "atomic_write_bytes":
            fsutil.atomic_write_bytes(target, b"0123456789")
        else:
            with fsutil.staged(target) as stage:
                fsutil.write_new(stage.path, b"0123456789")
                stage.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
    assert target.read_bytes() == b"before"
