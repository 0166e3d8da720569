"""Options and key=value overrides mix in any order, in every segadv CLI that takes overrides."""

import pytest

from segadv.cli.args import parse_args


def parser_of(module_name):
    import importlib

    return importlib.import_module(module_name).build_parser()


@pytest.mark.parametrize("module, argv, expected", [
    ("segadv.cli.train", ["--run-dir", "R", "train.max_steps=20", "--resume", "auto", "checkpoint.every=5"],
     {"run_dir": "R", "resume": "auto", "overrides": ["train.max_steps=20", "checkpoint.every=5"]}),
    ("segadv.cli.eval", ["a=1", "--checkpoint", "C", "b=2", "--json"],
     {"checkpoint": "C", "json": True, "overrides": ["a=1", "b=2"]}),
    ("segadv.cli.ckpt", ["convert", "F", "a=1", "--output", "O", "b=2"],
     {"command": "convert", "file": "F", "output": "O", "overrides": ["a=1", "b=2"]}),
    ("segadv.cli.predict", ["--checkpoint", "C", "a=1", "--input", "I", "--output", "O", "b=2"],
     {"checkpoint": "C", "input": "I", "output": "O", "overrides": ["a=1", "b=2"]}),
    ("segadv.cli.export", ["--checkpoint", "C", "a=1", "--output", "O", "b=2"],
     {"checkpoint": "C", "output": "O", "overrides": ["a=1", "b=2"]}),
    ("segadv.cli.data", ["check", "a=1", "--config", "X", "b=2"],
     {"command": "check", "config": "X", "overrides": ["a=1", "b=2"]}),
])
def test_overrides_and_options_in_any_order(module, argv, expected):
    args = parse_args(parser_of(module), argv)
    assert {k: getattr(args, k) for k in expected} == expected


def test_an_unknown_subcommand_still_gets_argparses_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(parser_of("segadv.cli.ckpt"), ["nope"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("module, argv, dest", [
    ("segadv.cli.train", ["--run-dir", "~/runs/a"], "run_dir"),
    ("segadv.cli.train", ["--resume", "~/runs/a/checkpoints/step_2.pt"], "resume"),
    ("segadv.cli.predict", ["--checkpoint", "c.pt", "--input", "x.png", "--output", "~/masks"], "output"),
    ("segadv.cli.export", ["--checkpoint", "~/c.pt", "--output", "~/m.onnx"], "output"),
    ("segadv.cli.eval", ["--checkpoint", "~/c.pt"], "checkpoint"),
])
def test_every_path_option_expands_tilde(module, argv, dest, monkeypatch, tmp_path):
    import importlib

    monkeypatch.setenv("HOME", str(tmp_path))
    parser = importlib.import_module(module).build_parser()
    value = getattr(parse_args(parser, argv), dest)
    assert value.startswith(str(tmp_path)) and "~" not in value


def test_path_options_refuse_an_empty_path(capsys):
    import importlib

    for module, argv in (("segadv.cli.train", ["--run-dir", ""]), ("segadv.cli.ckpt", ["convert", "f.pt", "--smp", ""])):
        with pytest.raises(SystemExit) as raised:
            parse_args(importlib.import_module(module).build_parser(), argv)
        assert raised.value.code == 2 and "empty path" in capsys.readouterr().err
    assert "~" not in parse_args(importlib.import_module("segadv.cli.ckpt").build_parser(),
                                 ["convert", "f.pt", "--smp", "~/smp"]).smp


def test_run_dir_in_a_config_expands_tilde_and_refuses_an_empty_path(monkeypatch, tmp_path):
    from segadv.config import load_config
    from segadv.errors import UserError

    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config(None, ["run_dir=~/x"]).run_dir == str(tmp_path / "x")
    with pytest.raises(UserError, match=r"run_dir: .*the path is empty"):
        load_config(None, ["run_dir=''"])


CLIS = ["segadv.cli.train", "segadv.cli.eval", "segadv.cli.ckpt", "segadv.cli.predict", "segadv.cli.export",
        "segadv.cli.data", "segadv.cli.plan", "segadv.cli.experiment", "segadv.cli.curves"]


def test_every_commands_help_answers_without_importing_torch():
    """torch takes seconds to import: --help (and --list-configs) of every console script answers
    without it, and names where its documentation is."""
    import subprocess
    import sys

    code = ("import importlib, io, sys, contextlib\n"
            f"for name in {CLIS!r}:\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try:\n            importlib.import_module(name).main(['--help'])\n"
            "        except SystemExit:\n            pass\n"
            "    assert 'documentation: ' in out.getvalue() and '.md' in out.getvalue(), name\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module, argv", [
    ("segadv.cli.predict", ["--model", "m.onnx", "--input", "{d}/a.png", "{d}/b.png", "{d}/c.png", "--output", "o"]),
    ("segadv.cli.predict", ["--checkpoint", "c.pt", "--input", "{d}/a.png", "{d}/b.png", "--output", "o"]),
])
def test_a_glob_the_shell_expanded_is_named_as_such(module, argv, tmp_path, capsys):
    import importlib

    for name in ("a.png", "b.png", "c.png"):
        (tmp_path / name).write_bytes(b"")
    code = importlib.import_module(module).main([a.format(d=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and f"'{tmp_path}/b.png'" in err and "the shell expanded an unquoted glob" in err
    assert "--checkpoint only" not in err and "invalid override" not in err
