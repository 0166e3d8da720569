"""Images to mask files on a backend (segadv/inference/segment.py) and where they may go
(segadv/inference/outputs.py), without argparse."""

import numpy as np
import pytest
from PIL import Image

from segadv.data.masks import written_by
from segadv.errors import UserError
from segadv.inference.outputs import OVERLAY_DIR, check_outputs, not_ours
from segadv.inference.segment import MaskFormat, Tiling, segment_images

from test_tiling import Threshold, picture

META = {"classes": ["dark", "bright"], "palette": [[0, 0, 0], [200, 10, 10]], "output": {"kind": "logits"},
        "input": {"size_divisor": 16}}


def images(folder, sizes):
    paths = []
    for i, (h, w) in enumerate(sizes):
        paths.append(folder / f"img{i}.png")
        Image.fromarray(picture(h, w, seed=i)).save(paths[-1])
    return paths


def test_masks_and_overlays_are_written_marked_and_counted(tmp_path):
    inputs = images(tmp_path, [(20, 30), (90, 40), (16, 16)])
    out = tmp_path / "out"
    check_outputs(inputs, out, overlay=True)
    masks = MaskFormat.of(META)
    assert (masks.num_classes, masks.divisor, masks.class_ids) == (2, 16, False)
    done = segment_images(Threshold(), masks, inputs, out, Tiling(max_size=32, batch_size=2), overlay_alpha=0.5)
    assert done.written == 3 and done.problems == [] and done.windows > 3
    assert int(done.counts.sum()) == 20 * 30 + 90 * 40 + 16 * 16
    for path in inputs:
        with Image.open(out / path.name) as mask:
            assert mask.mode == "P"
            np.testing.assert_array_equal(np.asarray(mask), np.asarray(Image.open(path))[..., 0] > 127)
        assert written_by(out / path.name, "segadv-predict") and (out / OVERLAY_DIR / path.name).is_file()
    assert not_ours(out, overlay=True) == []


def test_an_input_that_does_not_decode_stops_the_run_after_its_batch_unless_skipped(tmp_path):
    inputs = images(tmp_path, [(16, 16), (16, 16)])
    broken = tmp_path / "broken.png"
    broken.write_bytes(inputs[0].read_bytes()[:60])  # a header that opens, pixel data that does not decode
    order = [inputs[0], broken, inputs[1]]
    with pytest.raises(UserError, match="broken.png.*1 mask\\(s\\) written before it"):
        segment_images(Threshold(), MaskFormat.of(META), order, tmp_path / "a", Tiling(batch_size=2))
    done = segment_images(Threshold(), MaskFormat.of(META), order, tmp_path / "b", Tiling(batch_size=2),
                          skip_unreadable=True)
    assert done.written == 2 and len(done.problems) == 1 and "broken.png" in done.problems[0]


def test_outputs_never_replace_an_input_or_a_file_predict_did_not_write(tmp_path):
    inputs = images(tmp_path, [(16, 16)])
    with pytest.raises(UserError, match="would overwrite an input image"):
        check_outputs(inputs, tmp_path, overlay=False, overwrite=True)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="holds files segadv-predict did not write"):
        check_outputs(inputs, out, overlay=False)
    check_outputs(inputs, out, overlay=False, overwrite=True)
    with pytest.raises(UserError, match="written twice"):
        check_outputs([tmp_path / "a" / "x.png", tmp_path / "b" / "x.jpg"], out, overlay=False, overwrite=True)
    with pytest.raises(UserError, match="300 classes do not fit a palette PNG"):
        MaskFormat.of({**META, "classes": [str(i) for i in range(300)]})
