"""The confusion matrix behind val mIoU: fixed-shape counting equals a plain count."""

import torch

from segadv.engine.evaluate import ConfusionMatrix


def test_counts_equal_a_plain_count_with_ignored_ids_skipped():
    gen = torch.Generator().manual_seed(0)
    n = 5
    target = torch.randint(0, n, (3, 17, 19), generator=gen)
    target[0, :4] = 255  # ignored
    target[1, :, :2] = -1  # outside [0, n) as well
    pred = torch.randint(0, n, (3, 17, 19), generator=gen)
    cm = ConfusionMatrix(n)
    cm.update(target, pred)
    cm.update(target[:1], pred[:1])  # accumulates
    expected = torch.zeros(n, n, dtype=torch.int64)
    for t, p in zip(torch.cat([target, target[:1]]).flatten().tolist(), torch.cat([pred, pred[:1]]).flatten().tolist()):
        if 0 <= t < n:
            expected[t, p] += 1
    assert torch.equal(cm.mat, expected)
    metrics = cm.compute()
    e = expected.double()
    iou = e.diag() / (e.sum(0) + e.sum(1) - e.diag())
    assert abs(metrics["mIoU"] - float(iou.nanmean())) < 1e-12
