"""G as segadv builds it: every parameter it keeps takes part in training."""

import pytest
import torch

from segadv.config.schema import GeneratorConfig
from segadv.models import build_generator


@pytest.mark.parametrize("arch", ["deeplabv3", "deeplabv3plus", "deeplabv2"])
@pytest.mark.parametrize("encoder, depth", [("mobilenet_v2", 3), ("mobilenet_v2", 4), ("resnet18", 4)])
def test_every_parameter_gets_a_gradient_at_a_shallow_encoder_depth(arch, encoder, depth):
    """smp builds every encoder stage whatever encoder_depth says; the unused ones would never get a
    gradient (DDP stops on them). segadv drops them."""
    cfg = GeneratorConfig(arch=arch, encoder=encoder, encoder_depth=depth, decoder_atrous_rates=[1, 2, 3])
    torch.manual_seed(0)
    model = build_generator(cfg, num_classes=3)
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


def test_dropping_unused_stages_keeps_the_output():
    cfg = GeneratorConfig(encoder="mobilenet_v2", encoder_depth=3, decoder_atrous_rates=[1, 2, 3])
    torch.manual_seed(0)
    kept = build_generator(cfg, num_classes=3).eval()
    import segmentation_models_pytorch as smp

    torch.manual_seed(0)
    plain = smp.DeepLabV3Plus(encoder_name="mobilenet_v2", encoder_depth=3, encoder_weights=None,
                              decoder_atrous_rates=(1, 2, 3), classes=3).eval()
    x = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(kept(x), plain(x))


@pytest.mark.parametrize("arch", ["deeplabv3", "deeplabv3plus"])
def test_decoder_channels_sets_the_decoder_width(arch):
    """model.generator.decoder_channels reaches smp: the classifier reads that many channels, and a
    narrower decoder has fewer parameters."""
    narrow = build_generator(GeneratorConfig(arch=arch, encoder="resnet18", encoder_depth=4, decoder_channels=32,
                                             decoder_atrous_rates=[1, 2, 3]), num_classes=3)
    wide = build_generator(GeneratorConfig(arch=arch, encoder="resnet18", encoder_depth=4, decoder_channels=64,
                                           decoder_atrous_rates=[1, 2, 3]), num_classes=3)
    assert narrow.segmentation_head[0].in_channels == 32
    assert wide.segmentation_head[0].in_channels == 64
    assert sum(p.numel() for p in narrow.parameters()) < sum(p.numel() for p in wide.parameters())
    assert narrow(torch.randn(2, 3, 64, 64)).shape == (2, 3, 64, 64)


def test_local_encoder_weights_load_where_the_run_is_assembled(tiny_cfg, tmp_path):
    """A full-depth encoder file (a plain smp encoder's) loads strictly into the G a run builds,
    whose unused stages (encoder_depth 4) are dropped: their keys are left out, every other one fits."""
    import segmentation_models_pytorch as smp

    from segadv.training.build import build_training
    from segadv.parallel import parse_device_map, unwrap

    torch.manual_seed(5)
    encoder = smp.DeepLabV3Plus(encoder_name="mobilenet_v2", encoder_weights=None).encoder
    torch.save(encoder.state_dict(), tmp_path / "encoder.pth")
    tiny_cfg.model.generator.encoder_weights = str(tmp_path / "encoder.pth")
    generator = unwrap(build_training(tiny_cfg, parse_device_map("g:cpu,d:cpu")).g.module)
    full = encoder.state_dict()
    own = generator.encoder.state_dict()
    assert 0 < len(own) < len(full)
    assert all(torch.equal(value, full[key]) for key, value in own.items())


@pytest.mark.parametrize("case, message", [
    ("missing", "model.generator.encoder_weights: file not found"),
    ("other_encoder", "does not fit the encoder"),
])
def test_bad_local_encoder_weights_are_user_errors(tmp_path, case, message):
    from segadv.checkpoint import load_encoder_weights
    from segadv.errors import UserError

    path = tmp_path / "encoder.pth"
    if case == "other_encoder":
        torch.save(build_generator(GeneratorConfig(encoder="resnet18"), 3).encoder.state_dict(), path)
    cfg = GeneratorConfig(encoder="mobilenet_v2", encoder_depth=4, encoder_weights=str(path))
    generator = build_generator(cfg.model_copy(update={"encoder_weights": None}), 3)
    with pytest.raises(UserError, match=message) as err:
        load_encoder_weights(generator, cfg)
    assert str(err.value).startswith("model.generator.encoder_weights:")


def test_an_encoder_s_own_depth_limit_names_the_key():
    from segadv.errors import UserError

    # efficientnet encoders take 2..5 stages (smp's check), within the schema's 1..5
    with pytest.raises(UserError, match=r"model\.generator\.encoder_depth: 1 does not fit encoder 'efficientnet-b0'"):
        build_generator(GeneratorConfig(arch="deeplabv3", encoder="efficientnet-b0", encoder_depth=1,
                                        decoder_channels=16), num_classes=3)


@pytest.mark.parametrize("arch, depth, stride, divisor", [
    ("deeplabv3plus", 4, 16, 16), ("deeplabv3plus", 3, 16, 8), ("deeplabv3", 5, 8, 8), ("deeplabv2", 5, 16, 1)])
def test_the_configs_input_divisor_is_what_the_built_g_takes(arch, depth, stride, divisor):
    """GeneratorConfig.input_divisor, which a start checks every input size against before anything
    is built, is the built G's own rule: smp's DeepLabV3 / V3+ take sides divisible by the encoder's
    stride (min(2^depth, output_stride)), DeepLab-v2 any."""
    cfg = GeneratorConfig(arch=arch, encoder="mobilenet_v2", encoder_depth=depth, output_stride=stride,
                          decoder_atrous_rates=[1, 2, 3])
    assert cfg.input_divisor == divisor
    model = build_generator(cfg, num_classes=3).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 48)).shape[-2:] == (32, 48)
        if divisor > 1:
            with pytest.raises(RuntimeError, match=f"divisible by {divisor}"):
                model(torch.randn(1, 3, 32 + divisor // 2, 48))
            cfg.check_input_size(32, 48, "here")
            from segadv.errors import UserError

            with pytest.raises(UserError, match=rf"here: {32 + divisor // 2}x48 is not a multiple of the encoder's "
                                                rf"stride {divisor}, which smp's {arch} needs"):
                cfg.check_input_size(32 + divisor // 2, 48, "here")
        else:
            assert model(torch.randn(1, 3, 33, 47)).shape[-2:] == (33, 47)


def test_an_encoder_smp_lacks_is_refused_before_anything_is_built():
    """The DeepLab rows' builder checks the encoder's name from the config (a start's check, so
    segadv-experiment's dry run names it too), with the nearest names."""
    from segadv.errors import UserError
    from segadv.models.deeplab.model import check_encoder

    check_encoder(GeneratorConfig(encoder="resnet18"))
    check_encoder(GeneratorConfig(encoder="tu-resnet18"))  # timm's, found as smp builds it
    with pytest.raises(UserError, match=r"model\.generator\.encoder: 'mobilenet_v3' is not one of "
                                        r"segmentation-models-pytorch's \d+ encoders; did you mean 'mobilenet_v2'"):
        check_encoder(GeneratorConfig(encoder="mobilenet_v3"))
