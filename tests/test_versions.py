"""segadv/versions.py: a feature that needs a newer torch than the floor exits 2 naming itself and
the release it needs; on the floor everything else is untouched."""

import pytest
import torch

from conftest import TINY_OVERRIDES
from segadv.training.build import build_training
from segadv.config import load_config
from segadv.errors import UserError
from segadv.parallel import parse_device_map
from segadv.versions import TORCH_NEEDED, require_torch, torch_version

COMPILED_CHECKPOINTING = "compile.generator=true with model.generator.activation_checkpointing=true"


def test_torch_versions_are_read_as_major_minor():
    assert torch_version("2.10.0") == (2, 10)
    assert torch_version("2.5.1+cu124") == (2, 5)
    assert torch_version("2.11.0a0+git1234") == (2, 11)


def test_a_feature_on_an_older_torch_is_refused_naming_the_release_it_needs(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    with pytest.raises(UserError, match=r"segadv-plan needs torch 2\.10 or newer \(.*\); this is torch 2\.5\.1\+cu124: "
                                        r"do something else"):
        require_torch("segadv-plan", "do something else")
    monkeypatch.setattr(torch, "__version__", "2.10.0")
    require_torch("segadv-plan", "")


@pytest.mark.parametrize("checkpointing", [True, False])
def test_compiled_activation_checkpointing_is_refused_on_a_torch_that_recomputes_it_wrongly(monkeypatch, checkpointing):
    """Refused before anything is built; compile alone, or checkpointing alone, still runs."""
    (major, minor), _ = TORCH_NEEDED[COMPILED_CHECKPOINTING]
    monkeypatch.setattr(torch, "__version__", f"{major}.{minor - 1}.0")
    cfg = load_config(None, [*TINY_OVERRIDES, "compile.generator=true", "compile.backend=aot_eager",
                             f"model.generator.activation_checkpointing={str(checkpointing).lower()}"])
    if checkpointing:
        with pytest.raises(UserError, match=rf"{COMPILED_CHECKPOINTING} needs torch {major}\.{minor} or newer .*"
                                            r"upgrade torch, or set one of the two to false"):
            build_training(cfg, parse_device_map("cpu"))
    else:
        build_training(cfg, parse_device_map("cpu"))
