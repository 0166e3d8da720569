"""The references' UniMatch iterations transcribed (LiheYoung/UniMatch ``unimatch.py`` 106-188 at
0324f3d; LiheYoung/UniMatch-V2 ``unimatch_v2.py`` 152-204 at f6afb4d), with the data pipeline's
random draws (strong views, CutMix boxes, feature scales) handed in so that they equal segadv's.

Held against segadv's iteration by tests/methods/test_unimatch.py (each loss term, one step) and by
tests/integration/test_equivalence_unimatch.py (every placement, wrapper and precision, over steps
and micro-batches, with D on top). What the references lack is added where the harness needs it,
outside their lines: a divisor for a micro-batch's share (``parts``), D's adversarial term on the
weak view's maps (``adversarial``, as segadv puts it on top) and the pseudo labels' near-ties taken
from segadv (``tie_break``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from segadv.methods.unimatch import views


@dataclass
class ViewDraws:
    """One iteration's draws: the strong views before pasting (V1: u's two, then u''s two; V2: u's
    two), the two CutMix boxes, and the feature scales (one (B, C) tensor per feature map)."""

    strong: Sequence[torch.Tensor]
    boxes: Sequence[torch.Tensor]
    scales: Sequence[torch.Tensor]


class Draws:
    """Records what segadv's iteration draws from its generator (strong views, boxes, feature
    scales; on their devices, in draw order) by wrapping ``views``' functions with ``monkeypatch``,
    so the transcription uses the same numbers."""

    def __init__(self, monkeypatch):
        self.strong, self.boxes, self.scales = [], [], []
        for name, store in (("strong_view", self.strong), ("cutmix_boxes", self.boxes),
                            ("dropout_scales", self.scales), ("complementary_scales", self.scales)):
            real = getattr(views, name)

            def spy(*args, _real=real, _store=store, **kwargs):
                out = _real(*args, **kwargs)
                _store.append(out)
                return out

            monkeypatch.setattr(views, name, spy)

    def iterations(self, strong_per_iteration: int) -> list[ViewDraws]:
        """The draws by iteration (a micro-batch's counts as one), moved to the CPU."""
        n = len(self.boxes) // 2
        assert len(self.strong) == n * strong_per_iteration and len(self.scales) == n, \
            (len(self.strong), len(self.boxes), len(self.scales))
        cpu = lambda tensors: [t.detach().cpu() for t in tensors]  # noqa: E731
        return [ViewDraws(cpu(self.strong[i * strong_per_iteration:(i + 1) * strong_per_iteration]),
                          cpu(self.boxes[2 * i:2 * i + 2]), cpu(self.scales[i])) for i in range(n)]


TieBreak = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (probabilities, argmax) -> labels
Adversarial = Callable[[torch.Tensor], torch.Tensor]  # G's weak-view logits -> its weighted adversarial loss


def scaled_forward(model, x, masks, need_fp):
    """The references' G with feature perturbation: V1's ``model(x, need_fp=True)`` (decodes the
    features and their dropped copy together, deeplabv3plus.py 38-46), V2's ``comp_drop`` (the
    features times the masks, dpt.py 95-115). On smp's DeepLab models written out: encoder, decoder,
    head; a G without smp's parts (the DINOv2 G) scales with its own keywords."""
    if not hasattr(model, "decoder"):
        return model(x, feature_scales=masks, with_unperturbed=need_fp)
    feats = model.encoder(x)
    if need_fp:
        feats = [torch.cat((f, f * m[:, :, None, None])) for f, m in zip(feats, masks)]
        return model.segmentation_head(model.decoder(feats)).chunk(2)
    feats = [f * m[:, :, None, None] for f, m in zip(feats, masks)]
    return model.segmentation_head(model.decoder(feats))


def confident_labels(pred: torch.Tensor, tie_break: Optional[TieBreak]):
    conf = pred.softmax(dim=1).max(dim=1)[0]
    mask = pred.argmax(dim=1)
    if tie_break is not None:
        mask = tie_break(pred.softmax(dim=1), mask)
    return conf, mask


def reference_v1(model, batch, draws: ViewDraws, conf_thresh, *, parts: int = 1,
                 tie_break: Optional[TieBreak] = None, adversarial: Optional[Adversarial] = None):
    """unimatch.py 106-188 on one batch ``(img_x, mask_x, img_u_w, img_u_w_mix)``; backward of the
    total loss (plus ``adversarial``'s, on the weak view's logits) divided by ``parts``. Returns
    the loss terms and G's labeled logits (detached) for D."""
    img_x, mask_x, img_u_w, img_u_w_mix = batch
    img_u_s1, img_u_s2, img_u_s1_mix, img_u_s2_mix = (s.clone() for s in draws.strong)
    cutmix_box1, cutmix_box2 = (b.long() for b in draws.boxes)
    ignore_mask = torch.zeros_like(mask_x)  # no padding in the unlabeled crops
    ignore_mask_mix = torch.zeros_like(mask_x)
    criterion_l = torch.nn.CrossEntropyLoss(ignore_index=255)
    criterion_u = torch.nn.CrossEntropyLoss(reduction="none")
    with torch.no_grad():
        model.eval()
        pred_u_w_mix = model(img_u_w_mix).detach()
        conf_u_w_mix, mask_u_w_mix = confident_labels(pred_u_w_mix, tie_break)
    img_u_s1[cutmix_box1.unsqueeze(1).expand(img_u_s1.shape) == 1] = \
        img_u_s1_mix[cutmix_box1.unsqueeze(1).expand(img_u_s1.shape) == 1]
    img_u_s2[cutmix_box2.unsqueeze(1).expand(img_u_s2.shape) == 1] = \
        img_u_s2_mix[cutmix_box2.unsqueeze(1).expand(img_u_s2.shape) == 1]
    model.train()
    num_lb, num_ulb = img_x.shape[0], img_u_w.shape[0]
    preds, preds_fp = scaled_forward(model, torch.cat((img_x, img_u_w)), draws.scales, need_fp=True)
    pred_x, pred_u_w = preds.split([num_lb, num_ulb])
    pred_u_w_fp = preds_fp[num_lb:]
    loss_adv = adversarial(pred_u_w) if adversarial is not None else 0.0
    pred_u_s1, pred_u_s2 = model(torch.cat((img_u_s1, img_u_s2))).chunk(2)
    pred_u_w = pred_u_w.detach()
    conf_u_w, mask_u_w = confident_labels(pred_u_w, tie_break)
    mask_u_w_cutmixed1, conf_u_w_cutmixed1, ignore_mask_cutmixed1 = mask_u_w.clone(), conf_u_w.clone(), ignore_mask.clone()
    mask_u_w_cutmixed2, conf_u_w_cutmixed2, ignore_mask_cutmixed2 = mask_u_w.clone(), conf_u_w.clone(), ignore_mask.clone()
    mask_u_w_cutmixed1[cutmix_box1 == 1] = mask_u_w_mix[cutmix_box1 == 1]
    conf_u_w_cutmixed1[cutmix_box1 == 1] = conf_u_w_mix[cutmix_box1 == 1]
    ignore_mask_cutmixed1[cutmix_box1 == 1] = ignore_mask_mix[cutmix_box1 == 1]
    mask_u_w_cutmixed2[cutmix_box2 == 1] = mask_u_w_mix[cutmix_box2 == 1]
    conf_u_w_cutmixed2[cutmix_box2 == 1] = conf_u_w_mix[cutmix_box2 == 1]
    ignore_mask_cutmixed2[cutmix_box2 == 1] = ignore_mask_mix[cutmix_box2 == 1]
    loss_x = criterion_l(pred_x, mask_x)
    loss_u_s1 = criterion_u(pred_u_s1, mask_u_w_cutmixed1)
    loss_u_s1 = loss_u_s1 * ((conf_u_w_cutmixed1 >= conf_thresh) & (ignore_mask_cutmixed1 != 255))
    loss_u_s1 = torch.sum(loss_u_s1) / torch.sum(ignore_mask_cutmixed1 != 255).item()
    loss_u_s2 = criterion_u(pred_u_s2, mask_u_w_cutmixed2)
    loss_u_s2 = loss_u_s2 * ((conf_u_w_cutmixed2 >= conf_thresh) & (ignore_mask_cutmixed2 != 255))
    loss_u_s2 = torch.sum(loss_u_s2) / torch.sum(ignore_mask_cutmixed2 != 255).item()
    loss_u_w_fp = criterion_u(pred_u_w_fp, mask_u_w)
    loss_u_w_fp = loss_u_w_fp * ((conf_u_w >= conf_thresh) & (ignore_mask != 255))
    loss_u_w_fp = torch.sum(loss_u_w_fp) / torch.sum(ignore_mask != 255).item()
    loss = (loss_x + loss_u_s1 * 0.25 + loss_u_s2 * 0.25 + loss_u_w_fp * 0.5) / 2.0
    ((loss + loss_adv) / parts).backward()
    mask_ratio = ((conf_u_w >= conf_thresh) & (ignore_mask != 255)).sum().item() / (ignore_mask != 255).sum().item()
    return {"loss_seg": loss_x, "loss_strong": (loss_u_s1 + loss_u_s2) / 2.0, "loss_fp": loss_u_w_fp,
            "pseudo_confidence": mask_ratio, "pred_x": pred_x.detach()}


def reference_v2(model, model_ema, batch, draws: ViewDraws, conf_thresh, *, parts: int = 1,
                 tie_break: Optional[TieBreak] = None, adversarial: Optional[Adversarial] = None):
    """unimatch_v2.py 152-204 on one batch ``(img_x, mask_x, img_u_w)``; backward of the total loss
    divided by ``parts``, then (where ``adversarial``) of D's term on G's own forward of the weak
    view, as segadv adds it (V2's student never predicts the weak view). Returns the loss terms
    and G's labeled logits (detached) for D."""
    img_x, mask_x, img_u_w = batch
    img_u_s1, img_u_s2 = (s.clone() for s in draws.strong)
    cutmix_box1, cutmix_box2 = (b.long() for b in draws.boxes)
    ignore_mask = torch.zeros_like(mask_x)
    criterion_l = torch.nn.CrossEntropyLoss(ignore_index=255)
    criterion_u = torch.nn.CrossEntropyLoss(reduction="none")
    model_ema.eval()
    with torch.no_grad():
        pred_u_w = model_ema(img_u_w).detach()
        conf_u_w, mask_u_w = confident_labels(pred_u_w, tie_break)
    img_u_s1[cutmix_box1.unsqueeze(1).expand(img_u_s1.shape) == 1] = \
        img_u_s1.flip(0)[cutmix_box1.unsqueeze(1).expand(img_u_s1.shape) == 1]
    img_u_s2[cutmix_box2.unsqueeze(1).expand(img_u_s2.shape) == 1] = \
        img_u_s2.flip(0)[cutmix_box2.unsqueeze(1).expand(img_u_s2.shape) == 1]
    model.train()
    pred_x = model(img_x)
    pred_u_s1, pred_u_s2 = scaled_forward(model, torch.cat((img_u_s1, img_u_s2)), draws.scales,
                                          need_fp=False).chunk(2)
    mask_u_w_cutmixed1, conf_u_w_cutmixed1, ignore_mask_cutmixed1 = mask_u_w.clone(), conf_u_w.clone(), ignore_mask.clone()
    mask_u_w_cutmixed2, conf_u_w_cutmixed2, ignore_mask_cutmixed2 = mask_u_w.clone(), conf_u_w.clone(), ignore_mask.clone()
    mask_u_w_cutmixed1[cutmix_box1 == 1] = mask_u_w.flip(0)[cutmix_box1 == 1]
    conf_u_w_cutmixed1[cutmix_box1 == 1] = conf_u_w.flip(0)[cutmix_box1 == 1]
    ignore_mask_cutmixed1[cutmix_box1 == 1] = ignore_mask.flip(0)[cutmix_box1 == 1]
    mask_u_w_cutmixed2[cutmix_box2 == 1] = mask_u_w.flip(0)[cutmix_box2 == 1]
    conf_u_w_cutmixed2[cutmix_box2 == 1] = conf_u_w.flip(0)[cutmix_box2 == 1]
    ignore_mask_cutmixed2[cutmix_box2 == 1] = ignore_mask.flip(0)[cutmix_box2 == 1]
    loss_x = criterion_l(pred_x, mask_x)
    loss_u_s1 = criterion_u(pred_u_s1, mask_u_w_cutmixed1)
    loss_u_s1 = loss_u_s1 * ((conf_u_w_cutmixed1 >= conf_thresh) & (ignore_mask_cutmixed1 != 255))
    loss_u_s1 = loss_u_s1.sum() / (ignore_mask_cutmixed1 != 255).sum().item()
    loss_u_s2 = criterion_u(pred_u_s2, mask_u_w_cutmixed2)
    loss_u_s2 = loss_u_s2 * ((conf_u_w_cutmixed2 >= conf_thresh) & (ignore_mask_cutmixed2 != 255))
    loss_u_s2 = loss_u_s2.sum() / (ignore_mask_cutmixed2 != 255).sum().item()
    loss_u_s = (loss_u_s1 + loss_u_s2) / 2.0
    loss = (loss_x + loss_u_s) / 2.0
    (loss / parts).backward()
    if adversarial is not None:
        (adversarial(model(img_u_w)) / parts).backward()
    mask_ratio = ((conf_u_w >= conf_thresh) & (ignore_mask != 255)).sum().item() / (ignore_mask != 255).sum()
    return {"loss_seg": loss_x, "loss_strong": loss_u_s, "pseudo_confidence": mask_ratio, "pred_x": pred_x.detach()}
