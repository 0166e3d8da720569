"""Data: dataset kinds (synthetic, folder, voc, cityscapes, gta5), config-driven augmentations
and loaders. README "Datasets" documents each layout."""

from segadv.data.augment import build_transform
from segadv.data.files import SampleError
from segadv.data.loaders import (
    DataBundle,
    build_data,
    build_dataloaders,
    build_datasets,
    build_stream_loaders,
    build_val_loader,
    check_config,
    class_names,
)
from segadv.data.synthetic import SHAPE_CLASSES, SyntheticShapes, palette

__all__ = [
    "SHAPE_CLASSES",
    "DataBundle",
    "SampleError",
    "SyntheticShapes",
    "build_transform",
    "build_data",
    "build_datasets",
    "build_dataloaders",
    "build_stream_loaders",
    "build_val_loader",
    "check_config",
    "class_names",
    "palette",
]
