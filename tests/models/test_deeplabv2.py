"""DeepLab-v2 (model.generator.arch: deeplabv2) held to the references' network.

``ReferenceClassifier`` below transcribes the references' ``Classifier_Module`` (AdaptSegNet's
model/deeplab_multi.py, AdvSemiSeg's and s4GAN's model/deeplab.py / deeplabv2.py; ADVENT's
``ClassifierModule`` is the same without the early return): four 3x3 convolutions to the classes,
dilation = padding = 6, 12, 18, 24, weights N(0, 0.01), biases left at torch's default, the outputs
summed, the loop returning after its first addition in all but ADVENT's.
"""

import pytest
import torch
from torch import nn

from segadv.config.schema import GeneratorConfig
from segadv.models import build_generator, build_generator_for_weights
from segadv.models.deeplab.deeplabv2 import ASPP_V2_RATES, ASPPV2Classifier

REFERENCE_RATES = [6, 12, 18, 24]


class ReferenceClassifier(nn.Module):
    """The references' Classifier_Module, transcribed; ``returns_early`` is their loop's ``return``
    inside the loop (AdaptSegNet, AdvSemiSeg, s4GAN), off for ADVENT's."""

    def __init__(self, inplanes, dilation_series, padding_series, num_classes, returns_early):
        super().__init__()
        self.returns_early = returns_early
        self.conv2d_list = nn.ModuleList()
        for dilation, padding in zip(dilation_series, padding_series):
            self.conv2d_list.append(nn.Conv2d(inplanes, num_classes, kernel_size=3, stride=1, padding=padding,
                                              dilation=dilation, bias=True))
        for m in self.conv2d_list:
            m.weight.data.normal_(0, 0.01)

    def forward(self, x):
        out = self.conv2d_list[0](x)
        for i in range(len(self.conv2d_list) - 1):
            out += self.conv2d_list[i + 1](x)
            if self.returns_early:
                return out
        return out


def reference(returns_early, inplanes=32, classes=5, seed=0):
    torch.manual_seed(seed)
    return ReferenceClassifier(inplanes, REFERENCE_RATES, REFERENCE_RATES, classes, returns_early)


@pytest.mark.parametrize("setting, returns_early", [("early_return", True), ("paper", False)])
def test_the_head_computes_the_references_classifier(setting, returns_early):
    """Same weights in, same logits out, bitwise (the same sums in the same order), at the input's
    size: early_return is the references' four-conv module whose loop returns after the second."""
    ref = reference(returns_early)
    head = ASPPV2Classifier(32, 5, ASPP_V2_RATES[setting])
    assert len(head.branches) == (2 if returns_early else 4)
    for branch, conv in zip(head.branches, ref.conv2d_list):
        assert (branch.dilation, branch.padding) == (conv.dilation, conv.padding)
        branch.load_state_dict(conv.state_dict())
    x = torch.randn(2, 32, 13, 17)
    got, expected = head(x), ref(x)
    assert got.shape == (2, 5, 13, 17)
    assert torch.equal(got, expected)
    if returns_early:  # the trap is real: the last two of the reference's convolutions never count
        all_four = sum(conv(x) for conv in ref.conv2d_list)
        assert not torch.allclose(expected, all_four)
        with torch.no_grad():
            ref.conv2d_list[2].weight.add_(1.0)
            ref.conv2d_list[3].bias.add_(1.0)
        assert torch.equal(ref(x), expected)


def test_the_four_branch_head_is_initialised_as_the_reference_bitwise():
    """Built in the same order from the same seed: the same numbers (weights N(0, 0.01), torch's
    default biases)."""
    ref = reference(returns_early=False, seed=3)
    torch.manual_seed(3)
    head = ASPPV2Classifier(32, 5, ASPP_V2_RATES["paper"])
    for branch, conv in zip(head.branches, ref.conv2d_list):
        assert torch.equal(branch.weight, conv.weight) and torch.equal(branch.bias, conv.bias)


@pytest.mark.parametrize("setting", ["early_return", "paper"])
def test_the_heads_initialisation_has_the_references_distribution(setting):
    """Weights N(0, 0.01); biases torch's default, uniform within 1/sqrt(fan_in) and not zero
    (the references never set them), as the transcription's at ResNet-101's 2048 channels."""
    torch.manual_seed(0)
    head = ASPPV2Classifier(2048, 19, ASPP_V2_RATES[setting])
    ref = reference(returns_early=False, inplanes=2048, classes=19)
    bound = 1 / (2048 * 9) ** 0.5
    for module in (head.branches, ref.conv2d_list):
        weights = torch.cat([conv.weight.detach().flatten() for conv in module])
        biases = torch.cat([conv.bias.detach() for conv in module])
        assert abs(float(weights.std()) - 0.01) < 0.0002 and abs(float(weights.mean())) < 0.0002
        assert float(biases.abs().max()) <= bound and float(biases.abs().max()) > bound / 4


def cfg_of(**kwargs):
    settings = dict(arch="deeplabv2", encoder="resnet18", encoder_depth=5, output_stride=8)
    return GeneratorConfig(**{**settings, **kwargs})


def test_the_generator_is_deeplab_v2_at_output_stride_8():
    """smp's encoder dilated by its own make_dilated (layer3 dilation 2, layer4 4, no stride after
    layer2), the classifier on layer4 upsampled to the input; no BatchNorm and no pooling after
    the encoder; the aux output (AdaptSegNet's DeeplabMulti) is the same classifier on layer3."""
    torch.manual_seed(0)
    g = build_generator(cfg_of(aux_head=True, aspp_v2_rates="early_return"), num_classes=7)
    assert g.encoder.layer3[0].conv2.dilation == (2, 2) and g.encoder.layer4[0].conv2.dilation == (4, 4)
    assert g.encoder.layer3[0].conv1.stride == (1, 1) and g.encoder.layer4[0].downsample[0].stride == (1, 1)
    head, aux = g.segmentation_head[0], g.aux_head
    assert isinstance(head, ASPPV2Classifier) and isinstance(aux, ASPPV2Classifier)
    assert [b.dilation[0] for b in head.branches] == [6, 12] == [b.dilation[0] for b in aux.branches]
    assert head.branches[0].in_channels == 512 and aux.branches[0].in_channels == 256
    after_encoder = [m for name, m in g.named_modules() if not name.startswith("encoder")]
    assert not any(isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.AdaptiveAvgPool2d)) for m in after_encoder)
    x = torch.randn(1, 3, 64, 64)  # a batch of one trains: no layer sees one value per channel
    g.train()
    main, aux_out = g(x, return_aux=True)
    assert main.shape == aux_out.shape == (1, 7, 64, 64)
    (main.sum() + aux_out.sum()).backward()
    assert [n for n, p in g.named_parameters() if p.grad is None] == []
    assert torch.equal(g.eval()(x), g(x, return_aux=True)[0])  # the main output is forward(x)


def test_custom_rates_and_a_shallow_encoder():
    torch.manual_seed(0)
    g = build_generator(cfg_of(encoder="mobilenet_v2", encoder_depth=3, aspp_v2_rates=[1, 2, 3]), num_classes=4)
    assert [b.dilation[0] for b in g.segmentation_head[0].branches] == [1, 2, 3]
    out = g(torch.randn(2, 3, 48, 48))
    assert out.shape == (2, 4, 48, 48)
    out.sum().backward()
    assert [n for n, p in g.named_parameters() if p.grad is None] == []


def test_the_inference_generator_loads_a_trained_ones_weights_strictly():
    """The trained G's state dict (aux head and all) through segadv's one strict loader into the
    inference G: the aux head's keys left out, every other one loaded; the outputs agree."""
    from segadv.checkpoint.loader import CheckpointMismatchError, load_weights

    cfg = cfg_of(encoder="resnet18", encoder_depth=4, aux_head=True, norm="frozen_affine",
                 aspp_v2_rates="early_return")
    torch.manual_seed(1)
    trained = build_generator(cfg, num_classes=3).eval()
    plain = build_generator_for_weights(cfg, num_classes=3).eval()
    report = load_weights(trained.state_dict(), plain)
    assert sorted(report.loaded) == sorted(plain.state_dict())
    x = torch.randn(1, 3, 64, 64)
    assert torch.equal(plain(x), trained(x))
    assert all(p.requires_grad for p in plain.parameters())  # inference G: plain BatchNorm
    four_branches = build_generator_for_weights(cfg.model_copy(update={"aspp_v2_rates": "paper"}), num_classes=3)
    with pytest.raises(CheckpointMismatchError, match="segmentation_head"):
        load_weights(trained.state_dict(), four_branches)  # strict: the two-branch file lacks two branches


def test_smp_save_pretrained_refuses_deeplabv2(tmp_path):
    """smp.from_pretrained cannot build a class that is not smp's: segadv-ckpt convert --smp says
    so instead of writing a directory nothing can open."""
    from segadv.checkpoint.smp_dir import save_smp_dir
    from segadv.errors import UserError

    g = build_generator_for_weights(cfg_of(encoder_depth=4), num_classes=3)
    with pytest.raises(UserError, match="--smp: smp.from_pretrained cannot build DeepLabV2"):
        save_smp_dir(g, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_both_outputs_and_their_gradient_are_the_references():
    """The multi-level G against a transcription of the references' forward on the same encoder
    features: DeeplabMulti's two Classifier_Modules (layer5 on layer3, layer6 on layer4) and the
    training scripts' ``interp``, ``nn.Upsample(size=input, mode='bilinear', align_corners=True)``
    on both outputs (AdaptSegNet pytorch_0.4/train_gta2cityscapes_multi.py 250-251, 302-303; ADVENT
    train_UDA.py 73-76). The aux output and the gradient of the loss they train on, main + 0.1 x aux,
    are the transcription's, bitwise; the aux output at align_corners=False is not."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    g = build_generator(cfg_of(aux_head=True, aspp_v2_rates="paper"), num_classes=5).eval()
    main_ref = ReferenceClassifier(512, REFERENCE_RATES, REFERENCE_RATES, 5, returns_early=False)
    aux_ref = ReferenceClassifier(256, REFERENCE_RATES, REFERENCE_RATES, 5, returns_early=False)
    main_ref.conv2d_list.load_state_dict(g.segmentation_head[0].branches.state_dict())
    aux_ref.conv2d_list.load_state_dict(g.aux_head.branches.state_dict())
    x = torch.randn(2, 3, 72, 56)
    labels = torch.randint(0, 5, (2, 72, 56))
    interp = nn.Upsample(size=(72, 56), mode="bilinear", align_corners=True)
    features = g.encoder(x)
    ref_main, ref_aux = interp(main_ref(features[-1])), interp(aux_ref(features[-2]))
    main, aux = g(x, return_aux=True)
    assert torch.equal(main, ref_main) and torch.equal(aux, ref_aux)
    misaligned = F.interpolate(aux_ref(features[-2]), size=(72, 56), mode="bilinear", align_corners=False)
    assert float((misaligned - ref_aux).detach().abs().max()) > 1e-3
    loss = lambda m, a: F.cross_entropy(m, labels) + 0.1 * F.cross_entropy(a, labels)  # noqa: E731
    ours = torch.autograd.grad(loss(main, aux), [*g.segmentation_head.parameters(), *g.aux_head.parameters()])
    theirs = torch.autograd.grad(loss(ref_main, ref_aux), [*main_ref.parameters(), *aux_ref.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("size, logits", [(321, 41), (513, 65), (512, 65), (320, 41)])
def test_the_caffe_layout_has_the_references_geometry(size, logits):
    """layout: caffe strides in each Bottleneck's 1x1 convolution and pools with ceil_mode, as
    Res_Deeplab; its logits have the references' sizes (41x41 at 321 px; 65x65 at 513 and at 512,
    where smp's layout gives 64) and G's output the input's, whatever it is."""
    g = build_generator(cfg_of(encoder="resnet50", layout="caffe", encoder_depth=3), num_classes=3).eval()
    assert g.encoder.maxpool.ceil_mode
    assert g.encoder.layer2[0].conv1.stride == (2, 2) and g.encoder.layer2[0].conv2.stride == (1, 1)
    assert g.encoder.layer2[0].downsample[0].stride == (2, 2)
    smp_layout = build_generator(cfg_of(encoder="resnet50", encoder_depth=3), num_classes=3)
    assert smp_layout.encoder.layer2[0].conv2.stride == (2, 2) and not smp_layout.encoder.maxpool.ceil_mode
    x = torch.zeros(1, 3, size, size)
    with torch.no_grad():
        assert g.encoder(x)[-1].shape[-2:] == (logits, logits)
        assert g(x).shape == (1, 3, size, size)


def test_any_input_size_reaches_deeplabv2():
    """No layer after the encoder fuses two resolutions: smp's divisibility check does not apply
    (export's size divisor is 1)."""
    from segadv.export.wrapper import size_divisor

    g = build_generator(cfg_of(encoder_depth=5), num_classes=3).eval()
    assert size_divisor(g) == 1
    with torch.no_grad():
        assert g(torch.zeros(1, 3, 77, 50)).shape == (1, 3, 77, 50)


def test_the_caffe_layout_is_deeplabv2s_and_a_resnets():
    from pydantic import ValidationError

    from segadv.errors import UserError

    with pytest.raises(ValidationError, match="deeplabv3plus builds its encoder in layout smp, not caffe"):
        GeneratorConfig(arch="deeplabv3plus", layout="caffe")
    with pytest.raises(UserError, match="model.generator.layout: caffe is a layout of a ResNet encoder"):
        build_generator(cfg_of(encoder="mobilenet_v2", layout="caffe"), num_classes=3)
