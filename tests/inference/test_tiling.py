"""An image as windows and back (segadv/inference/tiling.py), run on a numpy stand-in backend."""

import numpy as np
import pytest

from segadv.inference.backends import Backend
from segadv.inference.tiling import assemble, plan_image, run_windows


class Threshold(Backend):
    """Two classes: 1 where the red channel is bright. Logits, or class ids with ``class_ids``;
    records each batch's shape."""

    description = "numpy stand-in"

    def __init__(self, class_ids=False, fixed_batch=None, fixed_size=None):
        self.meta = {"input": {"kind": "uint8", "dtype": "uint8"}, "normalization": {"mean": [0] * 3, "std": [1] * 3}}
        self.class_ids, self.fixed_batch, self.fixed_size = class_ids, fixed_batch, fixed_size
        self.shapes = []

    def run(self, x):
        self.shapes.append(x.shape)
        bright = (x[:, 0] > 127).astype(np.float32)
        return bright.astype(np.int64) if self.class_ids else np.stack([1 - bright, bright], axis=1)


def picture(h, w, seed=0):
    image = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    image[: h // 2, :, 0] = 255  # a bright top half: the resize path keeps it
    image[h // 2:, :, 0] = 0
    return image


def segment(backend, image, **tiling):
    plan = plan_image(image, divisor=16, fixed=backend.fixed_size, **tiling)
    run_windows(backend, [plan], batch_size=2)
    return plan, assemble(plan, backend.class_ids, 2)


@pytest.mark.parametrize("class_ids", [False, True])
def test_small_image_runs_whole_padded_to_the_size_multiple(class_ids):
    image = picture(37, 50)
    backend = Threshold(class_ids)
    plan, labels = segment(backend, image, mode="slide", max_size=64, overlap=0.25)
    assert plan.windows == [(0, 0)] and plan.canvas.shape == (3, 48, 64)
    assert backend.shapes == [(1, 3, 48, 64)]
    np.testing.assert_array_equal(labels, image[..., 0] > 127)


@pytest.mark.parametrize("class_ids", [False, True])
def test_large_image_slides_overlapping_windows_that_cover_it(class_ids):
    image = picture(100, 150)
    backend = Threshold(class_ids)
    plan, labels = segment(backend, image, mode="slide", max_size=64, overlap=0.25)
    assert plan.tile == (64, 64) and len(plan.windows) > 4
    covered = np.zeros(plan.canvas.shape[1:], bool)
    for y, x in plan.windows:
        covered[y:y + 64, x:x + 64] = True
    assert covered.all()
    assert all(shape[2:] == (64, 64) and shape[0] <= 2 for shape in backend.shapes)
    np.testing.assert_array_equal(labels, image[..., 0] > 127)


def test_resize_mode_shrinks_to_fit_and_scales_the_mask_back():
    image = picture(128, 256)
    plan, labels = segment(Threshold(), image, mode="resize", max_size=64, overlap=0.25)
    assert plan.scaled == (32, 64) and plan.windows == [(0, 0)]
    assert labels.shape == (128, 256)
    assert labels[:60].all() and not labels[68:].any()


def test_a_fixed_batch_model_gets_full_batches_and_a_fixed_size_model_its_window():
    backend = Threshold(fixed_batch=4, fixed_size=(32, 32))
    image = picture(40, 70)
    plan, labels = segment(backend, image, mode="slide", max_size=1024, overlap=0.5)
    assert plan.tile == (32, 32)
    assert {shape for shape in backend.shapes} == {(4, 3, 32, 32)}
    np.testing.assert_array_equal(labels, image[..., 0] > 127)
