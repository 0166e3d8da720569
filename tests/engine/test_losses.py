"""Every loss over a selection of pixels is defined when the selection is empty: 0, still connected
to its input (its backward runs) and sending it no gradient; over a selection that is not empty, it
is the mean over that selection. ``empty_selection`` says which, without a host read."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from segadv.engine.losses import (empty_selection, masked_bce_with_logits, masked_cross_entropy, masked_mean,
                                  pseudo_labels)
from segadv.methods import mixing
from segadv.methods.adversarial import gan_loss
from segadv.methods.s4gan.iteration import selected_pseudo_labels
from segadv.methods.unimatch.iteration import confident_cross_entropy

from helpers import NoHostReads

IGNORE = 255
N, C, H, W = 2, 4, 6, 5


def logits(seed: int = 0, channels: int = C) -> torch.Tensor:
    return torch.randn(N, channels, H, W, generator=torch.Generator().manual_seed(seed), requires_grad=True)


def labels(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, C, (N, H, W), generator=torch.Generator().manual_seed(seed))


def ignored() -> torch.Tensor:
    return torch.full((N, H, W), IGNORE)


def nothing() -> torch.Tensor:
    return torch.zeros(N, H, W, dtype=torch.bool)


# Each loss primitive with an empty selection: (its input, which the gradient is read on; the loss).
EMPTY = {
    "masked_cross_entropy: every pixel ignored": lambda x: masked_cross_entropy(x, ignored(), IGNORE),
    "masked_bce_with_logits: no valid pixel": lambda d: masked_bce_with_logits(d[:, :1], 1.0, nothing()),
    "gan_loss over a pixel mask: no valid pixel": lambda d: gan_loss(d[:, :1], 0.0, nothing()),
    "masked_mean: nothing selected": lambda x: masked_mean(x.sum(dim=1), nothing()),
    "advsemiseg's pseudo labels: no confident pixel": lambda x: masked_cross_entropy(
        x, pseudo_labels(x, torch.zeros(N, H, W), 0.2, IGNORE), IGNORE),
    "s4gan's self-training: no image selected": lambda x: masked_cross_entropy(
        x, selected_pseudo_labels(x, torch.zeros(N), 0.5, IGNORE)[0], IGNORE),
    "mean teacher's mixed CE: every mixed label ignored": lambda x: mixing.pixel_weighted_cross_entropy(
        x, ignored(), torch.ones(N, H, W), IGNORE),
    "mean teacher's mixed CE: every pixel weight 0": lambda x: mixing.pixel_weighted_cross_entropy(
        x, labels(), torch.zeros(N, H, W), IGNORE),
    "french's consistency: nothing in the mask": lambda x: mixing.french_consistency_loss(
        x, torch.randn(N, C, H, W), torch.zeros(N, 1, H, W), torch.tensor(1.0)),
    "unimatch's confident CE: no confident pixel": lambda x: confident_cross_entropy(
        x, labels(), torch.full((N, H, W), 0.5), 0.95),
}


@pytest.mark.parametrize("loss", EMPTY.values(), ids=EMPTY.keys())
def test_a_loss_over_an_empty_selection_is_zero_and_sends_no_gradient(loss):
    x = logits()
    with NoHostReads():
        value = loss(x)
    assert value.dim() == 0 and math.isfinite(value.item()) and value.item() == 0.0
    assert value.requires_grad  # connected: its backward runs (DDP, accumulation)
    value.backward()
    assert x.grad is not None and torch.count_nonzero(x.grad) == 0 and torch.isfinite(x.grad).all()


def test_torch_s_own_mean_is_nan_there():
    """Why the CEs go through ``masked_cross_entropy``: with every pixel ignored, F.cross_entropy's
    mean is 0/0, which the divergence guard would take for a diverged run."""
    assert math.isnan(F.cross_entropy(logits(), ignored(), ignore_index=IGNORE).item())


def test_over_a_selection_the_masked_losses_are_its_mean_with_torch_s_gradient():
    x, y = logits(), labels()
    y[0] = IGNORE  # one image wholly ignored, the other labelled
    reference = logits()
    expected = F.cross_entropy(reference, y, ignore_index=IGNORE)
    got = masked_cross_entropy(x, y, IGNORE)
    assert torch.allclose(got, expected, rtol=1e-6)
    got.backward()
    expected.backward()
    assert torch.allclose(x.grad, reference.grad, rtol=1e-6, atol=1e-9)

    d, valid = logits(2)[:, :1], labels(3) > 1
    per_pixel = F.binary_cross_entropy_with_logits(d[:, 0], torch.ones(N, H, W), reduction="none")
    assert torch.allclose(masked_bce_with_logits(d, 1.0, valid), per_pixel[valid].mean(), rtol=1e-6)


def test_empty_selection_is_one_where_any_term_selects_nothing():
    some = torch.zeros(N, H, W, dtype=torch.bool)
    some[1, 2, 3] = True
    with NoHostReads():
        flags = [empty_selection(some), empty_selection(nothing()), empty_selection(some, nothing()),
                 empty_selection(torch.zeros(N, H, W)), empty_selection(some.float() * 0.3)]
    assert [f.item() for f in flags] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert all(f.dtype == torch.float32 and f.dim() == 0 for f in flags)
