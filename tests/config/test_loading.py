"""The YAML reader's limits and the one-line errors of schema checks (segadv/config/loading.py)."""

from __future__ import annotations

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
