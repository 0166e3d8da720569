"""The colour map of class ids: what training's image panels, segadv-predict's masks and an
export's metadata colour each class with. numpy only, so predict's torch-free path uses it too."""

from __future__ import annotations

import numpy as np


def palette(num_classes: int) -> np.ndarray:
    """A fixed ``(num_classes, 3)`` uint8 colour map for visualising masks; class 0 is black.

    This is the PASCAL VOC bit-interleaving colour map, so colours are distinct, stable across
    runs and familiar to anyone who has looked at segmentation masks before.
    """
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    colours = np.zeros((num_classes, 3), dtype=np.uint8)
    for cls in range(num_classes):
        label, r, g, b = cls, 0, 0, 0
        for shift in range(7, -1, -1):
            r |= ((label >> 0) & 1) << shift
            g |= ((label >> 1) & 1) << shift
            b |= ((label >> 2) & 1) << shift
            label >>= 3
        colours[cls] = (r, g, b)
    return colours
