"""segadv's AdvSemiSeg iteration against a line-by-line transcription of the reference's
(hfslyc/AdvSemiSeg ``train.py`` 308-453): the unlabeled branch first (drawn by the reference's
rule), then the labeled CE and adversarial terms, then D on G's detached maps (labeled and
unlabeled, ``D_remain``) and on the gt stream's one-hot labels, each half-weighted; D's logit map
upsampled by ``nn.Upsample(mode="bilinear", align_corners=True)``; 255 pixels in every labeled
batch. The two documented deviations that would change numbers are kept out of reach: G has no
BatchNorm (segadv runs G once on both batches, the reference twice), and some unlabeled pixels
always pass the mask (the reference drops the whole unlabeled loss when none does).
"""

import copy
import functools

import pytest
import torch
import torch.nn.functional as F

from segadv.methods.advsemiseg.iteration import AdvSemiSeg
from segadv.methods.advsemiseg.declaration import AdvSemiSegConfig, AdvSemiSegSetup
from segadv.models.discriminator import FCDiscriminator
from segadv.monitor.profile import PhaseTimer

from helpers import FixedStream, conv_networks

C, IGNORE, SIZE, LAMBDA_ADV, LR = 3, 255, 32, 0.1, 0.1


def reference_d_logits(d, maps):
    """The reference's ``interp(model_D(maps))``: D's convolutions, then its nn.Upsample."""
    x = maps
    for conv in d.features:
        x = F.leaky_relu(conv(x), negative_slope=0.2)
    return F.interpolate(d.classifier(x), size=maps.shape[-2:], mode="bilinear", align_corners=True)


def bce_2d(d_out, label, ignore_mask):
    """BCEWithLogitsLoss2d(D_out, make_D_label(label, ignore_mask)): the mean over unignored pixels."""
    logits = d_out.squeeze(1)[~ignore_mask]
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, float(label)))


def one_hot(labels):
    """The reference's one_hot: (label == i) per class, so a 255 pixel is all zeros."""
    return torch.stack([(labels == i).float() for i in range(C)], dim=1)


def reference_iteration(g, d, batches, s, i_iter):
    (x_l, y_l), x_u, (_, y_gt) = batches
    opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=LR), torch.optim.SGD(d.parameters(), lr=LR)
    opt_g.zero_grad()
    opt_d.zero_grad()
    interp = lambda t: F.interpolate(t, size=(SIZE, SIZE), mode="bilinear", align_corners=True)  # noqa: E731
    for param in d.parameters():
        param.requires_grad = False
    pred_remain = None
    if (s.lambda_semi > 0 or s.lambda_semi_adv > 0) and i_iter >= s.semi_start_adv:
        pred = interp(g(x_u))
        pred_remain = pred.detach()
        d_out = reference_d_logits(d, F.softmax(pred, dim=1))
        d_out_sigmoid = torch.sigmoid(d_out).detach().squeeze(1)
        ignore_mask_remain = torch.zeros_like(d_out_sigmoid, dtype=torch.bool)
        loss_semi_adv = s.lambda_semi_adv * bce_2d(d_out, 1, ignore_mask_remain)
        if s.lambda_semi <= 0 or i_iter < s.semi_start:
            loss_semi_adv.backward()
        else:
            semi_ignore_mask = d_out_sigmoid < s.mask_threshold
            assert 0 < semi_ignore_mask.float().mean() < 1  # the reference's all-ignored branch is out of reach
            semi_gt = pred.detach().argmax(dim=1)
            semi_gt[semi_ignore_mask] = 255
            loss_semi = s.lambda_semi * F.cross_entropy(pred, semi_gt, ignore_index=255)
            (loss_semi + loss_semi_adv).backward()
    ignore_mask = y_l == 255
    pred = interp(g(x_l))
    loss_seg = F.cross_entropy(pred, y_l, ignore_index=255)
    d_out = reference_d_logits(d, F.softmax(pred, dim=1))
    (loss_seg + LAMBDA_ADV * bce_2d(d_out, 1, ignore_mask)).backward()
    for param in d.parameters():
        param.requires_grad = True
    pred = pred.detach()
    if pred_remain is not None:  # D_remain
        pred = torch.cat((pred, pred_remain), 0)
        ignore_mask = torch.cat((ignore_mask, ignore_mask_remain), 0)
    (bce_2d(reference_d_logits(d, F.softmax(pred, dim=1)), 0, ignore_mask) / 2).backward()
    (bce_2d(reference_d_logits(d, one_hot(y_gt)), 1, y_gt == 255) / 2).backward()
    opt_g.step()
    opt_d.step()


@pytest.mark.parametrize("settings, i_iter", [
    (dict(lambda_semi=1.0, semi_start=2, lambda_semi_adv=0.1, semi_start_adv=0), 3),  # every term on
    (dict(lambda_semi=1.0, semi_start=2, lambda_semi_adv=0.1, semi_start_adv=0), 1),  # before semi_start
    (dict(lambda_semi=1.0, semi_start=2, lambda_semi_adv=0.0, semi_start_adv=0), 0),  # the pseudo-labels control
    (dict(lambda_semi=1.0, semi_start=0, lambda_semi_adv=0.1, semi_start_adv=3), 1),  # before the unlabeled branch
])
def test_the_iteration_equals_the_references_transcription(settings, i_iter):
    gen = torch.Generator().manual_seed(3)
    y_l, y_gt = (torch.randint(0, C, (2, SIZE, SIZE), generator=gen) for _ in range(2))
    y_l[:, :5] = IGNORE
    y_gt[:, :, -4:] = IGNORE
    batches = ((torch.randn(2, 3, SIZE, SIZE, generator=gen), y_l), torch.randn(3, 3, SIZE, SIZE, generator=gen),
               (torch.randn(2, 3, SIZE, SIZE, generator=gen), y_gt))
    g, d = conv_networks(0, functools.partial(FCDiscriminator, num_downsamples=2), C, LR)  # an 8x8 map at 32 px
    g0, d0 = copy.deepcopy(g.module), copy.deepcopy(d.module)
    with torch.no_grad():  # a threshold that splits the unlabeled pixels: the mask matters
        threshold = float(torch.sigmoid(reference_d_logits(d0, F.softmax(g0(batches[1]), dim=1))).median())
    s = AdvSemiSegConfig(mask_threshold=threshold, **settings)
    setup = AdvSemiSegSetup(num_classes=C, ignore_index=IGNORE, lambda_adv=LAMBDA_ADV, adv_warmup_steps=0, settings=s)
    method = AdvSemiSeg(setup, {"generator": g, "discriminator": d}, PhaseTimer())
    streams = {"labeled": FixedStream(batches[0]), "unlabeled": FixedStream(batches[1]), "gt": FixedStream(batches[2])}
    method(streams, i_iter)
    reference_iteration(g0, d0, batches, s, i_iter)
    for ours, theirs in ((g.module, g0), (d.module, d0)):
        for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-7), name  # float32 rounding of the same sums
    drawn = (settings["lambda_semi"] > 0 or settings["lambda_semi_adv"] > 0) and i_iter >= settings["semi_start_adv"]
    assert streams["unlabeled"].drawn == int(drawn)
