"""An export's settings (segadv/export/settings.py) and an export verified and put in place
(segadv/export/verified.py), called without argparse."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from segadv.config import load_config
from segadv.errors import UserError
from segadv.export.settings import (check_size, default_input_size, example_outputs, resolve_format, tolerances,
                                     verification_shapes)
from segadv.export.sidecar import sidecar_path
from segadv.export.verified import ExportOptions, export_verified

from conftest import TINY_OVERRIDES
from test_export import make_generator, save_segadv_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_format_comes_from_the_suffix_where_not_given():
    assert resolve_format(None, Path("m.onnx")) == "onnx"
    assert resolve_format(None, Path("m.TS")) == "torchscript"
    assert resolve_format(None, Path("m.pt2")) == resolve_format("exported", Path("m.PT2")) == "exported"
    assert resolve_format("onnx", Path("m.bin")) == "onnx"  # a suffix that names no format takes --format's
    with pytest.raises(UserError, match="output suffix '.bin' does not say which"):
        resolve_format(None, Path("m.bin"))
    # one that names another format is refused: .pt and .pt2 are one letter apart
    with pytest.raises(UserError, match=r"--format torchscript but the output suffix '.pt2' is torch.export's "
                                        r"\(--format exported\): name the file m.pt or pass --format exported"):
        resolve_format("torchscript", Path("d/m.pt2"))
    with pytest.raises(UserError, match="'.pth' is TorchScript's .* name the file m.onnx"):
        resolve_format("onnx", Path("m.pth"))
    assert example_outputs(None, Path("d")) == ("d/model.onnx for ONNX, d/model.pt2 for torch.export or d/model.pt "
                                                "for TorchScript")
    assert example_outputs("exported", Path("d")) == "d/model.pt2"


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
    # a torch.export program's least side (two strides), and a static one's message naming what fixed it
    assert verification_shapes([(32, 48)], True, 32, 48, 16, least=32) == [[1, 3, 32, 48]]
    with pytest.raises(UserError, match="--verify-size 16 48: a dynamic program takes heights and widths from 32"):
        verification_shapes([(16, 48)], True, 32, 48, 16, least=32)
    with pytest.raises(UserError, match="^DinoV2DPT's static programs take only their input size 42 42"):
        verification_shapes([(56, 56)], False, 42, 42, 14, static_what="DinoV2DPT's static programs")
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
