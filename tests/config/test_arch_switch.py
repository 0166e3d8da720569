"""A config layer naming another ``model.generator.arch`` (``GeneratorConfig.carried_over``): it keeps
the lower layers' keys that both archs' sections declare, and no others."""

from __future__ import annotations

import pytest

from segadv.cli.train import main as train_main
from segadv.config import load_config
from segadv.models.deeplab.config import DeepLabConfig

GEOMETRY = ("encoder", "encoder_depth", "output_stride", "decoder_channels", "decoder_atrous_rates")


def test_the_semi_config_sets_a_geometry_other_than_the_defaults():
    """What the tests below hold would pass by accident if semi's keys were the schema's defaults."""
    semi = load_config("semi").model.generator
    defaults = {key: DeepLabConfig.model_fields[key].default for key in GEOMETRY}
    assert [key for key in GEOMETRY if getattr(semi, key) != defaults[key]] == [
        "encoder_depth", "output_stride", "decoder_channels", "decoder_atrous_rates"]


@pytest.mark.parametrize("arch", ["deeplabv3plus_unimatch", "deeplabv3", "deeplabv2"])
def test_an_override_switching_between_deeplab_rows_keeps_the_configs_geometry(arch):
    semi = load_config("semi").model.generator
    switched = load_config("semi", [f"model.generator.arch={arch}"]).model.generator
    assert switched.arch == arch
    assert {key: getattr(switched, key) for key in GEOMETRY} == {key: getattr(semi, key) for key in GEOMETRY}


def test_a_file_switching_arch_over_its_base_keeps_the_geometry_and_its_own_keys_win(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("model:\n  generator: {arch: deeplabv3plus, encoder_depth: 3, output_stride: 8, "
                    "decoder_channels: 64, decoder_atrous_rates: [1, 2, 3]}\n")
    child = tmp_path / "child.yaml"
    child.write_text("_base_: base.yaml\nmodel:\n  generator: {arch: deeplabv3plus_unimatch, decoder_channels: 32}\n")
    generator = load_config(child).model.generator
    assert (generator.arch, generator.encoder_depth, generator.output_stride) == ("deeplabv3plus_unimatch", 3, 8)
    assert (generator.decoder_channels, generator.decoder_atrous_rates) == (32, [1, 2, 3])


def test_a_switch_to_a_vit_keeps_only_the_keys_every_arch_takes():
    generator = load_config("semi", ["model.generator.activation_checkpointing=true",
                                     "model.generator.arch=dinov2"]).model.generator
    assert generator.arch == "dinov2"
    assert generator.activation_checkpointing is True  # a key every arch takes
    assert generator.encoder == "vit_small_patch14_dinov2"  # not the DeepLab's resnet18: a ViT's own default


def test_a_switch_between_vit_rows_keeps_no_key_of_the_other_encoder_table():
    generator = load_config("dinov2_tiny", ["model.generator.arch=dinov3"]).model.generator
    assert (generator.arch, generator.encoder, generator.depth) == ("dinov3", "vit_small_patch16_dinov3", None)


@pytest.mark.parametrize("value", ["[1]", "{a: 1}"])
def test_an_arch_that_is_no_name_is_exit_2_naming_the_key(value, tmp_path, capsys):
    assert train_main(["--config", "semi", "--run-dir", str(tmp_path / "run"), f"model.generator.arch={value}"]) == 2
    err = capsys.readouterr().err
    assert "model.generator.arch: expected str" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_carried_key_the_new_row_cannot_take_is_named_not_dropped():
    """The references' DeepLab-v2 config builds its encoder in the caffe layout, which DeepLabV3+
    cannot: switching arch over it names the key instead of silently building another encoder."""
    from segadv.errors import UserError

    with pytest.raises(UserError, match=r"model\.generator\.layout: deeplabv3plus builds its encoder in layout smp"):
        load_config("advsemiseg_voc_reference", ["model.generator.arch=deeplabv3plus"])
