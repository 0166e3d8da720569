"""The references' own DeepLab-v2 state dicts load into segadv's DeepLab-v2 (model.generator.layout:
caffe) and compute what the references compute (segadv/checkpoint/reference_weights.py).

The reference networks below are transcribed from their repositories, unchanged but for the parts
no forward reads (``get_*_lr_params``, ``optim_parameters``, ``outS``, ``BasicBlock``):
- ``Bottleneck``, ``Classifier_Module``, ``ResNet`` (``Res_Deeplab``): hfslyc/AdvSemiSeg
  841d546c927605747594be726622363bf781cefb, model/deeplab.py lines 54-177;
- ``ClassifierModuleMulti``, ``ResNetMulti`` (``DeeplabMulti``): wasidennis/AdaptSegNet
  fca9ff0f09dab45d44bf6d26091377ac66607028, model/deeplab_multi.py lines 103-183 (its
  ``Bottleneck``, lines 56-100, is AdvSemiSeg's, character for character);
- ``ClassifierModuleAdvent``: valeoai/ADVENT 3e58d45a32fb9763a9d1b459326e1dec7caafe78,
  advent/model/deeplabv2.py lines 49-65 (no early return), in ``ResNetMulti``'s place of the
  classifier (ADVENT's ResNetMulti, lines 68-129, is AdaptSegNet's with ``multi_level``).
And each upsamples its logits as its training script does: ``nn.Upsample(size=..., mode='bilinear',
align_corners=True)`` (AdvSemiSeg train.py 297-298, AdaptSegNet pytorch_0.4/train_gta2cityscapes_multi.py
250-251, ADVENT advent/domain_adaptation/train_UDA.py 73-76).

The test depth is ResNet-50's (``[3, 4, 6, 3]``, smp's resnet50: the Bottleneck ResNet the CPU runs
at 321 px in seconds); the key map is also checked at ResNet-101's ``[3, 4, 23, 3]``.
"""

import logging

import pytest
import torch
from torch import nn

from segadv.checkpoint.inference import load_generator
from segadv.checkpoint.loader import load_weights
from segadv.checkpoint.reference_weights import ReferenceWeightsMismatch
from segadv.config import dump_config, load_config
from segadv.config.schema import GeneratorConfig
from segadv.models import build_generator

pytestmark = pytest.mark.usefixtures("one_torch_thread")

affine_par = True
RESNET50, RESNET101 = [3, 4, 6, 3], [3, 4, 23, 3]
CLASSES, SIZE = 21, 321


# ---------------------------------------------------------------- hfslyc/AdvSemiSeg model/deeplab.py


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, dilation=1, downsample=None):
        super(Bottleneck, self).__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False) # change
        self.bn1 = nn.BatchNorm2d(planes,affine = affine_par)
        for i in self.bn1.parameters():
            i.requires_grad = False

        padding = dilation
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, # change
                               padding=padding, bias=False, dilation = dilation)
        self.bn2 = nn.BatchNorm2d(planes,affine = affine_par)
        for i in self.bn2.parameters():
            i.requires_grad = False
        self.conv3 = nn.Conv2d(planes, planes * 4, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4, affine = affine_par)
        for i in self.bn3.parameters():
            i.requires_grad = False
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride


    def forward(self, x):
        residual = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)

        out = self.conv3(out)
        out = self.bn3(out)

        if self.downsample is not None:
            residual = self.downsample(x)

        out += residual
        out = self.relu(out)

        return out

class Classifier_Module(nn.Module):

    def __init__(self, dilation_series, padding_series, num_classes):
        super(Classifier_Module, self).__init__()
        self.conv2d_list = nn.ModuleList()
        for dilation, padding in zip(dilation_series, padding_series):
            self.conv2d_list.append(nn.Conv2d(2048, num_classes, kernel_size=3, stride=1, padding=padding, dilation=dilation, bias = True))

        for m in self.conv2d_list:
            m.weight.data.normal_(0, 0.01)

    def forward(self, x):
        out = self.conv2d_list[0](x)
        for i in range(len(self.conv2d_list)-1):
            out += self.conv2d_list[i+1](x)
            return out



class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes):
        self.inplanes = 64
        super(ResNet, self).__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(64, affine = affine_par)
        for i in self.bn1.parameters():
            i.requires_grad = False
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1, ceil_mode=True) # change
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=1, dilation=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=1, dilation=4)
        self.layer5 = self._make_pred_layer(Classifier_Module, [6,12,18,24],[6,12,18,24],num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, 0.01)
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
        #        for i in m.parameters():
        #            i.requires_grad = False

    def _make_layer(self, block, planes, blocks, stride=1, dilation=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion or dilation == 2 or dilation == 4:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion,
                          kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion,affine = affine_par))
        for i in downsample._modules['1'].parameters():
            i.requires_grad = False
        layers = []
        layers.append(block(self.inplanes, planes, stride,dilation=dilation, downsample=downsample))
        self.inplanes = planes * block.expansion
        for i in range(1, blocks):
            layers.append(block(self.inplanes, planes, dilation=dilation))

        return nn.Sequential(*layers)
    def _make_pred_layer(self,block, dilation_series, padding_series,num_classes):
        return block(dilation_series,padding_series,num_classes)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.layer5(x)

        return x


# ------------------------------------------------------- wasidennis/AdaptSegNet model/deeplab_multi.py


class ClassifierModuleMulti(nn.Module):  # AdaptSegNet's Classifier_Module (it takes inplanes)
    def __init__(self, inplanes, dilation_series, padding_series, num_classes):
        super(ClassifierModuleMulti, self).__init__()
        self.conv2d_list = nn.ModuleList()
        for dilation, padding in zip(dilation_series, padding_series):
            self.conv2d_list.append(
                nn.Conv2d(inplanes, num_classes, kernel_size=3, stride=1, padding=padding, dilation=dilation, bias=True))

        for m in self.conv2d_list:
            m.weight.data.normal_(0, 0.01)

    def forward(self, x):
        out = self.conv2d_list[0](x)
        for i in range(len(self.conv2d_list) - 1):
            out += self.conv2d_list[i + 1](x)
            return out


# ---------------------------------------------------------- valeoai/ADVENT advent/model/deeplabv2.py


class ClassifierModuleAdvent(nn.Module):
    def __init__(self, inplanes, dilation_series, padding_series, num_classes):
        super(ClassifierModuleAdvent, self).__init__()
        self.conv2d_list = nn.ModuleList()
        for dilation, padding in zip(dilation_series, padding_series):
            self.conv2d_list.append(
                nn.Conv2d(inplanes, num_classes, kernel_size=3, stride=1, padding=padding,
                          dilation=dilation, bias=True))

        for m in self.conv2d_list:
            m.weight.data.normal_(0, 0.01)

    def forward(self, x):
        out = self.conv2d_list[0](x)
        for i in range(len(self.conv2d_list) - 1):
            out += self.conv2d_list[i + 1](x)
        return out


class ResNetMulti(nn.Module):
    def __init__(self, block, layers, num_classes, Classifier_Module=ClassifierModuleMulti):
        self.inplanes = 64
        super(ResNetMulti, self).__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(64, affine=affine_par)
        for i in self.bn1.parameters():
            i.requires_grad = False
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1, ceil_mode=True)  # change
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=1, dilation=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=1, dilation=4)
        self.layer5 = self._make_pred_layer(Classifier_Module, 1024, [6, 12, 18, 24], [6, 12, 18, 24], num_classes)
        self.layer6 = self._make_pred_layer(Classifier_Module, 2048, [6, 12, 18, 24], [6, 12, 18, 24], num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, 0.01)
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
                #        for i in m.parameters():
                #            i.requires_grad = False

    def _make_layer(self, block, planes, blocks, stride=1, dilation=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion or dilation == 2 or dilation == 4:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion,
                          kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion, affine=affine_par))
        for i in downsample._modules['1'].parameters():
            i.requires_grad = False
        layers = []
        layers.append(block(self.inplanes, planes, stride, dilation=dilation, downsample=downsample))
        self.inplanes = planes * block.expansion
        for i in range(1, blocks):
            layers.append(block(self.inplanes, planes, dilation=dilation))

        return nn.Sequential(*layers)

    def _make_pred_layer(self, block, inplanes, dilation_series, padding_series, num_classes):
        return block(inplanes, dilation_series, padding_series, num_classes)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)

        x = self.layer3(x)
        x1 = self.layer5(x)

        x2 = self.layer4(x)
        x2 = self.layer6(x2)

        return x1, x2


# ------------------------------------------------------------------------------------ helpers


def trained_looking(net: nn.Module, seed: int) -> nn.Module:
    """Weights a trained network could have: the references' N(0, 0.01) init makes a deep net's
    output vanish, so conv weights are He-scaled and every BatchNorm gets its own statistics and
    affine, so that every tensor the map moves changes the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.Conv2d):
                fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (2.0 / fan_in) ** 0.5 * 0.8)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
            elif isinstance(m, nn.BatchNorm2d):
                for t, lo, hi in ((m.weight, 0.5, 1.2), (m.running_var, 0.5, 2.0)):
                    t.copy_(lo + (hi - lo) * torch.rand(t.shape, generator=gen))
                for t in (m.bias, m.running_mean):
                    t.copy_(torch.randn(t.shape, generator=gen) * 0.1)
    return net.eval()


def interp(logits, size=SIZE):
    return nn.Upsample(size=(size, size), mode="bilinear", align_corners=True)(logits)


def caffe_cfg(encoder="resnet50", rates="early_return", aux=False, layout="caffe"):
    return GeneratorConfig(arch="deeplabv2", encoder=encoder, output_stride=8, layout=layout,
                           aspp_v2_rates=rates, aux_head=aux)


def config_file(tmp_path, **generator):
    settings = {"encoder": "resnet50", "encoder_depth": 5, "aspp_v2_rates": "early_return", "layout": "caffe",
                **generator}
    cfg = load_config(None, ["model.generator.arch=deeplabv2", "model.generator.output_stride=8",
                             *[f"model.generator.{k}={v}" for k, v in settings.items()],
                             f"data.num_classes={CLASSES}", "data.kind=folder", f"data.root={tmp_path / 'data'}",
                             f"data.val_transforms=[{{name: Resize, height: {SIZE}, width: {SIZE}}}]"])
    dump_config(cfg, tmp_path / "config.yaml")
    return tmp_path / "config.yaml"


@pytest.fixture(scope="module")
def res_deeplab():
    torch.manual_seed(0)
    return trained_looking(ResNet(Bottleneck, RESNET50, CLASSES), seed=1)


@pytest.fixture(scope="module")
def deeplab_multi():
    torch.manual_seed(0)
    return trained_looking(ResNetMulti(Bottleneck, RESNET50, CLASSES), seed=2)


@pytest.fixture(scope="module")
def image():
    return torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3))


# -------------------------------------------------------------------------------------- tests


def test_a_res_deeplab_file_gives_the_references_logits(tmp_path, res_deeplab, image, caplog):
    """AdvSemiSeg's Res_Deeplab, saved as its train.py saves it (the legacy format and, from PyTorch
    0.3, no num_batches_tracked: the published files), read by segadv's inference loader (segadv-eval,
    -export, -predict): the same 41x41 logits at 321 px and the same upsampled ones."""
    published = {k: v for k, v in res_deeplab.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(published, tmp_path / "VOC_20000.pth", _use_new_zipfile_serialization=False)
    with caplog.at_level(logging.INFO):
        loaded = load_generator(tmp_path / "VOC_20000.pth", str(config_file(tmp_path)))
    assert "Res_Deeplab" in caplog.text and "num_batches_tracked" in caplog.text
    g = loaded.model
    with torch.no_grad():
        expected = res_deeplab(image)
        coarse = g.segmentation_head(g.encoder(image)[-1])
        got = g(image)
    assert expected.shape == coarse.shape == (1, CLASSES, 41, 41)
    assert float(expected.std()) > 0.1  # the weights reach the logits
    diff = float((coarse - expected).abs().max())
    assert diff < 1e-4 * float(expected.abs().max()), diff
    assert got.shape == (1, CLASSES, SIZE, SIZE)
    torch.testing.assert_close(got, interp(expected), rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


@pytest.mark.parametrize("classifier, rates", [(ClassifierModuleMulti, "early_return"),
                                               (ClassifierModuleAdvent, "paper")])
def test_a_multi_level_file_gives_both_outputs(classifier, rates, image, deeplab_multi):
    """AdaptSegNet's DeeplabMulti (two branches summed) and ADVENT's ResNetMulti (four): layer5 is
    the aux output on layer3, layer6 the main one; both upsampled as the references do, and the loss
    the references train on (main + 0.1 x aux) has the same gradient on every classifier weight."""
    if classifier is ClassifierModuleMulti:
        reference = deeplab_multi
    else:
        torch.manual_seed(0)
        reference = trained_looking(ResNetMulti(Bottleneck, RESNET50, CLASSES, classifier), seed=2)
    g = build_generator(caffe_cfg(rates=rates, aux=True), CLASSES).eval()
    report = load_weights(reference.state_dict(), g)
    assert set(report.loaded) == set(g.state_dict())
    # The gradient asked about is the classifiers': the backbones' backward would only cost time.
    for p in [*g.encoder.parameters(), *[p for n, p in reference.named_parameters() if not n.startswith("layer")],
              *[p for n in ("layer1", "layer2", "layer3", "layer4") for p in getattr(reference, n).parameters()]]:
        p.requires_grad_(False)
    labels = torch.randint(0, CLASSES, (1, SIZE, SIZE), generator=torch.Generator().manual_seed(4))
    ref_aux, ref_main = reference(image)
    ref_aux, ref_main = interp(ref_aux), interp(ref_main)
    main, aux = g(image, return_aux=True)
    scale = float(ref_main.detach().abs().max())
    for got, expected in ((main, ref_main), (aux, ref_aux)):
        assert float(expected.detach().std()) > 0.1
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * scale)
    ce = nn.CrossEntropyLoss()
    (ce(ref_main, labels) + 0.1 * ce(ref_aux, labels)).backward()
    (ce(main, labels) + 0.1 * ce(aux, labels)).backward()
    for ours, theirs in ((g.segmentation_head[0].branches, reference.layer6.conv2d_list),
                         (g.aux_head.branches, reference.layer5.conv2d_list)):
        for branch, conv in zip(ours, theirs):
            torch.testing.assert_close(branch.weight.grad, conv.weight.grad, rtol=1e-3, atol=1e-6)
            torch.testing.assert_close(branch.bias.grad, conv.bias.grad, rtol=1e-3, atol=1e-6)


def test_the_key_map_holds_at_resnet101s_depth():
    """DeeplabMulti at its own depth ([3, 4, 23, 3]) into segadv's resnet101, every tensor in its
    place: a small input gives the same two outputs."""
    torch.manual_seed(0)
    reference = trained_looking(ResNetMulti(Bottleneck, RESNET101, CLASSES), seed=5)
    g = build_generator(caffe_cfg(encoder="resnet101", aux=True), CLASSES).eval()
    load_weights({f"module.{k}": v for k, v in reference.state_dict().items()}, g)  # saved from DataParallel
    x = torch.randn(1, 3, 57, 57)
    with torch.no_grad():
        ref_aux, ref_main = reference(x)
        main, aux = g(x, return_aux=True)
    for got, expected in ((main, ref_main), (aux, ref_aux)):
        torch.testing.assert_close(got, interp(expected, 57), rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_an_init_file_starts_the_encoder_of_another_class_count(res_deeplab, caplog):
    """The references' init files (``Scale.``-prefixed Res_Deeplab, a 21-class classifier) as
    init.generator.path for a 19-class multi-level G: excluding the heads, the encoder loads, each
    tensor from the file's; without the exclusion the first misfit is named."""
    init = {f"Scale.{k}": v for k, v in res_deeplab.state_dict().items()}
    g = build_generator(caffe_cfg(aux=True, rates="paper"), 19)
    fresh_head = g.segmentation_head[0].branches[0].weight.clone()
    load_weights(init, g, exclude=["segmentation_head.*", "aux_head.*"])
    assert torch.equal(g.encoder.layer4[2].conv3.weight, res_deeplab.layer4[2].conv3.weight)
    assert torch.equal(g.encoder.bn1.running_var, res_deeplab.bn1.running_var)
    assert torch.equal(g.segmentation_head[0].branches[0].weight, fresh_head)
    with pytest.raises(ReferenceWeightsMismatch, match=r"'Scale.layer5.conv2d_list.0.weight' .* shape \(21, 2048, 3, 3\)"):
        load_weights(init, g)


def test_what_does_not_fit_is_named(res_deeplab):
    state = res_deeplab.state_dict()
    g = build_generator(caffe_cfg(), CLASSES)
    with pytest.raises(ReferenceWeightsMismatch, match=r"key 'fc.weight' is no part"):
        load_weights({**state, "fc.weight": torch.zeros(1000, 2048)}, g)
    with pytest.raises(ReferenceWeightsMismatch, match=r"'encoder.layer4.1.bn2.running_var' is not in the file "
                                                      r"\(it would be 'layer4.1.bn2.running_var'\)"):
        load_weights({k: v for k, v in state.items() if k != "layer4.1.bn2.running_var"}, g)
    with pytest.raises(ReferenceWeightsMismatch, match=r"'layer1.0.conv1.weight' \(encoder.layer1.0.conv1.weight\) has shape"):
        load_weights(state, build_generator(caffe_cfg(encoder="resnet18"), CLASSES))  # another encoder
    with pytest.raises(ReferenceWeightsMismatch, match=r"aspp_v2_rates paper or early_return"):
        load_weights(state, build_generator(caffe_cfg(rates=[1, 2]), CLASSES))
    with pytest.raises(ReferenceWeightsMismatch, match=r"'aux_head.branches.0.weight' is not in the file"):
        load_weights(state, build_generator(caffe_cfg(aux=True), CLASSES))  # a single-level file


def test_segadv_eval_evaluates_a_references_final_model(tmp_path, res_deeplab, capsys):
    """segadv-eval --checkpoint on a Res_Deeplab file with the config describing it: it runs, and a
    file of another class count exits 2 naming the key."""
    import json

    from data_builders import make_folder
    from segadv.cli.eval import main as eval_main

    make_folder(tmp_path / "data", n_train=1, n_val=1, num_classes=CLASSES, h=SIZE, w=SIZE)
    config = str(config_file(tmp_path))
    torch.save(res_deeplab.state_dict(), tmp_path / "ref.pth")
    assert eval_main(["--checkpoint", str(tmp_path / "ref.pth"), "--config", config, "--json", "--device", "cpu"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= metrics["mIoU"] <= 1.0 and len(metrics["iou"]) == CLASSES
    torch.save({k: (v[:19] if k.startswith("layer5") else v) for k, v in res_deeplab.state_dict().items()},
               tmp_path / "voc19.pth")
    assert eval_main(["--checkpoint", str(tmp_path / "voc19.pth"), "--config", config, "--device", "cpu"]) == 2
    assert "layer5.conv2d_list.0.weight" in capsys.readouterr().err


def test_a_file_missing_only_conv1_weight_names_that_key_alone(res_deeplab):
    """Without conv1.weight the file is still a Res_Deeplab one: the missing key is named with the
    count, never every key of the model as missing from "an unknown network"."""
    state = {k: v for k, v in res_deeplab.state_dict().items() if k != "conv1.weight"}
    with pytest.raises(ReferenceWeightsMismatch, match=r"Res_Deeplab .*'encoder.conv1.weight' is not in the file "
                                                      r"\(it would be 'conv1.weight'\) \(the only one missing\)"):
        load_weights(state, build_generator(caffe_cfg(), CLASSES))


def test_ckpt_inspect_recognises_a_reference_layout(tmp_path, res_deeplab, deeplab_multi):
    from segadv.cli.ckpt import inspect

    for net, layout in ((res_deeplab, "Res_Deeplab"), (deeplab_multi, "DeeplabMulti")):
        path = tmp_path / f"{layout}.pth"
        torch.save(net.state_dict(), path)
        report = inspect(str(path), trusted=False)
        assert f"looks like a DeepLab-v2 generator in the layout of {layout}" in report, report
        assert "unknown network" not in report
