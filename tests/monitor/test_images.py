"""Image panels: titled columns and a legend naming each class colour."""

from __future__ import annotations

import numpy as np
import torch

from segadv.data.palette import palette
from segadv.config.normalization import resolve as resolve_normalization
from segadv.monitor.images import PADDING, confidence_panel, segmentation_panel


def test_the_panel_titles_its_columns_and_names_each_class_colour():
    colours = palette(5)
    images = torch.zeros(2, 3, 64, 64)
    labels = torch.zeros(2, 64, 64, dtype=torch.long)
    labels[:, 10:30, 10:30] = 2
    preds = labels.clone()
    names = ["background", "circle", "square", "triangle", "ring"]
    panel = segmentation_panel(images, labels, preds, colours, resolve_normalization("imagenet", [0.5] * 3, [0.5] * 3), names)
    grid_height = 2 * (64 + PADDING) + PADDING
    assert panel.dtype == torch.uint8 and panel.shape[0] == 3 and panel.shape[2] == 3 * (64 + PADDING) + PADDING
    header = panel.shape[1] - grid_height - legend_height(panel, grid_height)
    assert header > 0
    # text in the header above each of the three columns
    top = panel[:, :header].numpy()
    for column in range(3):
        left = PADDING + column * (64 + PADDING)
        assert (top[:, :, left:left + 64] > 200).any(), column
    # every class colour (and white for ignored pixels) has a swatch in the legend
    bottom = panel[:, -legend_height(panel, grid_height):].permute(1, 2, 0).reshape(-1, 3).numpy()
    found = {tuple(c) for c in np.unique(bottom, axis=0)}
    assert {tuple(int(v) for v in c) for c in colours} | {(255, 255, 255)} <= found


def legend_height(panel, grid_height):
    """Rows below the grid: the legend (the grid's last row is padding, grey 128)."""
    column = panel[:, :, 0].numpy().T  # the left padding column, top to bottom
    grey = [i for i in range(column.shape[0]) if (column[i] == 128).all()]
    return panel.shape[1] - (grey[-1] + 1)


def test_the_confidence_panel_is_titled_too():
    class Maps:
        images = torch.zeros(1, 3, 32, 32)
        preds = torch.ones(1, 32, 32, dtype=torch.long)
        confidence = torch.full((1, 32, 32), 0.5)
        pseudo_labels = torch.full((1, 32, 32), 255, dtype=torch.long)

    panel = confidence_panel(Maps(), palette(3), resolve_normalization("imagenet", [0.5] * 3, [0.5] * 3), ["a", "b", "c"])
    assert panel.shape[1] > 32 + 2 * PADDING and panel.shape[2] == 4 * (32 + PADDING) + PADDING


def test_a_bgr_input_is_shown_in_rgb():
    from segadv.config.schema import DataConfig
    from segadv.monitor.images import denormalize

    norm = DataConfig(normalization="caffe_bgr").input_normalization
    rgb = torch.tensor([200.0, 20.0, 90.0]).view(3, 1, 1)
    bgr_input = rgb.flip(0) - torch.tensor([104.00698793, 116.66876762, 122.67891434]).view(3, 1, 1)
    assert denormalize(bgr_input, norm).view(3).tolist() == [200, 20, 90]


def test_the_confusion_matrix_is_a_row_normalised_heat_map_with_the_class_names():
    from segadv.monitor.images import confusion_panel

    matrix = torch.tensor([[90, 10, 0], [0, 100, 0], [0, 0, 0]])  # class 2: no ground truth
    panel = confusion_panel(matrix, ["background", "circle", "square"])
    assert panel.dtype == torch.uint8 and panel.shape[0] == 3
    rgb = panel.permute(1, 2, 0).numpy().reshape(-1, 3)
    colours = {tuple(int(c) for c in px) for px in rgb}
    assert (250, 220, 60) in colours  # a whole row predicted as one class: the brightest cell
    assert (20, 30, 70) in colours  # none of a row: the darkest
    assert (80, 80, 80) in colours  # the row without ground truth: grey, not a division by zero
    # the same counts scaled: the same picture (normalised per row)
    assert torch.equal(panel, confusion_panel(matrix * 7, ["background", "circle", "square"]))
    # without names: class_N, and a wider name widens the picture
    assert confusion_panel(matrix).shape[-1] <= confusion_panel(matrix, ["a-very-long-class-name"] * 3).shape[-1]


def test_the_training_views_panel_shows_the_mixed_input_its_labels_and_the_weight_as_a_heat_map():
    from segadv.methods.base import TrainingViews
    from segadv.monitor.images import HEAT_HIGH, HEAT_LOW, IGNORE_COLOUR, heat_colour, training_views_panel

    colours, names = palette(3), ["a", "b", "c"]
    labels = torch.full((2, 16, 16), 1, dtype=torch.long)
    labels[:, :, 8:] = 2  # the right half: the teacher's pseudo labels
    labels[:, :4, 8:] = 255  # ignored
    weight = torch.ones(2, 16, 16)
    weight[:, :, 8:] = 0.5  # the pasted half weighs 1, the pseudo labels their confidence
    weight[1, :, 8:] = 0.0
    views = TrainingViews(torch.zeros(2, 3, 16, 16), labels, weight)
    panel = training_views_panel(views, colours, resolve_normalization("imagenet", [0.5] * 3, [0.5] * 3), names)
    tile = 16 + PADDING
    assert panel.dtype == torch.uint8 and panel.shape[0] == 3 and panel.shape[2] == 3 * tile + PADDING
    grid_height = 2 * tile + PADDING
    top = panel.shape[1] - grid_height - legend_height(panel, grid_height)
    header = panel[:, :top].numpy()
    for column in range(3):  # each column titled
        left = PADDING + column * tile
        assert (header[:, :, left:left + 16] > 200).any(), column

    def pixel(row, column, y, x):
        return tuple(int(v) for v in panel[:, top + PADDING + row * tile + y, PADDING + column * tile + x])

    assert pixel(0, 0, 5, 5) == (128, 128, 128)  # the input: 0 under mean 0.5, std 0.5
    assert pixel(0, 1, 5, 2) == tuple(int(v) for v in colours[1]) and pixel(0, 1, 5, 12) == tuple(
        int(v) for v in colours[2])
    assert pixel(0, 1, 1, 12) == IGNORE_COLOUR
    assert pixel(0, 2, 5, 2) == HEAT_HIGH and pixel(0, 2, 5, 12) == heat_colour(0.5)
    assert pixel(1, 2, 5, 12) == HEAT_LOW
    assert pixel(0, 2, 1, 12) == IGNORE_COLOUR and pixel(1, 2, 1, 12) == IGNORE_COLOUR  # the loss skips them
    # the legend: every class colour, ignored, and the weight's scale
    bottom = panel[:, -legend_height(panel, grid_height):].permute(1, 2, 0).reshape(-1, 3).numpy()
    found = {tuple(int(v) for v in c) for c in np.unique(bottom, axis=0)}
    assert {tuple(int(v) for v in c) for c in colours} | {IGNORE_COLOUR, HEAT_LOW, heat_colour(0.5), HEAT_HIGH} <= found
    # the titles are the views' own (another self-training method names its columns)
    other = TrainingViews(views.images, labels, weight, tag="train/strong_view", titles=("strong", "pseudo", "mask"))
    assert not torch.equal(training_views_panel(other, colours, resolve_normalization("imagenet", [0.5] * 3,
                                                                                        [0.5] * 3), names), panel)


def test_training_views_are_sliced_without_a_copy_and_copied_to_the_host_on_demand():
    from segadv.methods.base import TrainingViews

    views = TrainingViews(torch.zeros(4, 3, 8, 8), torch.zeros(4, 8, 8, dtype=torch.long), torch.ones(4, 8, 8))
    first = views.first(2)
    assert first.images.shape == (2, 3, 8, 8) and first.labels.shape == (2, 8, 8) and first.weight.shape == (2, 8, 8)
    assert first.images.data_ptr() == views.images.data_ptr()  # a view of the iteration's tensor
    assert views.first(9).images.shape[0] == 4  # fewer images than asked for: all of them
    assert first.tag == "train/mixed_batch" and first.titles == ("mixed input", "mixed label", "confidence")
    host = first.to_host()
    assert host.images.device.type == "cpu" and torch.equal(host.weight, first.weight)
