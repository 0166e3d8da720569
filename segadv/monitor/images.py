"""Image panels for TensorBoard: input, ground truth and prediction side by side."""

from __future__ import annotations

import numpy as np
import torch
from torchvision.utils import make_grid

IGNORE_COLOUR = (255, 255, 255)


def colorize(mask: torch.Tensor, palette: np.ndarray) -> torch.Tensor:
    """(H,W) class ids -> (3,H,W) uint8 in the palette; ids outside it (ignore) are white."""
    table = torch.tensor(np.asarray(palette, dtype=np.uint8))
    ids = mask.long()
    inside = (ids >= 0) & (ids < len(table))
    rgb = torch.tensor(IGNORE_COLOUR, dtype=torch.uint8).expand(*ids.shape, 3).clone()
    rgb[inside] = table[ids[inside]]
    return rgb.permute(2, 0, 1)


def denormalize(image: torch.Tensor, mean: list[float], std: list[float]) -> torch.Tensor:
    """(3,H,W) normalised float -> (3,H,W) uint8."""
    m = torch.tensor(mean).view(-1, 1, 1)
    s = torch.tensor(std).view(-1, 1, 1)
    return ((image.float() * s + m) * 255).clamp(0, 255).to(torch.uint8)


def segmentation_panel(
    images: torch.Tensor,
    labels: torch.Tensor,
    preds: torch.Tensor,
    palette: np.ndarray,
    mean: list[float],
    std: list[float],
) -> torch.Tensor:
    """One row per sample: input | ground truth | prediction, as a (3,H,W) uint8 grid."""
    tiles = []
    for image, label, pred in zip(images, labels, preds):
        tiles += [denormalize(image, mean, std), colorize(label, palette), colorize(pred, palette)]
    return make_grid(torch.stack(tiles), nrow=3, padding=2, pad_value=128)


def confidence_panel(maps, palette: np.ndarray, mean: list[float], std: list[float]) -> torch.Tensor:
    """One row per sample: input | G's prediction | D's confidence (grey, white = 1) | pseudo
    labels (``PanelMaps``; pixels below the confidence threshold white), as a (3,H,W) uint8 grid."""
    tiles = []
    for image, pred, conf, pseudo in zip(maps.images, maps.preds, maps.confidence, maps.pseudo_labels):
        grey = (conf.float().clamp(0, 1) * 255).to(torch.uint8).expand(3, *conf.shape)
        tiles += [denormalize(image, mean, std), colorize(pred, palette), grey, colorize(pseudo, palette)]
    return make_grid(torch.stack(tiles), nrow=4, padding=2, pad_value=128)
