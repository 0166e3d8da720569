"""Data: dataset kinds (synthetic, folder, voc, cityscapes, gta5), config-driven augmentations
and loaders. docs/datasets.md documents each layout."""

import importlib
import importlib.util
from typing import Any

# Each name from its module on first use (PEP 562): the loaders and datasets import torch, and
# segadv-data's --help (segadv/cli/data.py reads segadv/data/check.py) answers without it.
_HOMES = {
    "build_transform": "augment",
    "SampleError": "files",
    "DataBundle": "bundle", "build_data": "bundle", "build_datasets": "bundle", "build_pools": "bundle",
    "pool_has_masks": "bundle",
    "Catalog": "catalog",
    "check_config": "config_checks", "class_names": "config_checks",
    "build_dataloaders": "loaders", "build_run_loaders": "loaders", "build_stream_loaders": "loaders",
    "build_val_loader": "loaders",
    "StreamSpec": "streams",
    "SHAPE_CLASSES": "synthetic", "SyntheticShapes": "synthetic",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule: segadv.data.loaders
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # once
    return value


__all__ = [
    "SHAPE_CLASSES",
    "Catalog",
    "DataBundle",
    "SampleError",
    "StreamSpec",
    "SyntheticShapes",
    "build_transform",
    "build_data",
    "build_datasets",
    "build_dataloaders",
    "build_pools",
    "build_run_loaders",
    "build_stream_loaders",
    "build_val_loader",
    "check_config",
    "class_names",
    "pool_has_masks",
]
