"""Config discovery: ``segadv-train --help-config`` lists every key from the schema, and
``--print-config`` prints the config a run would train, without starting one."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from segadv.cli import train as train_cli
from segadv.config import config_to_dict, flat_config, load_config
from segadv.config.keys import key_listing, keys
from segadv.config.schema import Config


def test_every_settable_key_is_listed_with_its_type_and_the_schema_default():
    listed = {key.name: key for key in keys()}
    # every leaf of the schema's defaults is a listed key (an optional section unset, e.g.
    # init.generator, is a leaf there and a section heading here)
    assert set(flat_config(Config())) - set(listed) == set()
    assert listed["train.max_steps"].type.startswith("int > 0") and listed["train.max_steps"].default == "20000"
    assert listed["model.generator.arch"].type.startswith("deeplabv3 | deeplabv3plus")
    # a default held by the enclosing section's default, not the class's own
    assert listed["data.folder.train.images"].default == "train/images"
    assert listed["optim.generator.name"].default == "sgd"
    assert listed["target_data"].type == "section like data, or null" and listed["target_data"].default == "null"


def test_each_key_shows_its_description_and_a_missing_one_is_left_blank():
    from pydantic import Field

    from segadv.config.schema import Section

    class Inner(Section):
        described: int = Field(3, gt=0, description="a count of things")
        bare: str = "x"

    class Outer(Section):
        inner: Inner = Inner()

    text = key_listing(model=Outer)
    assert "inner.described: int > 0 = 3\n    a count of things\n" in text
    assert "inner.bare: str = x\n" in text and text.endswith("inner.bare: str = x\n")


def test_a_prefix_selects_a_section_or_one_key_and_an_unknown_one_names_the_sections(capsys):
    text = key_listing("optim.generator")
    assert "optim.generator.lr:" in text and "optim.discriminator." not in text
    heads = [line for line in key_listing("train.max_steps").splitlines() if not line.startswith(" ")][1:]
    assert len(heads) == 1 and heads[0].startswith("train.max_steps: int > 0") and heads[0].endswith(" = 20000")
    with pytest.raises(SystemExit) as exited:
        train_cli.main(["--help-config", "trian"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--help-config trian: no config key or section of that name" in err and "train" in err


def test_print_config_is_the_resolved_config_and_starts_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = train_cli.main(["--config", "semi", "train.max_steps=7", "--device-map", "cpu", "--run-dir", "R",
                           "--print-config"])
    assert code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    expected = load_config("semi", ["train.max_steps=7"])
    expected.device_map, expected.run_dir = "cpu", "R"
    assert printed == config_to_dict(expected)
    assert list(tmp_path.iterdir()) == []  # no run dir, no file
    assert train_cli.main(["--print-config", "train.max_stepz=7"]) == 2
    assert "train.max_stepz" in capsys.readouterr().err


def test_help_print_config_and_help_config_import_no_torch():
    """They answer at once: torch (seconds to import) loads only when a run starts."""
    code = ("import sys; from segadv.cli import train as train_cli\n"
            "for argv in (['--help'], ['--help-config', 'train'], ['--print-config'], ['--list-configs']):\n"
            "    try:\n        train_cli.main(argv)\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False")


def test_every_type_reads_as_values_not_python_reprs():
    """A constrained item type (optim.*.betas: each in [0, 1)) is written with its bounds, never as
    typing's repr of an Annotated type."""
    from segadv.config.keys import key_listing

    listing = key_listing("")
    assert not re.search(r"Annotated|FieldInfo|typing\.|<class", listing)
    assert "optim.generator.betas: list of (float >= 0, < 1) length >= 2, length <= 2" in listing


@pytest.mark.parametrize("key, like", [("target_data.batch_size", "data.batch_size"),
                                       ("model.discriminator_aux.ndf", "model.discriminator.ndf"),
                                       ("init.discriminator.path", "init.generator.path"),
                                       ("optim.discriminator_aux.lr", "optim.discriminator.lr")])
def test_a_key_inside_a_section_like_another_is_listed_as_that_one_is(key, like):
    heads = [line for line in key_listing(key).splitlines()[1:] if not line.startswith(" ")]
    assert len(heads) == 1 and heads[0].startswith(f"{key}: ")
    like_head = next(line for line in key_listing(like).splitlines() if line.startswith(f"{like}: "))
    assert heads[0].split(": ", 1)[1].split(" = ")[0] == like_head.split(": ", 1)[1].split(" = ")[0]  # its type
    assert "target_data.kind: " in key_listing("target_data")  # the section named: its keys listed too
    with pytest.raises(Exception, match="no config key"):
        key_listing("target_data.no_such_key")
