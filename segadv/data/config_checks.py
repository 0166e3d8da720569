"""Cross-field checks of a ``DataConfig`` the schema cannot express, and what follows from them
alone (class names, the dataset root), each error naming the key at fault."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from segadv.config.schema import DataConfig
from segadv.data.layouts import FIXED_CLASSES, folder_class_names, require_dir
from segadv.data.synthetic import domain_classes
from segadv.errors import UserError

__all__ = ["check_config", "check_test_split", "class_names", "data_root", "training_side"]


def check_config(cfg: DataConfig) -> None:
    """Cross-field checks the schema cannot express, each naming the key at fault."""
    kind = cfg.kind
    shapes = domain_classes(cfg.synthetic.domain)
    if kind == "synthetic" and cfg.num_classes > len(shapes):
        raise UserError(
            f"data.num_classes: synthetic shapes ({cfg.synthetic.domain} domain) have at most {len(shapes)} "
            f"classes ({', '.join(shapes)}), got {cfg.num_classes}"
        )
    if kind in FIXED_CLASSES and cfg.num_classes != len(FIXED_CLASSES[kind]):
        raise UserError(
            f"data.num_classes: data.kind={kind} has {len(FIXED_CLASSES[kind])} classes; set "
            f"data.num_classes={len(FIXED_CLASSES[kind])} (got {cfg.num_classes})"
        )
    names = cfg.folder.class_names
    if kind == "folder" and names is not None and len(names) != cfg.num_classes:
        raise UserError(
            f"data.folder.class_names: {len(names)} names for data.num_classes={cfg.num_classes}"
        )
    if 0 <= cfg.ignore_index < cfg.num_classes:
        raise UserError(
            f"data.ignore_index: {cfg.ignore_index} is a real class id "
            f"(classes are 0..{cfg.num_classes - 1}); use e.g. 255"
        )
    if kind != "synthetic" and not cfg.num_classes <= cfg.ignore_index <= 255:
        raise UserError(
            f"data.ignore_index: masks on disk are 8-bit, so it must be in "
            f"{cfg.num_classes}..255 for data.kind={kind}, got {cfg.ignore_index}"
        )
    check_test_split(cfg)


def check_test_split(cfg: DataConfig) -> None:
    """``data.test`` names a split that can be scored and is not the training data."""
    if cfg.test is None:
        return
    if cfg.kind == "synthetic" and cfg.test == "train":
        raise UserError("data.test: train is the synthetic kind's training split (a generated split is a function of "
                        "its name): name another, e.g. data.test=test")
    # Upstream keeps its test labels private (scored on its server): gtFine/test holds only the ego
    # vehicle, the rectification border and the region out of interest, all of them ignored.
    if cfg.kind == "cityscapes" and cfg.test == "test":
        raise UserError("data.test: Cityscapes withholds the labels of its test split (gtFine/test marks no pixel as one "
                        "of the 19 classes; its scores come from the benchmark server at cityscapes-dataset.com): name "
                        "a split with labels, or leave data.test null")


def class_names(cfg: DataConfig) -> list[str]:
    """The class names for ``cfg``, index = class id."""
    check_config(cfg)
    if cfg.kind == "synthetic":
        return list(domain_classes(cfg.synthetic.domain)[: cfg.num_classes])
    if cfg.kind == "folder":
        return list(folder_class_names(cfg))
    return list(FIXED_CLASSES[cfg.kind])


def data_root(cfg: DataConfig) -> Path:
    if cfg.root is None:
        raise UserError(
            f"data.root: required for data.kind={cfg.kind} (the dataset directory; "
            "see docs/datasets.md)"
        )
    root = Path(cfg.root).expanduser()
    require_dir(root, "data.root")
    return root


def training_shape(cfg: DataConfig, key: str = "data") -> Optional[tuple[int, int, str]]:
    """The height and width of the training images as the networks get them, and where they come
    from, when the config alone says: the last pipeline step with an integer ``height`` and
    ``width`` (RandomCrop, Resize, ...), else the synthetic image size. None: images keep their own
    sizes."""
    for step in reversed(cfg.train_transforms):
        h, w = step.get("height"), step.get("width")
        if isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0:
            return h, w, f"{key}.train_transforms' {step.get('name')} to {h}x{w}"
    if cfg.kind == "synthetic":
        size = cfg.synthetic.image_size
        return size, size, f"{key}.synthetic.image_size={size}"
    return None


def training_side(cfg: DataConfig, key: str = "data") -> Optional[tuple[int, str]]:
    """The smallest side of :func:`training_shape`, and where it comes from."""
    shape = training_shape(cfg, key)
    return None if shape is None else (min(shape[:2]), shape[2])


def input_shapes(cfg: DataConfig, key: str = "data") -> list[tuple[int, int, str]]:
    """The input sizes G is given that the config fixes: the training crop and the evaluation resize
    (``val_input_size``, width then height), each with the key it comes from."""
    shapes = [shape for shape in [training_shape(cfg, key)] if shape is not None]
    if cfg.val_input_size is not None:
        width, height = cfg.val_input_size
        shapes.append((height, width, f"{key}.val_input_size={list(cfg.val_input_size)}"))
    return shapes
