"""The configs shipped with segadv: where they are, their names, and references to them by name.

pyproject maps the package ``segadv.configs`` onto the top-level ``configs/`` directory: a wheel
carries the YAML files as ``segadv/configs/`` and an editable install points the package at the
checkout's ``configs/``, both found here through :mod:`importlib.resources`. A source checkout used
through PYTHONPATH installs nothing, so there ``segadv.configs`` does not import and the
checkout's ``configs/`` beside ``segadv/`` is used. ``configs/experiments/`` holds the grids of
``segadv-experiment`` (segadv/experiment/) and ships too.

Wherever a config file is expected (``--config``, ``_base_``, a grid row's ``config``) a shipped
config may be named instead: ``semi`` is ``configs/semi.yaml``. A reference that is an existing file
is that file; one without a directory or a ``.yaml``/``.yml`` suffix is otherwise a name.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import Optional, Union

from segadv.errors import UserError

PathLike = Union[str, "os.PathLike[str]"]

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the imported segadv/


def _configs_dir() -> Path:
    """``segadv.configs``' directory, or the checkout's ``configs/`` when it is not this segadv's.

    Besides the PYTHONPATH checkout (no such package), that covers segadv imported from one
    checkout through PYTHONPATH while another checkout is installed editable: its finder would
    answer ``segadv.configs`` with the other checkout's files.
    """
    checkout = _PACKAGE_DIR.parent / "configs"
    try:
        found = Path(str(importlib.resources.files("segadv.configs"))).resolve()
    except ModuleNotFoundError:
        return checkout
    return found if found in (_PACKAGE_DIR / "configs", checkout) else checkout


CONFIGS_DIR: Path = _configs_dir()
EXPERIMENTS_DIR: Path = CONFIGS_DIR / "experiments"
DEFAULT_CONFIG_PATH: Path = CONFIGS_DIR / "default.yaml"


def config_names(folder: Path = CONFIGS_DIR) -> list[str]:
    """The names of the configs shipped in ``folder`` (default: the training configs), sorted."""
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _is_name(ref: str) -> bool:
    """``semi`` may name a shipped config; ``configs/semi.yaml``, ``semi.yaml`` or ``./semi`` may not."""
    return bool(ref) and "/" not in ref and os.sep not in ref and Path(ref).suffix.lower() not in (".yaml", ".yml")


def resolve_config(ref: PathLike, relative_to: Optional[Path] = None, folder: Path = CONFIGS_DIR,
                   what: str = "config") -> Path:
    """The file a config reference means: an existing file (a relative path taken from
    ``relative_to``, default the cwd), else the shipped config of that name in ``folder``.

    A path-like reference to a missing file comes back as it is (reading it reports it); an unknown
    name raises a UserError listing the shipped names.
    """
    text = os.fspath(ref)
    path = Path(text).expanduser()
    if relative_to is not None:
        path = relative_to / path
    if path.is_file() or not _is_name(text):
        return Path(os.path.realpath(path))  # never raises: a link loop is the reader's to name
    shipped = folder / f"{text}.yaml"
    if shipped.is_file():
        return shipped
    raise UserError(f"unknown {what} {text!r}: no such file, nor a shipped {what} of that name; "
                    f"shipped: {', '.join(config_names(folder))}")


def shipped_hint(path: Path, folder: Path = CONFIGS_DIR) -> str:
    """For a config file that is missing: "; ..." naming the shipped config of its name, which
    works from any directory (a clone's ``configs/voc.yaml`` is ``voc`` after a wheel install),
    or ""."""
    if path.suffix.lower() in (".yaml", ".yml") and (folder / f"{path.stem}.yaml").is_file():
        return f"; the shipped config of that name works from any directory: --config {path.stem} (or _base_: {path.stem})"
    return ""


def _summary(path: Path) -> str:
    """The first sentence of the file's header comment (its title), without a closing colon."""
    text = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        words = line.lstrip("#").strip()
        if not line.startswith("#") or (text and not words):
            break
        text = f"{text} {words}".strip()
        if ". " in text or text.endswith((".", ":")):
            break
    first, stop, _ = text.partition(". ")
    return (first + "." if stop else first).rstrip(":")


def config_listing(folder: Path = CONFIGS_DIR) -> str:
    """One line per shipped config: its name, then its title."""
    names = config_names(folder)
    width = max(map(len, names), default=0)
    return "".join(f"{name:<{width}}  {_summary(folder / f'{name}.yaml')}\n" for name in names)
