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


def stepped_optimizer(lr, weight_decay, lr_multiplier=1.0, steps=0):
    from segadv.training.build import build_amp_optimizer
    from segadv.config.schema import NetworkAmpConfig

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    cfg = OptimizerConfig(name="adamw", lr=lr, weight_decay=weight_decay, poly_power=0.9)
    opt = build_amp_optimizer(model, cfg, NetworkAmpConfig(), torch.device("cpu"), 10, lr_multiplier=lr_multiplier)
    for _ in range(steps):
        opt.backward(model(torch.randn(4, 3)).square().mean())
        opt.step()
    return model, opt


@pytest.mark.parametrize("lr_multiplier", [1.0, 2.0])
def test_settings_at_resume_are_the_configs_and_the_state_the_checkpoints(lr_multiplier):
    """A resumed optimizer keeps the checkpoint's moments and schedule position but takes the
    learning rate (and train.lr_scaling's multiplier), weight decay and betas from the config it
    is resumed with: the lr is a fresh run's at that step (torch would restore the saved ones)."""
    _, saved = stepped_optimizer(lr=1e-3, weight_decay=0.0, steps=4)
    _, resumed = stepped_optimizer(lr=5e-3, weight_decay=0.01, lr_multiplier=lr_multiplier)
    resumed.load_state_dict(saved.state_dict())
    _, fresh = stepped_optimizer(lr=5e-3, weight_decay=0.01, lr_multiplier=lr_multiplier, steps=4)
    assert resumed.lr == fresh.lr == pytest.approx(5e-3 * lr_multiplier * (1 - 4 / 10) ** 0.9, rel=1e-12)
    group = resumed.optimizer.param_groups[0]
    assert group["weight_decay"] == 0.01 and group["initial_lr"] == 5e-3 * lr_multiplier
    moments = [s["exp_avg"] for s in resumed.optimizer.state.values()]
    assert moments and all(torch.equal(a, b["exp_avg"]) for a, b in zip(moments, saved.optimizer.state.values()))
