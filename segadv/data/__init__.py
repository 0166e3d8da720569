"""Data: dataset kinds (synthetic, folder, voc, cityscapes, gta5), config-driven augmentations
and loaders. docs/datasets.md documents each layout."""

from segadv.data.augment import build_transform
from segadv.data.files import SampleError
from segadv.data.bundle import DataBundle, build_data, build_datasets, pool_has_masks
from segadv.data.config_checks import check_config, class_names
from segadv.data.loaders import build_dataloaders, build_stream_loaders, build_val_loader
from segadv.data.streams import StreamSpec
from segadv.data.synthetic import SHAPE_CLASSES, SyntheticShapes

__all__ = [
    "SHAPE_CLASSES",
    "DataBundle",
    "SampleError",
    "StreamSpec",
    "SyntheticShapes",
    "build_transform",
    "build_data",
    "build_datasets",
    "build_dataloaders",
    "build_stream_loaders",
    "build_val_loader",
    "check_config",
    "class_names",
    "pool_has_masks",
]
