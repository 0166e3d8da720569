"""Every command's output file onto what is not a regular file (a FIFO, a directory, a link to a
FIFO, a character device, a socket): exit 2, one ``error:`` line naming it, no traceback, and the
thing left exactly as it was; refused before any slow work (the checkpoint named here does not
even exist). A regular file is replaced atomically. Devices are made in tmp dirs, never /dev."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from segadv.cli import ckpt, curves, data, export
from test_fsutil import char_device, snapshot


def command(name: str, output: Path, tmp_path: Path) -> tuple:
    missing = str(tmp_path / "no-such-checkpoint.pt")
    return {
        "segadv-curves --png": (curves.main, [str(tmp_path / "no-run"), "--png", str(output)]),
        "segadv-data show --output": (data.main, ["show", "--output", str(output)]),
        "segadv-export --output": (export.main, ["--checkpoint", missing, "--output", str(output)]),
        "segadv-ckpt convert --output": (ckpt.main, ["convert", missing, "--output", str(output)]),
    }[name]


SUFFIX = {"segadv-curves --png": ".png", "segadv-data show --output": ".png", "segadv-export --output": ".onnx",
          "segadv-ckpt convert --output": ".pt"}


def make(kind: str, tmp_path: Path, suffix: str) -> Path:
    path = tmp_path / f"out{suffix}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "character device":
        char_device(tmp_path).rename(path)
    elif kind.startswith("link to"):
        inner = make(kind.removeprefix("link to "), tmp_path / "elsewhere", suffix)
        path.symlink_to(inner)
    return path


@pytest.mark.parametrize("name", list(SUFFIX))
@pytest.mark.parametrize("kind", ["fifo", "directory", "socket", "character device", "link to fifo",
                                  "link to character device", "link to link to fifo"])
def test_an_output_that_is_not_a_regular_file_is_exit_2_naming_it_and_left_as_it_was(tmp_path, capsys, name, kind):
    (tmp_path / "elsewhere" / "elsewhere").mkdir(parents=True)
    output = make(kind, tmp_path, SUFFIX[name])
    before = snapshot(output)
    main, argv = command(name, output, tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert str(output) in line, line
    assert snapshot(output) == before  # same inode, mode and device numbers: never replaced
    assert not [p for p in tmp_path.rglob(".*tmp-*")]


def test_curves_replaces_a_regular_png_atomically_and_writes_a_linked_one_where_it_leads(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "a"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 2, "val/mIoU": 0.5, "perf/train_seconds": 3.0}) + "\n")
    png = tmp_path / "curves.png"
    png.write_bytes(b"old")
    inode = png.stat().st_ino
    assert curves.main([str(run), "--png", str(png)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_ino != inode
    link = tmp_path / "latest.png"
    link.symlink_to(png)
    assert curves.main([str(run), "--png", str(link)]) == 0
    assert link.is_symlink() and png.read_bytes().startswith(b"\x89PNG")  # the file it leads to, the link kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "curves.png", "latest.png"]


@pytest.mark.parametrize("fmt, suggested", [
    ("torchscript", "{d}/model.pt"),
    ("onnx", "{d}/model.onnx"),
    ("exported", "{d}/model.pt2"),
    (None, "{d}/model.onnx for ONNX, {d}/model.pt2 for torch.export or {d}/model.pt for TorchScript"),
])
def test_export_to_a_folder_suggests_a_file_its_format_writes(tmp_path, capsys, fmt, suggested):
    folder = tmp_path / "exports"
    folder.mkdir()
    code = export.main(["--checkpoint", str(tmp_path / "no-such-checkpoint.pt"), "--output", str(folder),
                        *(["--format", fmt] if fmt else [])])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip() == (f"error: --output {folder} is a directory; name the file to write "
                           f"(e.g. {suggested.format(d=folder)})")
