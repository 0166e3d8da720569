"""D: the fc D's depth, ``model.discriminator.num_downsamples`` stride-2 convolutions (the
reference's five by default), and s4GAN's image-level D."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from segadv.config import load_config
from segadv.config.schema import DiscriminatorConfig
from segadv.errors import UserError
from segadv.models import FCDiscriminator, build_discriminator


def logit_map(d: FCDiscriminator, size: int) -> tuple[torch.Size, torch.Size]:
    """The shape of D's classifier output (before the upsampling) and of what D returns."""
    seen = []
    handle = d.classifier.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    out = d(torch.rand(2, 5, size, size).softmax(1))
    handle.remove()
    return seen[0], out.shape


def test_the_default_is_the_references_five_layers():
    d = build_discriminator(DiscriminatorConfig(ndf=64), num_classes=21)
    shapes = [tuple(p.shape) for p in d.state_dict().values()]
    assert shapes == [(64, 21, 4, 4), (64,), (128, 64, 4, 4), (128,), (256, 128, 4, 4), (256,),
                      (512, 256, 4, 4), (512,), (1, 512, 4, 4), (1,)]
    assert list(d.state_dict()) == list(FCDiscriminator(21, ndf=64).state_dict())
    assert all(conv.stride == (2, 2) for conv in [*d.features, d.classifier])


@pytest.mark.parametrize("size, num_downsamples, side", [(321, 5, 10), (80, 5, 2), (80, 3, 10), (48, 3, 6),
                                                         (80, 1, 40), (512, 7, 4)])
def test_the_logit_map_is_the_input_halved_num_downsamples_times(size, num_downsamples, side):
    d = build_discriminator(DiscriminatorConfig(ndf=4, num_downsamples=num_downsamples), num_classes=5)
    coarse, out = logit_map(d, size)
    assert coarse == (2, 1, side, side) and out == (2, 1, size, size)
    assert len(d.features) + 1 == num_downsamples


def test_widths_double_up_to_eight_ndf():
    widths = lambda d: [conv.out_channels for conv in [*d.features, d.classifier]]  # noqa: E731
    assert widths(FCDiscriminator(5, ndf=4, num_downsamples=3)) == [4, 8, 1]
    assert widths(FCDiscriminator(5, ndf=4, num_downsamples=7)) == [4, 8, 16, 32, 32, 32, 1]


def test_num_downsamples_is_checked(tmp_path: Path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty, ["model.discriminator.num_downsamples=3"]).model.discriminator.num_downsamples == 3
    with pytest.raises(UserError) as info:
        load_config(empty, ["model.discriminator.num_downsamples=0"])
    assert "model.discriminator.num_downsamples: must be greater than or equal to 1" in str(info.value)


def test_the_image_discriminator_is_s4gans():
    """Classes + RGB in, the reference's four stride-2 convolutions by default, dropout after the
    first three, one logit per image and the pooled features beside it."""
    from segadv.models import ImageDiscriminator

    d = build_discriminator(DiscriminatorConfig(kind="image", ndf=4), num_classes=5)
    assert isinstance(d, ImageDiscriminator)
    assert [tuple(conv.weight.shape) for conv in d.features] == [(4, 8, 4, 4), (8, 4, 4, 4), (16, 8, 4, 4),
                                                                  (32, 16, 4, 4)]
    assert tuple(d.classifier.weight.shape) == (1, 32)
    dropped = []
    d.dropout.register_forward_hook(lambda module, args, out: dropped.append(args[0].shape[1]))
    logits, features = d(torch.rand(2, 8, 48, 48), return_features=True)
    assert logits.shape == (2, 1) and features.shape == (2, 32, 1, 1) and dropped == [4, 8, 16]
    torch.testing.assert_close(d.classifier(features.flatten(1)), logits)
    d.eval()
    x = torch.rand(2, 8, 48, 48)
    assert torch.equal(d(x), d(x))  # no dropout in eval
    assert len(build_discriminator(DiscriminatorConfig(kind="image", num_downsamples=3), 5).features) == 3


def test_the_fc_maps_upsampling_is_the_references_by_default():
    """hfslyc/AdvSemiSeg upsamples D's map with nn.Upsample(mode="bilinear", align_corners=True):
    at 80 px a 10x10 map's corner cells land exactly on the image's corners (False spreads them half
    a cell inwards)."""
    import torch.nn.functional as F

    from segadv.config.schema import DiscriminatorConfig
    from segadv.models import build_discriminator

    torch.manual_seed(0)
    d = build_discriminator(DiscriminatorConfig(ndf=4, num_downsamples=3), num_classes=5)
    probs = torch.rand(2, 5, 80, 80).softmax(dim=1)
    x = probs
    for conv in d.features:
        x = F.leaky_relu(conv(x), 0.2)
    logits = d.classifier(x)
    reference = torch.nn.Upsample(size=(80, 80), mode="bilinear", align_corners=True)(logits)
    out = d(probs)
    assert torch.equal(out, reference)
    assert torch.equal(out[..., 0, 0], logits[..., 0, 0]) and torch.equal(out[..., -1, -1], logits[..., -1, -1])
    legacy = build_discriminator(DiscriminatorConfig(ndf=4, num_downsamples=3, align_corners=False), num_classes=5)
    legacy.load_state_dict(d.state_dict())
    assert not torch.equal(legacy(probs), out)



def test_depth_against_the_smallest_training_side(tmp_path):
    from conftest import TINY_OVERRIDES
    from segadv.models.discriminator import check_input_side
    from segadv.training.loop import train

    check_input_side(DiscriminatorConfig(num_downsamples=6), 64, "model.discriminator", "64 px")  # a 1x1 map
    with pytest.raises(UserError, match="num_downsamples: 7 stride-2 convolutions leave no cell .*at most 6 fit"):
        check_input_side(DiscriminatorConfig(num_downsamples=7), 64, "model.discriminator", "64 px")
    with pytest.raises(UserError, match="num_downsamples: 6 .*at most 5 fit"):
        check_input_side(DiscriminatorConfig(kind="image", num_downsamples=6), 32, "model.discriminator", "32 px")
    cfg = load_config(None, [*TINY_OVERRIDES, "model.discriminator.num_downsamples=7", "device_map=g:cpu,d:cpu"])
    cfg.run_dir = str(tmp_path / "run")
    with pytest.raises(UserError, match=r"model\.discriminator\.num_downsamples: 7 .*data\.synthetic\.image_size=64"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


@pytest.mark.parametrize("kind", ["fc", "image"])
def test_an_input_too_small_for_the_depth_is_named_in_the_forward(kind):
    d = build_discriminator(DiscriminatorConfig(kind=kind, ndf=4, num_downsamples=6), num_classes=3)
    channels = 3 if kind == "fc" else 6
    d(torch.zeros(1, channels, 64, 64))  # a 1x1 map at the deepest
    with pytest.raises(UserError, match=r"num_downsamples .*: 6 stride-2 convolutions leave no cell of a 32-pixel"):
        d(torch.zeros(1, channels, 32, 48))
