"""Options and key=value overrides mix in any order, in every segadv CLI that takes overrides."""

import pytest

from segadv.cli_args import parse_args


def parser_of(module_name):
    import importlib

    return importlib.import_module(module_name).build_parser()


@pytest.mark.parametrize("module, argv, expected", [
    ("segadv.train", ["--run-dir", "R", "train.max_steps=20", "--resume", "auto", "checkpoint.every=5"],
     {"run_dir": "R", "resume": "auto", "overrides": ["train.max_steps=20", "checkpoint.every=5"]}),
    ("segadv.eval", ["a=1", "--checkpoint", "C", "b=2", "--json"],
     {"checkpoint": "C", "json": True, "overrides": ["a=1", "b=2"]}),
    ("segadv.ckpt", ["convert", "F", "a=1", "--output", "O", "b=2"],
     {"command": "convert", "file": "F", "output": "O", "overrides": ["a=1", "b=2"]}),
    ("segadv.predict", ["--checkpoint", "C", "a=1", "--input", "I", "--output", "O", "b=2"],
     {"checkpoint": "C", "input": "I", "output": "O", "overrides": ["a=1", "b=2"]}),
    ("segadv.export.cli", ["--checkpoint", "C", "a=1", "--output", "O", "b=2"],
     {"checkpoint": "C", "output": "O", "overrides": ["a=1", "b=2"]}),
    ("segadv.data.check", ["check", "a=1", "--config", "X", "b=2"],
     {"command": "check", "config": "X", "overrides": ["a=1", "b=2"]}),
])
def test_overrides_and_options_in_any_order(module, argv, expected):
    args = parse_args(parser_of(module), argv)
    assert {k: getattr(args, k) for k in expected} == expected


def test_an_unknown_subcommand_still_gets_argparses_message(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(parser_of("segadv.ckpt"), ["nope"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err
