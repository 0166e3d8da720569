"""Every shipped config resolves to the values it resolved to when these fixtures were written
(``segadv-train --config NAME --print-config``, stored under fixtures/print_config/): a change of
the schema's layout (where a key's section comes from, how defaults are filled) must not change a
shipped experiment. Regenerate a fixture only for a change of value that is meant, and say so in the
commit."""

from pathlib import Path

import pytest
import yaml

from segadv.cli.train import main
from segadv.config.shipped import config_names

FIXTURES = Path(__file__).parent / "fixtures" / "print_config"


def test_every_shipped_config_has_a_fixture():
    assert sorted(p.stem for p in FIXTURES.glob("*.yaml")) == config_names()


@pytest.mark.parametrize("name", config_names())
def test_print_config_resolves_as_before(name, capsys):
    assert main(["--config", name, "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())
