"""The YAML reader's limits and the one-line errors of schema checks (segadv/config/loading.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from segadv.config import load_config
from segadv.config.loading import MAX_CONFIG_BYTES
from segadv.errors import UserError
from segadv.cli.train import main as train_main

# 9 levels of 9 aliases: about 400 bytes standing for 9**9 (387 million) strings.
ALIAS_BOMB = "a: &a [" + ",".join(["lol"] * 9) + "]\n" + "".join(
    f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def test_an_alias_bomb_is_refused_quickly_naming_the_file(tmp_path, capsys):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 600
    started = time.perf_counter()
    assert train_main(["--config", str(bomb), "--run-dir", str(tmp_path / "run")]) == 2
    assert time.perf_counter() - started < 30  # unbounded expansion takes minutes and gigabytes
    err = capsys.readouterr().err
    assert "bomb.yaml" in err and "aliases expand to more than" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_an_alias_bomb_in_an_override_is_refused():
    with pytest.raises(UserError, match="aliases expand"):
        load_config(None, ["data.train_transforms=" + "[" + ALIAS_BOMB.replace("\n", ", ") + "]"])


def test_recursive_alias_and_oversized_file(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.write_text("x: &x [*x]\n")
    with pytest.raises(UserError, match="loop.yaml.*recursive"):
        load_config(loop)
    deep = tmp_path / "deep.yaml"
    deep.write_text("x: " + "[" * 2000 + "]" * 2000 + "\n")  # deeper than the parser's own recursion
    with pytest.raises(UserError, match="deep.yaml.*nested deeper than"):
        load_config(deep)
    deep.write_text("x: " + "[" * 100 + "]" * 100 + "\n")
    with pytest.raises(UserError, match="deep.yaml.*nested deeper than 64 levels"):
        load_config(deep)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(UserError, match="big.yaml is larger than 1 MiB"):
        load_config(big)


def test_ordinary_aliases_still_work(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("optim:\n  generator: &opt {name: adam, lr: 0.001}\n  discriminator: *opt\n")
    cfg = load_config(path)
    assert cfg.optim.discriminator.name == "adam" and cfg.optim.discriminator.lr == 0.001


@pytest.mark.parametrize("override, message", [
    ("data.num_classes=1000", "data.num_classes: masks are 8-bit, so at most 255 classes"),
    ("optim.discriminator.betas=[0.9]", "optim.discriminator.betas: must have at least 2 items, got list [0.9]"),
    ("optim.discriminator.betas=[1.5, 0.9]", "optim.discriminator.betas[0]: must be less than 1"),
    ("model.generator.encoder_depth=2", "model.generator.encoder_depth: deeplabv3plus needs an encoder depth of 3..5"),
    ("model.generator.decoder_atrous_rates=[]", "model.generator.decoder_atrous_rates: deeplabv3plus's ASPP takes 3"),
    ("optim.generator.lr=.nan", "optim.generator.lr: must be a finite number"),
])
def test_schema_refusals_read_as_one_line_naming_the_key(override, message):
    with pytest.raises(UserError) as err:
        load_config(None, [override])
    assert message in str(err.value)
    assert "255 is a real class id" not in str(err.value)


# ---------------------------------------------------------------- each cap names the cap hit


def test_plain_values_over_the_cap_are_not_called_aliases(tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text("x: [" + ",".join(["1"] * 100_001) + "]\n")
    with pytest.raises(UserError, match=r"plain.yaml is refused: it holds more than 100000 values "
                                        r"\(the cap on a config's values") as raised:
        load_config(plain)
    assert "alias" not in str(raised.value)


def test_a_long_base_chain_and_a_base_fan_out_hit_the_base_cap_quickly(tmp_path):
    for i in range(1500):
        (tmp_path / f"c{i}.yaml").write_text(f"_base_: c{i + 1}.yaml\n" if i < 1499 else "{}\n")
    with pytest.raises(UserError, match=r"c0.yaml: its _base_ files come to more than 64 \(the cap on a "
                                        r"config's _base_ files") as raised:
        load_config(tmp_path / "c0.yaml")
    assert "nested" not in str(raised.value)
    for depth in range(12):  # each file names the next one 8 times: 8**11 reads unbounded
        (tmp_path / f"f{depth}.yaml").write_text(
            "_base_: [" + ", ".join([f"f{depth + 1}.yaml"] * 8) + "]\n" if depth < 11 else "{}\n")
    started = time.perf_counter()
    with pytest.raises(UserError, match="the cap on a config's _base_ files"):
        load_config(tmp_path / "f0.yaml")
    assert time.perf_counter() - started < 10


def test_deep_nesting_is_a_user_error_never_a_recursion_error(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("x: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n")
    with pytest.raises(UserError, match=r"deep.yaml is refused: values nested deeper than 64 levels \(the cap on a "
                                        r"config's depth\)"):
        load_config(deep)
    key = ".".join(["a"] * 5000)
    with pytest.raises(UserError, match=r"a key of 5000 dotted parts is nested deeper than 64 levels \(the cap on "
                                        r"a config's depth\)"):
        load_config(None, [f"{key}=1"])
    assert train_main(["--print-config", f"{key}=1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err) < 400


def test_a_config_that_is_not_a_regular_file_or_not_utf8_is_refused(tmp_path, capsys):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    started = time.perf_counter()
    assert train_main(["--print-config", "--config", str(fifo)]) == 2  # reading it would wait for a writer
    assert time.perf_counter() - started < 30
    assert "fifo.yaml is a FIFO (named pipe), not a file" in capsys.readouterr().err
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"train:\n  max_steps: \xff\n")
    with pytest.raises(UserError, match=r"bin.yaml is not UTF-8 text: byte 20 is 0xff"):
        load_config(binary)
    (tmp_path / "loop.yaml").symlink_to(tmp_path / "loop2.yaml")
    (tmp_path / "loop2.yaml").symlink_to(tmp_path / "loop.yaml")
    with pytest.raises(UserError, match=r"loop.yaml cannot be read: Too many levels of symbolic links \(ELOOP\)"):
        load_config(tmp_path / "loop.yaml")


def test_a_union_key_is_named_once_with_every_value_it_takes(capsys):
    assert train_main(["amp.teacher.enabled=maybe", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "amp.teacher.enabled: expected bool (true/false) or 'auto', got str 'maybe'" in err
    assert "enabled.bool" not in err and "literal[" not in err and err.count("amp.teacher.enabled") == 1


def test_thousands_of_unknown_keys_are_listed_as_the_first_twenty_and_a_count(tmp_path, capsys):
    config = tmp_path / "many.yaml"
    config.write_text("train:\n" + "".join(f"  k{i}: 1\n" for i in range(5000)))
    assert train_main(["--config", str(config), "--print-config"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 22 and lines[-1] == "  ... and 4980 more"
    assert all(": unknown key" in line for line in lines[1:-1])
