"""An export's settings (segadv/export/settings.py) and an export verified and put in place
(segadv/export/verified.py), called without argparse."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from segadv.config import load_config
from segadv.errors import UserError
from segadv.export.settings import check_size, default_input_size, resolve_format, tolerances, verification_shapes
from segadv.export.sidecar import sidecar_path
from segadv.export.verified import ExportOptions, export_verified

from conftest import TINY_OVERRIDES
from test_export import make_generator, save_segadv_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_format_comes_from_the_suffix_where_not_given():
    assert resolve_format(None, Path("m.onnx")) == "onnx"
    assert resolve_format(None, Path("m.TS")) == "torchscript"
    assert resolve_format("onnx", Path("m.bin")) == "onnx"
    with pytest.raises(UserError, match="output suffix '.bin' does not say which"):
        resolve_format(None, Path("m.bin"))


def test_sizes_are_multiples_of_the_stride_and_the_shapes_follow_dynamic():
    loaded = SimpleNamespace(cfg=load_config(None, ["data.synthetic.image_size=40"]))
    assert default_input_size(loaded, 16) == (48, 48)
    folder = load_config(None, ["data.train_transforms=[{name: RandomCrop, height: 100, width: 60}]"])
    folder.data.kind = "folder"
    assert default_input_size(SimpleNamespace(cfg=folder), 16) == (112, 64)
    with pytest.raises(UserError, match="positive multiples of 16 .* e.g. 48 16"):
        check_size(40, 0, 16, "--input-size")
    assert verification_shapes(None, True, 32, 48, 16) == [[1, 3, 32, 48], [2, 3, 64, 64]]
    assert verification_shapes(None, False, 32, 48, 16) == [[1, 3, 32, 48]]
    assert verification_shapes([(16, 16), (32, 32)], True, 32, 48, 16) == [[1, 3, 16, 16], [2, 3, 32, 32]]
    with pytest.raises(UserError, match="take only their input size 32 48"):
        verification_shapes([(16, 16)], False, 32, 48, 16)
    assert tolerances(False, None, None, None) == (1e-4, 1e-4, 0.999)
    assert tolerances(True, 0.5, None, 0.9) == (0.5, 1e-2, 0.9)


def test_a_verified_export_is_put_in_place_with_its_sidecar_and_a_failed_one_leaves_nothing(tmp_path):
    from segadv.checkpoint.inference import load_generator

    cfg = load_config(None, TINY_OVERRIDES)
    checkpoint = save_segadv_checkpoint(tmp_path / "last.pt", cfg, make_generator(cfg))
    loaded = load_generator(str(checkpoint), None, [])
    output = tmp_path / "out" / "model.pt"
    done = export_verified(loaded, "torchscript", output, ExportOptions(input_size=(32, 32)))
    assert done.passed and done.sidecar == sidecar_path(output) and output.is_file()
    meta = json.loads(done.sidecar.read_text())
    assert meta["verification"]["passed"] is True and meta["input"]["size_divisor"] == done.divisor
    assert done.report[0].startswith("verify ")
    with torch.no_grad():  # a tolerance nothing meets: the check fails, nothing is written
        failed = export_verified(loaded, "torchscript", tmp_path / "strict.pt",
                                 ExportOptions(input_size=(32, 32), half=True, atol=0.0, rtol=0.0))
    assert not failed.passed and failed.sidecar is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "out"]
