"""data.val_input_size: evaluation as AdaptSegNet (fca9ff0) and ADVENT (3e58d45) evaluate.

Their evaluation resizes each Cityscapes val image to 1024x512 with PIL's BICUBIC
(AdaptSegNet dataset/cityscapes_dataset.py:45, ADVENT advent/dataset/base_dataset.py:41), subtracts
the Caffe BGR mean, runs the network, upsamples its raw output once with
``nn.Upsample(size=(1024, 2048), mode='bilinear', align_corners=True)`` (AdaptSegNet
evaluate_cityscapes.py:117-122, ADVENT eval_UDA.py:26), takes the argmax and scores it against
the full-size label (``fast_hist``: a bincount of ``n * label + pred`` over the valid pixels).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from conftest import needs_planner_torch
from segadv.config import load_config
from segadv.config.schema import DataConfig
from segadv.data.bundle import val_transform
from segadv.data.loaders import ValCollate
from segadv.engine.evaluate import evaluate
from segadv.models.deeplab.deeplabv2 import DeepLabV2

NUM_CLASSES = 5
FULL = (40, 72)  # the label's (H, W): the references' 1024x2048, scaled down
INPUT_WH = (48, 24)  # data.val_input_size [W, H]: the references' [1024, 512], scaled down
IMG_MEAN_BGR = np.array((104.00698793, 116.66876762, 122.67891434), dtype=np.float32)  # the references' IMG_MEAN


def tiny_deeplabv2() -> nn.Module:
    torch.manual_seed(0)
    net = DeepLabV2(encoder_name="resnet18", encoder_weights=None, classes=NUM_CLASSES)
    # The references' classifier starts at N(0, 0.01): random logits that close tie too often for
    # an argmax comparison to say anything; larger weights spread them.
    for conv in net.segmentation_head[0].branches:
        nn.init.normal_(conv.weight, std=0.5)
    return net.eval()


def samples(count: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        image = rng.integers(0, 256, (*FULL, 3), dtype=np.uint8)
        label = rng.integers(0, NUM_CLASSES, FULL, dtype=np.uint8)
        label[:3] = 255  # ignored rows
        out.append((image, label))
    return out


def reference_evaluation(net: nn.Module, pairs) -> tuple[np.ndarray, np.ndarray]:
    """A transcription of the references' evaluation: predictions and the confusion matrix."""
    interp = nn.Upsample(size=FULL, mode="bilinear", align_corners=True)
    hist = np.zeros((NUM_CLASSES, NUM_CLASSES))
    preds = []
    for image, label in pairs:
        resized = Image.fromarray(image).convert("RGB").resize(INPUT_WH, Image.BICUBIC)
        x = np.asarray(resized, np.float32)[:, :, ::-1] - IMG_MEAN_BGR  # RGB to BGR, less the mean
        x = torch.from_numpy(x.transpose((2, 0, 1)).copy())[None]
        with torch.no_grad():
            raw = net.segmentation_head(net.decoder(net.encoder(x)))  # Res_Deeplab's output: no upsampling
            output = interp(raw).numpy()[0]
        pred = np.argmax(output.transpose(1, 2, 0), axis=2)
        preds.append(pred)
        keep = (label >= 0) & (label < NUM_CLASSES)
        hist += np.bincount(NUM_CLASSES * label[keep].astype(int) + pred[keep],
                            minlength=NUM_CLASSES ** 2).reshape(NUM_CLASSES, NUM_CLASSES)
    return np.stack(preds), hist


def segadv_loader(cfg: DataConfig, pairs):
    transform = val_transform(cfg)
    batch = []
    for image, label in pairs:
        out = transform(image=image, mask=label)
        batch.append((out["image"], out["mask"]))
    return [ValCollate()(batch)]


def test_val_input_size_evaluates_as_the_references_do():
    net, pairs = tiny_deeplabv2(), samples()
    cfg = DataConfig(num_classes=NUM_CLASSES, normalization="caffe_bgr", val_input_size=list(INPUT_WH))
    loader = segadv_loader(cfg, pairs)
    images, labels = loader[0]
    assert tuple(images.shape[-2:]) == INPUT_WH[::-1]  # G's input: the image alone resized
    assert tuple(labels.shape[-2:]) == FULL  # the label never is
    assert torch.equal(labels, torch.from_numpy(np.stack([label for _, label in pairs])))

    ref_preds, ref_hist = reference_evaluation(net, pairs)
    result = evaluate(net, loader, torch.device("cpu"), NUM_CLASSES, num_samples=len(pairs))
    _, sample_labels, preds = result.samples
    assert np.array_equal(preds.numpy(), ref_preds)
    assert np.array_equal(result.confusion.mat.numpy(), ref_hist.astype(np.int64))
    assert len(np.unique(ref_preds)) > 1  # the predictions say something
    # The panel's input is shown at its label's size (one size per panel row).
    assert result.samples[0].shape[-2:] == sample_labels.shape[-2:] == FULL


def test_the_raw_logits_are_upsampled_once_straight_to_the_label_size():
    net = tiny_deeplabv2()
    x = torch.randn(2, 3, *INPUT_WH[::-1])
    with torch.no_grad():
        raw = net.segmentation_head(net.decoder(net.encoder(x)))
        once = nn.Upsample(size=FULL, mode="bilinear", align_corners=True)(raw)
        assert torch.equal(net(x, output_size=FULL), once)
        assert torch.equal(net(x), nn.Upsample(size=x.shape[-2:], mode="bilinear", align_corners=True)(raw))
        twice = nn.functional.interpolate(net(x), size=FULL, mode="bilinear", align_corners=True)
    assert not torch.allclose(twice, once)  # why G needs the output size: a second upsampling differs


def test_the_default_predicts_at_the_image_size_as_before():
    net, pairs = tiny_deeplabv2(), samples(2)
    cfg = DataConfig(num_classes=NUM_CLASSES)
    assert cfg.val_input_size is None
    loader = segadv_loader(cfg, pairs)
    images, labels = loader[0]
    assert images.shape[-2:] == labels.shape[-2:] == FULL
    result = evaluate(net, loader, torch.device("cpu"), NUM_CLASSES, num_samples=2)
    with torch.no_grad():
        assert torch.equal(result.samples[2], net(images).argmax(1))


def test_the_aux_generator_passes_the_output_size_on():
    from segadv.models.deeplab.model import DeepLabV2Aux

    torch.manual_seed(0)
    net = DeepLabV2Aux(encoder_name="resnet18", encoder_weights=None, classes=NUM_CLASSES).eval()
    x = torch.randn(1, 3, 24, 48)
    with torch.no_grad():
        raw = net.segmentation_head(net.decoder(net.encoder(x)))
        expected = nn.functional.interpolate(raw, size=FULL, mode="bilinear", align_corners=True)
        assert torch.equal(net(x, output_size=FULL), expected)


def test_labels_of_different_sizes_are_batched_apart():
    image = torch.zeros(3, 24, 48)
    batch = ValCollate()([(image, torch.zeros(40, 72)), (image, torch.zeros(30, 50)), (image, torch.zeros(40, 72))])
    assert sorted(tuple(labels.shape) for _, labels in batch) == [(1, 30, 50), (2, 40, 72)]


@pytest.mark.parametrize("value", ["[1024]", "[0,512]", "[1024,512,3]", "[1024.5,512]"])
def test_a_bad_value_exits_2_naming_the_key(tmp_path, capsys, value):
    from segadv.cli.train import main as train_main

    code = train_main(["--config", "adaptsegnet_gta5_cityscapes_reference", "--run-dir", str(tmp_path / "run"),
                       f"target_data.val_input_size={value}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "target_data.val_input_size" in err and "Traceback" not in err


def test_help_config_lists_the_key():
    from segadv.config.keys import key_listing

    text = key_listing("data.val_input_size")
    head = next(line for line in text.splitlines() if line.startswith("data.val_input_size:"))
    assert head.endswith("= null") and "int >= 16" in head and "[W, H]" in text and "bicubic" in text


def test_the_reference_configs_evaluate_at_1024x512():
    for name in ("adaptsegnet_gta5_cityscapes_reference", "advent_gta5_cityscapes_reference"):
        cfg = load_config(name)
        assert cfg.target_data.val_input_size == [1024, 512]
        assert cfg.data.val_input_size is None  # GTA5's own val (train.eval_source) as segadv predicts it


@needs_planner_torch
def test_segadv_plan_plans_the_evaluation_at_the_resized_input():
    from segadv.plan.batches import val_size
    from segadv.plan.dry_run import dry_run

    crop = "[{name: Resize, height: 64, width: 64}]"
    overrides = ["device_map=g:1,d:0,d_aux:0", f"data.train_transforms={crop}", f"target_data.train_transforms={crop}",
                 "target_data.val_transforms=[{name: Resize, height: 96, width: 192}]"]
    resized = load_config("adaptsegnet_gta5_cityscapes_reference", overrides + ["target_data.val_input_size=[96,48]"])
    full = load_config("adaptsegnet_gta5_cityscapes_reference", overrides + ["target_data.val_input_size=null"])
    assert val_size(resized.target_data) == ((48, 96), (96, 192))  # G's input; the labels at full size
    assert val_size(full.target_data) == ((96, 192), (96, 192))
    at_resized, at_full = dry_run(resized, steps=1), dry_run(full, steps=1)
    # The same full-size logits and labels, the encoder's activations a quarter of the pixels.
    assert 0 < at_resized.devices["cuda:1"].evaluation_peak_bytes < at_full.devices["cuda:1"].evaluation_peak_bytes
