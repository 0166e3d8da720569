"""UniMatch's DeepLabV3+ (model.generator.arch: deeplabv3plus_unimatch) held to the reference's.

``ReferenceDeepLabV3Plus`` below transcribes LiheYoung/UniMatch ``model/semseg/deeplabv3plus.py``
(at 0324f3d; ``DeepLabV3Plus`` 9-67, ``ASPPConv`` 70-75, ``ASPPPooling`` 78-88, ``ASPPModule``
91-116), its backbone handed in (``base_forward``: c1 ... c4) instead of built from ``cfg``. Two
of its constants are arguments: the low- and high-level channels (256 and 2048 there, a
ResNet-50/101's) and, for a tiny encoder only, ``width``, where the reference has 2048 // 8 = 256 in
the ASPP and the literal 256 in the fuse.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from segadv.config.schema import GeneratorConfig
from segadv.errors import UserError
from segadv.models import build_generator, build_generator_for_weights


class ReferenceDeepLabV3Plus(nn.Module):
    def __init__(self, backbone, nclass, dilations, low_channels=256, high_channels=2048, width=None):
        super(ReferenceDeepLabV3Plus, self).__init__()
        self.backbone = backbone
        width = high_channels // 8 if width is None else width

        self.head = ASPPModule(high_channels, dilations, width)

        self.reduce = nn.Sequential(nn.Conv2d(low_channels, 48, 1, bias=False),
                                    nn.BatchNorm2d(48),
                                    nn.ReLU(True))

        self.fuse = nn.Sequential(nn.Conv2d(width + 48, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width),
                                  nn.ReLU(True),
                                  nn.Conv2d(width, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width),
                                  nn.ReLU(True))

        self.classifier = nn.Conv2d(width, nclass, 1, bias=True)

    def forward(self, x, need_fp=False):
        h, w = x.shape[-2:]

        feats = self.backbone.base_forward(x)
        c1, c4 = feats[0], feats[-1]

        if need_fp:
            outs = self._decode(torch.cat((c1, nn.Dropout2d(0.5)(c1))),
                                torch.cat((c4, nn.Dropout2d(0.5)(c4))))
            outs = F.interpolate(outs, size=(h, w), mode="bilinear", align_corners=True)
            out, out_fp = outs.chunk(2)

            return out, out_fp

        out = self._decode(c1, c4)
        out = F.interpolate(out, size=(h, w), mode="bilinear", align_corners=True)

        return out

    def _decode(self, c1, c4):
        c4 = self.head(c4)
        c4 = F.interpolate(c4, size=c1.shape[-2:], mode="bilinear", align_corners=True)

        c1 = self.reduce(c1)

        feature = torch.cat([c1, c4], dim=1)
        feature = self.fuse(feature)

        out = self.classifier(feature)

        return out


def ASPPConv(in_channels, out_channels, atrous_rate):
    block = nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=atrous_rate,
                                    dilation=atrous_rate, bias=False),
                          nn.BatchNorm2d(out_channels),
                          nn.ReLU(True))
    return block


class ASPPPooling(nn.Module):
    def __init__(self, in_channels, out_channels):
        super(ASPPPooling, self).__init__()
        self.gap = nn.Sequential(nn.AdaptiveAvgPool2d(1),
                                 nn.Conv2d(in_channels, out_channels, 1, bias=False),
                                 nn.BatchNorm2d(out_channels),
                                 nn.ReLU(True))

    def forward(self, x):
        h, w = x.shape[-2:]
        pool = self.gap(x)
        return F.interpolate(pool, (h, w), mode="bilinear", align_corners=True)


class ASPPModule(nn.Module):
    def __init__(self, in_channels, atrous_rates, out_channels):
        super(ASPPModule, self).__init__()
        rate1, rate2, rate3 = atrous_rates

        self.b0 = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, bias=False),
                                nn.BatchNorm2d(out_channels),
                                nn.ReLU(True))
        self.b1 = ASPPConv(in_channels, out_channels, rate1)
        self.b2 = ASPPConv(in_channels, out_channels, rate2)
        self.b3 = ASPPConv(in_channels, out_channels, rate3)
        self.b4 = ASPPPooling(in_channels, out_channels)

        self.project = nn.Sequential(nn.Conv2d(5 * out_channels, out_channels, 1, bias=False),
                                     nn.BatchNorm2d(out_channels),
                                     nn.ReLU(True))

    def forward(self, x):
        feat0 = self.b0(x)
        feat1 = self.b1(x)
        feat2 = self.b2(x)
        feat3 = self.b3(x)
        feat4 = self.b4(x)
        y = torch.cat((feat0, feat1, feat2, feat3, feat4), 1)
        return self.project(y)


# ---------------------------------------------------------------------------------------------


class SmpBackbone(nn.Module):
    """segadv's encoder as the reference's backbone: ``base_forward`` gives the stride-4 map first
    and the deepest last (c1 ... c4 there)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def base_forward(self, x):
        features = self.encoder(x)
        return features[2], features[-1]


def reference_key(key):
    """segadv's head key -> the reference's: ``decoder.aspp`` is its ``head``, the rest by name."""
    key = key.removeprefix("decoder.")
    return "head." + key.removeprefix("aspp.") if key.startswith("aspp.") else key


RATES = [1, 2, 3]


def cfg_of(**keys):
    return GeneratorConfig(**{"arch": "deeplabv3plus_unimatch", "encoder": "resnet18",
                              "decoder_atrous_rates": RATES, **keys})


def with_reference(g, width):
    dtype = next(g.parameters()).dtype  # before loading: load_state_dict casts to the module's dtype
    channels = g.encoder.out_channels
    ref = ReferenceDeepLabV3Plus(SmpBackbone(g.encoder), 5, RATES, channels[2], channels[-1], width).to(dtype)
    head = {k: v for k, v in g.state_dict().items() if not k.startswith("encoder.")}
    mapped = {reference_key(k): v for k, v in head.items()}
    missing = ref.load_state_dict({**ref.state_dict(), **mapped}, strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    assert set(mapped) == {k for k in ref.state_dict() if not k.startswith("backbone.")}
    return ref


def test_the_head_is_the_references_at_its_resnet101_widths():
    """Every head tensor of the reference at its own constants (2048 -> 256 ASPP, 256 -> 48 reduce,
    256-wide fuse) under the key map, shape for shape; resnet50 has resnet101's channels. On the
    meta device: shapes only, nothing allocated."""
    with torch.device("meta"):
        g = build_generator_for_weights(cfg_of(encoder="resnet50"), num_classes=21)
        ref = ReferenceDeepLabV3Plus(nn.Identity(), 21, RATES)
    ours = {reference_key(k): tuple(v.shape) for k, v in g.state_dict().items() if not k.startswith("encoder.")}
    assert ours == {k: tuple(v.shape) for k, v in ref.state_dict().items()}


@pytest.fixture(scope="module")
def tiny():
    """A 3-stage resnet18 (64-channel c1, 128-channel c4 at stride 8) and the reference on its
    encoder, the reference holding segadv's head weights, both in float64."""
    torch.manual_seed(0)
    g = build_generator(cfg_of(encoder_depth=3, output_stride=8, decoder_channels=16), num_classes=5).double()
    for m in g.modules():  # running statistics away from 0 / 1, so that eval mode is tested too
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return g, with_reference(g, width=16)


@pytest.mark.parametrize("train", [True, False])
def test_the_logits_are_the_references_at_an_odd_size(tiny, train):
    """65x65, no multiple of the stride: the reference resizes to fit, and so does segadv's."""
    g, ref = tiny
    g.train(train), ref.train(train)
    x = torch.randn(2, 3, 65, 65, dtype=torch.float64)
    got, expected = g(x), ref(x)
    assert got.shape == (2, 5, 65, 65)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_feature_perturbation_is_the_references_need_fp_given_its_masks(tiny, monkeypatch):
    """``feature_scales`` with ``with_unperturbed`` against the reference's ``need_fp`` path with its
    two ``Dropout2d(0.5)`` drawing the same masks: c1's first, then c4's."""
    g, ref = tiny
    g.train(), ref.train()
    x = torch.randn(2, 3, 36, 36, dtype=torch.float64)
    scales = [(torch.rand(2, c, dtype=torch.float64) >= 0.5).double() / 0.5 for c in g.feature_channels()]
    assert g.feature_channels() == (64, 128)
    masks = list(scales)

    class Dropout2d(nn.Module):
        def __init__(self, p):
            super().__init__()
            assert p == 0.5

        def forward(self, feature):
            return feature * masks.pop(0)[:, :, None, None]

    monkeypatch.setattr(nn, "Dropout2d", Dropout2d)
    out, out_fp = ref(x, need_fp=True)
    assert not masks
    clean, perturbed = g(x, feature_scales=scales, with_unperturbed=True)
    torch.testing.assert_close(clean, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(perturbed, out_fp, rtol=0, atol=1e-12)
    assert not torch.allclose(clean, perturbed)


def test_a_train_mode_forward_is_deterministic_where_smps_is_not():
    """V1's weak-view pseudo labels come from a train-mode forward: the reference's (and this
    network's) is a function of its input; smp's DeepLabV3+ drops half the ASPP projection's
    values at random (``decoder.aspp.0.project.3``, ``Dropout(0.5)``)."""
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(0)
    ours = build_generator(cfg_of(encoder_depth=3, output_stride=8, decoder_channels=16), num_classes=3).train()
    assert torch.equal(ours(x), ours(x))
    assert not any(isinstance(m, nn.Dropout) for m in ours.modules())
    smp_g = build_generator(GeneratorConfig(arch="deeplabv3plus", encoder="resnet18", encoder_depth=3,
                                            output_stride=8, decoder_channels=16, decoder_atrous_rates=RATES),
                            num_classes=3).train()
    assert isinstance(smp_g.get_submodule("decoder.aspp.0.project.3"), nn.Dropout)
    assert not torch.equal(smp_g(x), smp_g(x))


def test_what_a_g_offers(tiny):
    g, _ = tiny
    assert g.input_divisor() == 1 and cfg_of().input_divisor == 1
    assert g.checkpoint_units() == ["encoder.layer1", "encoder.layer2", "decoder"]
    scripted = torch.jit.script(build_generator_for_weights(cfg_of(encoder_depth=3, decoder_channels=8), 3).eval())
    assert scripted(torch.randn(1, 3, 33, 33)).shape == (1, 3, 33, 33)


def test_no_aux_head_and_no_smp_directory(tmp_path):
    """Not smp's class: segadv-ckpt convert --smp refuses rather than write what smp cannot open."""
    from segadv.checkpoint.smp_dir import save_smp_dir

    with pytest.raises(ValueError, match="deeplabv3plus_unimatch has no aux output"):
        cfg_of(aux_head=True)
    g = build_generator_for_weights(cfg_of(encoder_depth=3, decoder_channels=8), num_classes=3)
    with pytest.raises(UserError, match="--smp: smp.from_pretrained cannot build UniMatchDeepLabV3Plus"):
        save_smp_dir(g, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unimatch_v1_trains_resumes_bitwise_and_exports_it_at_an_odd_size(tmp_path):
    """A tiny V1 run on it at 33 px (UniMatch crops 321: no multiple of the stride), resumed from its
    mid-run checkpoint into a new run dir, ends where it ended; its ONNX export checks."""
    import json

    from conftest import TINY_OVERRIDES
    from segadv.checkpoint import read_checkpoint
    from segadv.cli.export import main as export_main
    from segadv.cli.train import main as train_main

    overrides = [*TINY_OVERRIDES, "model.generator.arch=deeplabv3plus_unimatch", "data.synthetic.image_size=33",
                 "method.name=unimatch", "method.unimatch.variant=v1", "method.unimatch.confidence=0.2",
                 "data.labeled_fraction=0.5",
                 "train.eval_every=100", "log.num_images=0", "log.tensorboard=false", "train.deterministic=true"]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert train_main(["--device-map", "cpu", "--run-dir", str(full), *overrides]) == 0
    assert train_main(["--device-map", "cpu", "--run-dir", str(resumed), "--resume",
                       str(full / "checkpoints" / "step_2.pt"), *overrides]) == 0
    ended, again = (read_checkpoint(run / "checkpoints" / "last.pt") for run in (full, resumed))
    assert ended["step"] == again["step"] == 4
    assert any(k.startswith("decoder.fuse.3.") for k in ended["generator"])
    for name, tensor in ended["generator"].items():
        assert torch.equal(tensor, again["generator"][name]), name

    onnx = pytest.importorskip("onnx")
    output = tmp_path / "g.onnx"
    assert export_main(["--checkpoint", str(resumed / "checkpoints" / "last.pt"), "--output", str(output),
                        "--input-size", "33", "33"]) == 0
    onnx.checker.check_model(str(output))
    assert json.loads((tmp_path / "g.onnx.json").read_text())["generator"]["arch"] == "deeplabv3plus_unimatch"
