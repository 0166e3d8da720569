"""Image panels for TensorBoard: input, ground truth and prediction side by side (a method's own
panels and its last training batch likewise), each column titled, with the classes' colours named
below (Pillow's ImageDraw and its built-in font)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torchvision.utils import make_grid

from segadv.config.normalization import Normalization

IGNORE_COLOUR = (255, 255, 255)
PADDING, PAD_VALUE = 2, 128
_BACKGROUND, _TEXT = (32, 32, 32), (235, 235, 235)
_LINE = 14  # px per line of Pillow's built-in font, with its gap
_SWATCH = 10
HEAT_LOW, HEAT_HIGH = (20, 30, 70), (250, 220, 60)  # a heat map's 0 and 1: readable on the dark background


def colorize(mask: torch.Tensor, palette: np.ndarray) -> torch.Tensor:
    """(H,W) class ids -> (3,H,W) uint8 in the palette; ids outside it (ignore) are white."""
    table = torch.tensor(np.asarray(palette, dtype=np.uint8))
    ids = mask.long()
    inside = (ids >= 0) & (ids < len(table))
    rgb = torch.tensor(IGNORE_COLOUR, dtype=torch.uint8).expand(*ids.shape, 3).clone()
    rgb[inside] = table[ids[inside]]
    return rgb.permute(2, 0, 1)


def denormalize(image: torch.Tensor, normalization: Normalization) -> torch.Tensor:
    """(3,H,W) G's input -> (3,H,W) uint8 RGB: ``normalization`` undone, a BGR input's channels
    put back in RGB order for display."""
    m = torch.tensor(normalization.mean).view(-1, 1, 1)
    s = torch.tensor(normalization.std).view(-1, 1, 1)
    pixels = ((image.float() * s + m) * 255).round().clamp(0, 255).to(torch.uint8)
    return pixels.flip(0) if normalization.bgr else pixels


def segmentation_panel(
    images: torch.Tensor,
    labels: torch.Tensor,
    preds: torch.Tensor,
    palette: np.ndarray,
    normalization: Normalization,
    class_names: Sequence[str] = (),
) -> torch.Tensor:
    """One row per sample: input | ground truth | prediction, as a (3,H,W) uint8 grid, titled,
    with a legend of ``class_names`` (and white for ignored pixels) below."""
    tiles = []
    for image, label, pred in zip(images, labels, preds):
        tiles += [denormalize(image, normalization), colorize(label, palette), colorize(pred, palette)]
    grid = make_grid(torch.stack(tiles), nrow=3, padding=PADDING, pad_value=PAD_VALUE)
    return annotate(grid, ["input", "ground truth", "prediction"], tiles[0].shape[-1],
                    legend(palette, class_names, ignore=True))


def confidence_panel(maps, palette: np.ndarray, normalization: Normalization,
                     class_names: Sequence[str] = ()) -> torch.Tensor:
    """One row per sample: input | G's prediction | D's confidence (grey, white = 1) | pseudo
    labels (``PanelMaps``; pixels below the confidence threshold white), as a (3,H,W) uint8 grid,
    titled, with the legend below."""
    tiles = []
    for image, pred, conf, pseudo in zip(maps.images, maps.preds, maps.confidence, maps.pseudo_labels):
        grey = (conf.float().clamp(0, 1) * 255).to(torch.uint8).expand(3, *conf.shape)
        tiles += [denormalize(image, normalization), colorize(pred, palette), grey, colorize(pseudo, palette)]
    grid = make_grid(torch.stack(tiles), nrow=4, padding=PADDING, pad_value=PAD_VALUE)
    return annotate(grid, ["input", "prediction", "D confidence", "pseudo labels"], tiles[0].shape[-1],
                    legend(palette, class_names, ignore=True, ignore_name="below threshold"))


def heat_map(values: torch.Tensor) -> torch.Tensor:
    """(H,W) values in [0, 1] -> (3,H,W) uint8 from dark blue (0) to bright yellow (1), the confusion
    matrix's scale: white stays free for ignored pixels."""
    share = values.float().clamp(0, 1)[None]
    low, high = (torch.tensor(c, dtype=torch.float32).view(3, 1, 1) for c in (HEAT_LOW, HEAT_HIGH))
    return (low + (high - low) * share).round().to(torch.uint8)


def heat_colour(share: float) -> tuple[int, int, int]:
    """The heat map's colour of one value in [0, 1]."""
    red, green, blue = (int(round(a + (b - a) * share)) for a, b in zip(HEAT_LOW, HEAT_HIGH))
    return red, green, blue


def training_views_panel(views, palette: np.ndarray, normalization: Normalization,
                         class_names: Sequence[str] = ()) -> torch.Tensor:
    """A method's last training batch (``TrainingViews``, on the CPU), one row per image: the input
    as G saw it | the labels its loss read (ignored pixels white) | each pixel's weight in the loss
    as a heat map (dark blue 0 to yellow 1; white where the label is ignored, which the loss skips
    whatever its weight), as a (3,H,W) uint8 grid, the columns titled ``views.titles``, with the
    classes' and the weight's legend below."""
    tiles = []
    for image, label, weight in zip(views.images, views.labels, views.weight):
        ids = label.long()
        heat = heat_map(weight)
        ignored = (ids < 0) | (ids >= len(palette))
        heat[:, ignored] = torch.tensor(IGNORE_COLOUR, dtype=torch.uint8)[:, None]
        tiles += [denormalize(image, normalization), colorize(ids, palette), heat]
    grid = make_grid(torch.stack(tiles), nrow=3, padding=PADDING, pad_value=PAD_VALUE)
    scale = [(heat_colour(share), f"weight {share:g}") for share in (0.0, 0.5, 1.0)]
    return annotate(grid, list(views.titles), tiles[0].shape[-1], legend(palette, class_names, ignore=True) + scale)


def legend(palette: np.ndarray, class_names: Sequence[str], ignore: bool = False,
           ignore_name: str = "ignored") -> list[tuple[tuple[int, int, int], str]]:
    """(colour, name) per class (``class_N`` where no name is given), then white for ``ignore``."""
    names = list(class_names) + [f"class_{i}" for i in range(len(class_names), len(palette))]
    entries = [(tuple(int(c) for c in palette[i]), names[i]) for i in range(len(palette))]
    return entries + ([(IGNORE_COLOUR, ignore_name)] if ignore else [])


def annotate(grid: torch.Tensor, titles: Sequence[str], tile_width: int,
             entries: Sequence[tuple[tuple[int, int, int], str]]) -> torch.Tensor:
    """``grid`` (3,H,W uint8, columns of ``tile_width`` + padding) with a title above each column
    and the legend's swatches and names below, wrapped to the grid's width."""
    font = ImageFont.load_default()
    width = grid.shape[-1]
    pieces, row, x = [], [], PADDING  # the legend in lines of (x, colour, name)
    for colour, name in entries:
        size = _SWATCH + 4 + int(font.getlength(name)) + 10
        if row and x + size > width:
            pieces.append(row)
            row, x = [], PADDING
        row.append((x, colour, name))
        x += size
    if row:
        pieces.append(row)
    header, footer = _LINE + 2, _LINE * len(pieces) + 2
    canvas = Image.new("RGB", (width, header + grid.shape[1] + footer), _BACKGROUND)
    canvas.paste(Image.fromarray(grid.permute(1, 2, 0).numpy()), (0, header))
    draw = ImageDraw.Draw(canvas)
    for column, title in enumerate(titles):
        left = PADDING + column * (tile_width + PADDING)
        text = _fit(title, font, tile_width)
        draw.text((left + (tile_width - font.getlength(text)) / 2, 2), text, fill=_TEXT, font=font)
    top = header + grid.shape[1] + 2
    for line, row in enumerate(pieces):
        y = top + line * _LINE
        for x, colour, name in row:
            draw.rectangle([x, y + 1, x + _SWATCH - 1, y + _SWATCH], fill=colour, outline=_TEXT)
            draw.text((x + _SWATCH + 4, y), name, fill=_TEXT, font=font)
    return torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1)


def _fit(text: str, font: ImageFont.ImageFont, width: int) -> str:
    """``text``, cut (with "...") to fit ``width`` pixels: a title never runs into the next column."""
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "...") > width:
        text = text[:-1]
    return text + "..." if text else ""


_CELL = 26  # px per confusion-matrix cell: room for "100" in the built-in font
_NO_TRUTH = (80, 80, 80)  # a row without ground-truth pixels: nothing to normalise by


def confusion_panel(matrix, class_names: Sequence[str] = ()) -> torch.Tensor:
    """The confusion matrix (rows: ground truth, columns: prediction) as a (3,H,W) uint8 heat map,
    row-normalised (each cell the share of its class's pixels, in percent), rows named ``id name``
    and columns by id. Drawn with Pillow alone: matplotlib is an optional extra."""
    counts = np.asarray(matrix, dtype=np.float64)
    n = counts.shape[0]
    names = list(class_names) + [f"class_{i}" for i in range(len(class_names), n)]
    totals = counts.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.where(totals > 0, counts / totals, np.nan)
    font = ImageFont.load_default()
    labels = [f"{i} {name}" for i, name in enumerate(names)]
    left = min(max(int(font.getlength(text)) for text in labels) + 8, 160)
    title = "rows: ground truth, columns: prediction (% of the row)"
    top = 2 * _LINE + 4
    width = max(left + n * _CELL + PADDING, int(font.getlength(title)) + 2 * PADDING)
    canvas = Image.new("RGB", (width, top + n * _CELL + PADDING), _BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    draw.text((PADDING, 2), title, fill=_TEXT, font=font)
    for col in range(n):
        text = str(col)
        draw.text((left + col * _CELL + (_CELL - font.getlength(text)) / 2, _LINE + 2), text, fill=_TEXT, font=font)
    for row in range(n):
        y = top + row * _CELL
        draw.text((PADDING, y + (_CELL - _LINE) / 2 + 2), _fit(labels[row], font, left - 6), fill=_TEXT, font=font)
        for col in range(n):
            x, share = left + col * _CELL, shares[row, col]
            if share != share:  # NaN: no ground truth in this row
                colour, text = _NO_TRUTH, ""
            else:
                colour = heat_colour(share)  # dark blue (none of the row) to bright yellow (all of it)
                text = f"{share * 100:.0f}"
            draw.rectangle([x, y, x + _CELL - 2, y + _CELL - 2], fill=colour)
            if text:
                ink = (0, 0, 0) if share > 0.5 else _TEXT
                draw.text((x + (_CELL - 1 - font.getlength(text)) / 2, y + (_CELL - _LINE) / 2 + 1), text,
                          fill=ink, font=font)
    return torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1)


def samples_panel(images: Sequence[torch.Tensor], masks: Sequence[torch.Tensor], palette: np.ndarray,
                  normalization: Normalization, class_names: Sequence[str] = (), alpha: float = 0.5) -> torch.Tensor:
    """One row per training sample as the loader delivers it: the augmented image | the image with
    its mask's class colours blended in at ``alpha`` (ignored pixels white), as a (3,H,W) uint8
    grid, titled, with the legend below. Samples of different sizes are padded to the largest."""
    height = max(int(image.shape[-2]) for image in images)
    width = max(int(image.shape[-1]) for image in images)
    tiles = []
    for image, mask in zip(images, masks):
        picture, colours = denormalize(image, normalization), colorize(mask, palette)
        blended = (picture.float() * (1 - alpha) + colours.float() * alpha).round().to(torch.uint8)
        for tile in (picture, blended):
            pad = (0, width - tile.shape[-1], 0, height - tile.shape[-2])
            tiles.append(torch.nn.functional.pad(tile, pad, value=PAD_VALUE))
    grid = make_grid(torch.stack(tiles), nrow=2, padding=PADDING, pad_value=PAD_VALUE)
    return annotate(grid, ["augmented image", "mask overlaid"], width, legend(palette, class_names, ignore=True))
