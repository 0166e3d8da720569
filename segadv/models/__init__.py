"""Network definitions: pure ``nn.Module`` builders, no device or wrapper code. One folder per
generator arch (``deeplab/``, ``dinov2/``, ``dinov3/``), its row in ``registry.py``; what the ViT archs
share in ``vit/``; what every G offers in ``base.py``; the discriminators in ``discriminator.py``.

torch-free to import: the arch table and the arch folders' config sections are read by the config,
which loads without torch; the builders below are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"DISCRIMINATORS": "discriminator", "FCDiscriminator": "discriminator", "ImageDiscriminator": "discriminator",
         "build_discriminator": "discriminator", "build_generator": "generator",
         "build_generator_for_weights": "generator"}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
