"""Data: the synthetic shapes dataset, config-driven augmentations and loaders."""

from segadv.data.augment import build_transform
from segadv.data.loaders import build_dataloaders, build_datasets, class_names
from segadv.data.synthetic import SHAPE_CLASSES, SyntheticShapes, palette

__all__ = [
    "SHAPE_CLASSES",
    "SyntheticShapes",
    "build_transform",
    "build_datasets",
    "build_dataloaders",
    "class_names",
    "palette",
]
