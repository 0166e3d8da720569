"""data.val_resize_to_multiple: evaluation as UniMatch V2 evaluates Pascal VOC.

LiheYoung/UniMatch-V2 supervised.py ``evaluate`` (mode 'original', ``multiplier=14``; lines
70-81, at d825595 and 70fe066 alike): each val image, normalised at its own size, batch of one, is
resized to ``int(side / 14 + 0.5) * 14`` a side with ``F.interpolate(mode='bilinear',
align_corners=True)``; the DPT's logits (at that size: model/semseg/dpt.py upsamples its head's
output to the patch grid times 14, bilinear, align_corners=True) are resized back to the image's
own size the same way, and their argmax is scored against the label as it is.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import segadv.engine.evaluate as evaluate_module
from data_builders import make_folder
from segadv.config import load_config
from segadv.data.loaders import SizeGroups, ValCollate
from segadv.engine.evaluate import evaluate, resized_to_multiple
from segadv.errors import UserError
from segadv.models.dinov2.dpt import DinoV2DPT
from segadv.parallel import parse_device_map
from segadv.training import preflight

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NUM_CLASSES = 5
# (H, W): 37 and 53 round up (42, 56), 45 and 30 down (42, 28), 35 and 49 are halves (up: 42, 56)
SIZES = [(37, 53), (37, 53), (45, 30), (35, 49)]


def tiny_model() -> DinoV2DPT:
    """tests/models/dinov2_tiny.py's G: 4 blocks of width 32, a narrow head, LayerScale and the
    class token drawn away from timm's near-identity init so the blocks matter; the classifier's
    bias zeroed and its weights spread, so the argmax varies over the image."""
    torch.manual_seed(0)
    model = DinoV2DPT("vit_small_patch14_dinov2", NUM_CLASSES, depth=4, features=16, out_channels=(8, 16, 32, 64),
                      img_size=56, encoder_overrides=dict(embed_dim=32, num_heads=2))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("ls1.gamma", "ls2.gamma")):
                param.uniform_(0.5, 1.0)
            elif name.endswith("cls_token") or (name.startswith("head.scratch.output_conv") and param.dim() > 1):
                param.normal_()
            elif name.startswith("head.scratch.output_conv"):
                param.zero_()
    return model.eval()


def samples() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for h, w in SIZES:
        label = torch.randint(0, NUM_CLASSES, (h, w), generator=gen)
        label[:2] = 255  # ignored rows
        out.append((torch.randn(3, h, w, generator=gen), label))
    return out


def reference_evaluation(model, pairs, multiplier=14):
    """A transcription of the reference's loop, one image at a time: its logits and the confusion
    matrix of their argmax (rows: ground truth)."""
    logits, hist = [], np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64)
    with torch.no_grad():
        for image, mask in pairs:
            img = image[None]
            ori_h, ori_w = img.shape[-2:]
            new_h, new_w = int(ori_h / multiplier + 0.5) * multiplier, int(ori_w / multiplier + 0.5) * multiplier
            img = F.interpolate(img, (new_h, new_w), mode="bilinear", align_corners=True)
            pred = model(img)
            pred = F.interpolate(pred, (ori_h, ori_w), mode="bilinear", align_corners=True)
            logits.append(pred)
            pred, mask = pred.argmax(dim=1)[0].numpy(), mask.numpy()
            keep = mask != 255
            hist += np.bincount(NUM_CLASSES * mask[keep] + pred[keep], minlength=NUM_CLASSES ** 2).reshape(
                NUM_CLASSES, NUM_CLASSES)
    return logits, hist


def batches(pairs) -> list:
    """The pairs as the val loader hands them out: one batch per size."""
    collated = ValCollate()(pairs)
    return list(collated) if isinstance(collated, SizeGroups) else [collated]


@pytest.fixture
def seen(monkeypatch):
    """The (input, logits) of every call evaluation makes of G."""
    calls = []
    real = evaluate_module.logits_at

    def spy(model, network, x, size):
        out = real(model, network, x, size)
        calls.append((x, out))
        return out

    monkeypatch.setattr(evaluate_module, "logits_at", spy)
    return calls


def test_the_logits_and_scores_are_the_references(seen):
    model, pairs = tiny_model(), samples()
    ref_logits, ref_hist = reference_evaluation(model, pairs)
    result = evaluate(model, batches(pairs), torch.device("cpu"), NUM_CLASSES, resize_to_multiple=True)

    assert [tuple(x.shape[-2:]) for x, _ in seen] == [(42, 56), (42, 28), (42, 56)]
    ours = [one[None] for _, out in seen for one in out]
    assert [tuple(t.shape[-2:]) for t in ours] == SIZES  # back at each label's size
    for mine, ref in zip(ours, ref_logits):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)  # a batch of two, theirs of one
    assert np.array_equal(result.confusion.mat.numpy(), ref_hist)
    assert np.count_nonzero(ref_hist.sum(0)) > 1  # the predictions say something


def test_off_the_image_reaches_g_as_it_is_and_a_multiple_is_left_alone():
    model, pairs = tiny_model(), samples()
    with pytest.raises(UserError, match=r"37x53 is not a multiple of the ViT patch \(14\)"):
        evaluate(model, batches(pairs[:1]), torch.device("cpu"), NUM_CLASSES)
    x = torch.randn(1, 3, 42, 56)
    assert resized_to_multiple(x, 14) is x
    assert resized_to_multiple(torch.randn(1, 3, 5, 8), 14).shape[-2:] == (14, 14)  # never below one multiple


def test_the_label_free_scores_take_any_size_with_it():
    model, pairs = tiny_model(), samples()
    result = evaluate(model, batches(pairs), torch.device("cpu"), NUM_CLASSES, proxies=True,
                      resize_to_multiple=True)
    assert {"proxy/entropy", "proxy/flip_agreement", "proxy/scale_agreement", "proxy/snd"} <= set(result.proxies)


FOLDER = ["method.name=supervised", "target_data=null", "data.kind=folder", "data.num_classes=3",
          "data.train_transforms=[{name: RandomCrop, height: 28, width: 28}]", "data.num_workers=0",
          "data.batch_size=2"]


def test_the_start_accepts_val_images_of_any_size_with_it_and_refuses_them_without(tmp_path):
    make_folder(tmp_path / "data", n_train=4, n_val=2, num_classes=3, h=37, w=53)
    folder = [*FOLDER, f"data.root={tmp_path / 'data'}"]
    device_map = parse_device_map("g:cpu,d:cpu")
    preflight.check_start(load_config("dinov2_tiny", [*folder, "data.val_resize_to_multiple=true"]), None, device_map)
    with pytest.raises(UserError, match=r"37x53 is not a multiple of DINOv2's patch size 14.*"
                                        r"set data.val_resize_to_multiple: true"):
        preflight.check_start(load_config("dinov2_tiny", folder), None, device_map)


def test_val_input_size_beside_it_is_refused_naming_both():
    with pytest.raises(UserError, match="val_input_size and val_resize_to_multiple both resize"):
        load_config("dinov2_tiny", ["target_data.val_resize_to_multiple=true", "target_data.val_input_size=[56,56]"])


@pytest.mark.parametrize("config", ["unimatch_v2_dinov2_voc", "mean_teacher_dinov2_voc"])
def test_the_dinov2_voc_configs_evaluate_as_unimatch_v2(config):
    data = load_config(config, []).data
    assert data.val_resize_to_multiple and data.val_transforms == [] and data.val_input_size is None
