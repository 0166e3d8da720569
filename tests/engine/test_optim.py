"""Optimizers from config: every update-kernel choice computes the same update."""

import pytest
import torch
from torch import nn

from segadv.config.schema import OptimizerConfig
from segadv.engine.optim import IMPLEMENTATIONS, build_optimizer


def updated(implementation: str, name: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    # No BatchNorm: a conv bias before it has a zero gradient up to rounding, and Adam turns
    # rounding-level gradients into full-size updates (lr * g / (|g| + eps)).
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Tanh(), nn.Conv2d(8, 2, 1))
    cfg = OptimizerConfig(name=name, lr=1e-2, weight_decay=1e-4, implementation=implementation)
    optimizer = build_optimizer(model, cfg)
    x = torch.randn(2, 3, 16, 16)
    for _ in range(3):
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("implementation", sorted(set(IMPLEMENTATIONS) - {"for_loop"}))
def test_update_kernels_agree_with_the_per_tensor_loop(name, implementation):
    """Same arithmetic, other kernels: equal to float32 rounding (1e-6 relative to the weight)."""
    for got, ref in zip(updated(implementation, name), updated("for_loop", name)):
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_fused_is_what_the_optimizer_runs():
    opt = build_optimizer(nn.Linear(2, 2), OptimizerConfig(name="adamw", lr=1e-3, implementation="fused"))
    assert opt.defaults["fused"] is True
