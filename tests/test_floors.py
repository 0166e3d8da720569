"""The floors: constraints/oldest.txt is the one place they are written, pyproject.toml's ">="
floors equal it, and the venv `make test-oldest` runs in really holds them (docs/dependencies.md)."""

import os
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints" / "oldest.txt"


def pinned() -> dict[str, Version]:
    """{package: version} of the constraints file's ``name==version`` lines."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([\w.]+)", line)
            assert match, f"{CONSTRAINTS.name}: not a name==version line: {line!r}"
            pins[canonicalize_name(match.group(1))] = Version(match.group(2))
    return pins


def declared() -> dict[str, Version]:
    """{package: floor} of pyproject.toml's dependencies and every extra; each must be ``>=`` alone."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for spec in [*project["dependencies"], *(s for extra in project["optional-dependencies"].values() for s in extra)]:
        req = Requirement(spec)
        specifiers = list(req.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == ">=", f"pyproject.toml: {spec!r} is not one >= floor"
        floors[canonicalize_name(req.name)] = Version(specifiers[0].version)
    return floors


def test_pyproject_floors_equal_the_constraints_file():
    assert declared() == pinned()


def test_the_floors_install_on_the_oldest_python_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    makefile = (ROOT / "Makefile").read_text()
    oldest = re.fullmatch(r">=(\d+\.\d+)", project["requires-python"]).group(1)
    assert f"python{oldest}" in makefile  # make test-oldest builds its venv with that Python


@pytest.mark.skipif("SEGADV_FLOORS" not in os.environ, reason="set by make test-oldest")
def test_this_venv_holds_the_floors():
    """In `make test-oldest`'s venv every pinned package is installed at its floor (a pip that
    quietly took another release would make the run test something else)."""
    installed = {name: Version(metadata.version(name)) for name in pinned()}
    assert {name: version.base_version for name, version in installed.items()} == \
        {name: version.base_version for name, version in pinned().items()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" == project["requires-python"].removeprefix(">=")
