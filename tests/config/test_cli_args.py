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


def console_scripts():
    """{command: module} of pyproject.toml's [project.scripts]."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]")[1].split("\n[")[0]
    return dict(re.findall(r'^(\S+)\s*=\s*"([\w.]+):main"', scripts, re.M))


# Each command's bad invocations: an option it does not have (after its required arguments, so that
# the option is what argparse refuses) and a bad value of one it has; the culprit each names.
BAD_ARGUMENTS = {
    "segadv-train": [(["--no-such-option"], "unrecognized arguments: --no-such-option"),
                     (["--nproc-per-node", "x"], "argument --nproc-per-node: invalid int value: 'x'")],
    "segadv-eval": [(["--checkpoint", "c.pt", "--batch-size", "x"], "unrecognized arguments: --batch-size"),
                    (["--network", "bogus"], "argument --network: invalid choice: 'bogus'")],
    "segadv-export": [(["--checkpoint", "c.pt", "--output", "m.onnx", "--no-such-option"],
                       "unrecognized arguments: --no-such-option"),
                      (["--checkpoint", "c.pt", "--format", "zip"], "argument --format: invalid choice: 'zip'")],
    "segadv-predict": [(["--checkpoint", "c.pt", "--input", "i", "--output", "o", "--no-such-option"],
                        "unrecognized arguments: --no-such-option"),
                       (["--mode", "tile"], "argument --mode: invalid choice: 'tile'")],
    "segadv-data": [(["check", "--no-such-option"], "unrecognized arguments: --no-such-option"),
                    (["show", "--num", "x"], "argument --num: expected a whole number, got 'x'"),
                    (["frob"], "invalid choice: 'frob'")],
    "segadv-ckpt": [(["inspect", "f.pt", "--no-such-option"], "unrecognized arguments: --no-such-option"),
                    (["convert", "f.pt", "--network", "bogus"], "argument --network: invalid choice: 'bogus'"),
                    (["frob"], "invalid choice: 'frob'")],
    "segadv-plan": [(["--no-such-option"], "unrecognized arguments: --no-such-option"),
                    (["--gpus", "x"], "argument --gpus: invalid int value: 'x'")],
    "segadv-experiment": [(["table", "r", "--no-such-option"], "unrecognized arguments: --no-such-option"),
                          (["run", "g.yaml", "--seeds", "x"], "argument --seeds: invalid int value: 'x'")],
    "segadv-curves": [(["r", "--no-such-option"], "unrecognized arguments: --no-such-option"),
                      (["r", "--threshold", "2"], "argument --threshold: expected a number within 0..1, got '2'")],
}


SUBCOMMANDS = {"segadv.cli.data", "segadv.cli.ckpt", "segadv.cli.experiment"}  # their parsers' subparsers say


def test_every_console_script_has_its_bad_arguments_tested():
    assert set(BAD_ARGUMENTS) == set(console_scripts())


@pytest.mark.parametrize("command, argv, culprit",
                         [(command, argv, culprit) for command, cases in BAD_ARGUMENTS.items()
                          for argv, culprit in cases])
def test_a_bad_option_or_value_exits_2_in_one_line_naming_it(command, argv, culprit, capsys):
    """A user error like any other: exit 2, one line naming the option or value and pointing at
    --help, no usage block and no traceback; a subcommand's line names the subcommand."""
    import importlib

    module = importlib.import_module(console_scripts()[command])
    with pytest.raises(SystemExit) as raised:
        module.main(argv)
    captured = capsys.readouterr()
    assert raised.value.code == 2 and captured.out == ""
    subcommand = console_scripts()[command] in SUBCOMMANDS and not culprit.startswith("invalid choice")
    prog = f"{command} {argv[0]}" if subcommand else command
    assert captured.err.startswith(f"{prog}: error: ") and culprit in captured.err
    assert captured.err.endswith(f"; see {prog} --help\n") and captured.err.count("\n") == 1
    assert "usage:" not in captured.err and "Traceback" not in captured.err
