"""A config that did not come from a YAML file (one stored in a checkpoint) meets the YAML loader's
caps, and ``--print-config`` changes nothing on disk (docs/failures.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES
from segadv.config import config_from_dict, config_to_dict, load_config
from segadv.config.resume import check_resumed_config
from segadv.errors import UserError


def nested(depth: int) -> dict:
    root = current = {}
    for _ in range(depth):
        current["a"] = {}
        current = current["a"]
    return root


def itself() -> dict:
    loop: list = []
    loop.append(loop)
    return {"data": {"mean": loop}}


def fan_out() -> dict:
    wide: list = [0] * 10
    for _ in range(8):
        wide = [wide] * 10  # 10**9 values in 90 list slots
    return {"data": {"mean": wide}}


@pytest.mark.parametrize("data, cap", [
    (nested(3000), "values nested deeper than 64 levels (the cap on a config's depth)"),
    (itself(), "values nested deeper than 64 levels"),
    (fan_out(), "more than 100000 values (the cap on a config's values"),
])
def test_a_stored_config_over_a_cap_is_a_user_error_never_a_recursion_error(data, cap):
    with pytest.raises(UserError, match=r"^invalid config \(the config stored in c\.pt\): it holds ") as raised:
        config_from_dict(data, source="the config stored in c.pt")
    assert cap in str(raised.value)
    with pytest.raises(UserError, match=r"^the config stored in c\.pt is refused: it holds ") as raised:
        check_resumed_config(data, config_to_dict(load_config(None, [])), Path("c.pt"))
    assert cap in str(raised.value)


def test_a_config_within_the_caps_still_loads():
    cfg = load_config(None, TINY_OVERRIDES)
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_print_config_with_resume_auto_changes_nothing_on_disk(tmp_path, capsys):
    from segadv.cli import train as train_cli

    run_dir = tmp_path / "run"
    assert train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES, "log.tensorboard=false",
                           "train.max_steps=1", "checkpoint.every=1"]) == 0
    (run_dir / "config.yaml").write_bytes(b"\xff\xfe garbled \x00")
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert train_cli.main(["--run-dir", str(run_dir), "--resume", "auto", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "max_steps: 1" in printed  # the config stored in the checkpoint
    assert {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
