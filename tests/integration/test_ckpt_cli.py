"""segadv-ckpt inspect / convert, and partial init from config, from the command line."""

import pytest
import torch
from torch import nn

from segadv.cli import ckpt as ckpt_cli
from segadv.cli import train as train_cli
from segadv.checkpoint import load_weights
from segadv.config import load_config
from segadv.models import build_generator

from conftest import TINY_OVERRIDES


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    assert train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES,
                           "train.max_steps=2", "log.tensorboard=false"]) == 0
    return run_dir


def tiny_generator(num_classes=5, seed=0):
    torch.manual_seed(seed)
    # The G the tiny training runs build (the embedded default with TINY_OVERRIDES).
    return build_generator(load_config(None, TINY_OVERRIDES).model.generator, num_classes)


def test_inspect_segadv_checkpoint(run_dir, capsys):
    assert ckpt_cli.main(["inspect", str(run_dir / "checkpoints" / "last.pt")]) == 0
    out = capsys.readouterr().out
    assert "segadv training checkpoint" in out and "step:      2" in out
    assert "generator:" in out and "discriminator:" in out and "prefixes: (none)" in out
    assert "encoder: mobilenet_v2" in out  # the saved config


def test_inspect_dataparallel_state_dict_reports_prefix(tmp_path, capsys):
    path = tmp_path / "dp.pt"
    torch.save(nn.DataParallel(tiny_generator()).state_dict(), path)
    assert ckpt_cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "raw state dict" in out and "prefixes: module." in out and "segmentation generator" in out


@pytest.mark.parametrize("safetensors", [False, True])
def test_convert_writes_a_clean_generator_file(run_dir, tmp_path, safetensors):
    out = tmp_path / "new" / "folder" / ("g.safetensors" if safetensors else "g.pt")  # made, as other commands do
    argv = ["convert", str(run_dir / "checkpoints" / "last.pt"), "--output", str(out)]
    assert ckpt_cli.main(argv + (["--safetensors"] if safetensors else [])) == 0
    if safetensors:
        from safetensors.torch import load_file

        state = load_file(out)
    else:
        state = torch.load(out, weights_only=True)
    assert not any(k.startswith(("module.", "_orig_mod.", "generator.")) for k in state)
    fresh = tiny_generator(seed=3)
    fresh.load_state_dict(state)  # strict
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["generator"]
    assert all(torch.equal(fresh.state_dict()[k], saved[k]) for k in saved)


def test_partial_init_from_config_and_strict_failure_without_exclude(tmp_path, capsys):
    path = tmp_path / "g21.pt"
    torch.save({"state_dict": nn.DataParallel(tiny_generator(num_classes=21)).state_dict()}, path)
    base = ["--device-map", "cpu", *TINY_OVERRIDES, "train.max_steps=1", "log.tensorboard=false",
            f"init.generator.path={path}"]
    assert train_cli.main(["--run-dir", str(tmp_path / "a"), *base]) == 2
    err = capsys.readouterr().err
    assert "does not fit the generator" in err and "segmentation_head.0.weight: file (21," in err
    assert train_cli.main(["--run-dir", str(tmp_path / "b"), *base,
                           "init.generator.exclude=[segmentation_head.*]"]) == 0


def test_missing_init_file_is_a_user_error(tmp_path, capsys):
    code = train_cli.main(["--run-dir", str(tmp_path / "r"), "--device-map", "cpu", *TINY_OVERRIDES,
                           f"init.generator.path={tmp_path / 'nope.pt'}"])
    assert code == 2 and "checkpoint not found" in capsys.readouterr().err


def test_load_weights_into_a_generator_matches_a_converted_file(run_dir, tmp_path):
    g = tiny_generator(seed=9)
    report = load_weights(run_dir / "checkpoints" / "last.pt", g, role="generator")
    assert report.location == "['generator']" and report.prefix == ""


def test_convert_smp_refuses_a_folder_of_foreign_files_and_writes_with_the_umask(run_dir, tmp_path, capsys):
    """The issue's case: ``--smp .`` in a project folder would have replaced its README.md and
    config.json. Refused as predict refuses such a folder; --overwrite writes there; a folder
    convert wrote before is rewritten without it; model.safetensors keeps the umask's mode."""
    import os

    from segadv.fsutil import file_sha256

    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("my project\n")
    (project / "config.json").write_text('{"mine": true}\n')
    before = {p.name: file_sha256(p) for p in project.iterdir()}
    last = str(run_dir / "checkpoints" / "last.pt")
    assert ckpt_cli.main(["convert", last, "--smp", str(project)]) == 2
    err = capsys.readouterr().err
    assert "holds files segadv-ckpt convert did not write (README.md, config.json)" in err and "--overwrite" in err
    assert {p.name: file_sha256(p) for p in project.iterdir()} == before

    out = tmp_path / "smp"
    assert ckpt_cli.main(["convert", last, "--smp", str(out)]) == 0
    assert ckpt_cli.main(["convert", last, "--smp", str(out)]) == 0  # its own files: rewritten
    mask = os.umask(0)
    os.umask(mask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask
    assert ckpt_cli.main(["convert", last, "--smp", str(project), "--overwrite"]) == 0
    assert (project / "model.safetensors").is_file()
