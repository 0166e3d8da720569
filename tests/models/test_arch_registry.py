"""The arch table: torch-free, one row per arch pointing into its folder, a KeyError naming the archs."""

import subprocess
import sys

import pytest

from segadv.models.registry import ARCHS, generator_arch, resolve


def test_the_table_and_every_section_import_without_torch():
    code = ("import sys\nimport segadv.models.registry as registry\n"
            "for row in registry.ARCHS.values():\n    assert row.settings.__module__.startswith('segadv.models.')\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_each_built_in_row_points_into_its_folder():
    folders = {"deeplabv3": "deeplab", "deeplabv3plus": "deeplab", "deeplabv3plus_unimatch": "deeplab",
               "deeplabv2": "deeplab", "dinov2": "dinov2", "dinov3": "dinov3"}
    assert {name: row.settings.__module__ for name, row in ARCHS.items()} == {
        name: f"segadv.models.{folder}.config" for name, folder in folders.items()}
    for name, row in ARCHS.items():
        refs = [row.builder, row.inference_builder, row.check, row.encoder_weights_loader, row.encoder_layers]
        for ref in filter(None, refs):
            assert ref.startswith(f"segadv.models.{folders[name]}."), (name, ref)
            assert callable(resolve(ref))


def test_an_unknown_arch_names_the_archs():
    with pytest.raises(KeyError, match="archs are deeplabv3, deeplabv3plus, deeplabv3plus_unimatch, deeplabv2, dinov2, dinov3"):
        generator_arch("unet")
