"""Optional dependencies of the export extra (``pip install -e ".[export]"``), imported on use."""

from __future__ import annotations

import importlib
from types import ModuleType

from segadv.errors import UserError

EXTRA_HINT = "install the export extra: pip install -e '.[export]' (make install does)"


def import_extra(name: str, purpose: str) -> ModuleType:
    """``import name``, or a UserError saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise UserError(f"{purpose} needs the {name!r} package ({err}); {EXTRA_HINT}") from None
