"""Every ``segadv/...`` path the docs, the README, the code's messages and comments, the tools and
the configs name exists: a module that moves takes every mention of it along.

A path is matched as written (``segadv/training/loop.py``, ``segadv/cli/``); a dotted module name
in a message (``segadv.cli.train``) is checked too, as the module or package it names.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATH = re.compile(r"(?<![\w./-])segadv/(?:[A-Za-z_][\w]*/)*[A-Za-z_][\w]*(?:\.py)?/?")
MODULE = re.compile(r"(?<![\w./-])segadv(?:\.[a-z_][a-z0-9_]*)+")
# Names that are not modules: the configs and docs shipped as package data (segadv.configs,
# segadv/docs/), the package's attributes, the export's metadata file (segadv.json), loggers of
# tools and tests (segadv.bench) and TensorBoard tags (segadv/ms_per_step).
NOT_MODULES = re.compile(r"^segadv\.(configs|docs|json|bench|test|__\w+__)(\.|$)")
NOT_PATHS = re.compile(r"^segadv/(configs|docs|ms_per_step)(/|$)")


def texts() -> dict[Path, str]:
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("segadv", "tools", "configs", "tests"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".yaml", ".md", ".sh"})
    return {path: path.read_text() for path in files if path.is_file() and path.name != Path(__file__).name}


def exists(path: str) -> bool:
    target = ROOT / path.rstrip("/")
    if target.exists():
        return True
    # A module named without its suffix in prose ("segadv/cli/train"), or a folder named as a module.
    return target.with_suffix(".py").exists()


def module_exists(name: str) -> bool:
    """Walk the name down the package: each step below a package is one of its modules or
    subpackages, or a name its ``__init__.py`` defines; the walk ends at a module (what follows is
    an attribute or a logger's child)."""
    here = ROOT / "segadv"
    for part in name.split(".")[1:]:
        if (here / part / "__init__.py").exists():
            here = here / part
        elif (here / f"{part}.py").exists():
            return True
        else:
            return re.search(rf"\b{part}\b", (here / "__init__.py").read_text()) is not None
    return True


def test_every_segadv_path_named_exists():
    missing = sorted({f"{path.relative_to(ROOT)}: {name}"
                      for path, text in texts().items()
                      for name in PATH.findall(text) if not NOT_PATHS.match(name) and not exists(name)})
    assert missing == []


def test_every_dotted_segadv_module_named_exists():
    missing = sorted({f"{path.relative_to(ROOT)}: {name}"
                      for path, text in texts().items()
                      for name in MODULE.findall(text)
                      if not NOT_MODULES.match(name) and not module_exists(name)})
    assert missing == []


def test_the_check_finds_a_missing_path(tmp_path):
    assert PATH.findall("see segadv/nowhere/gone.py and segadv/cli/") == ["segadv/nowhere/gone.py", "segadv/cli/"]
    assert not exists("segadv/nowhere/gone.py")
    assert not module_exists("segadv.nowhere.gone")
