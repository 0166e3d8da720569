"""Optimizers from config: every update-kernel choice computes the same update."""

import pytest
import torch
from torch import nn

from segadv.config.schema import OptimizerConfig
from segadv.engine.optim import IMPLEMENTATIONS, build_optimizer, build_poly_scheduler


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


def reference_g():
    from segadv.config.schema import GeneratorConfig
    from segadv.models import build_generator

    cfg = GeneratorConfig(arch="deeplabv2", encoder="resnet18", encoder_depth=5, output_stride=8, aux_head=True,
                          norm="frozen_affine")
    return build_generator(cfg, num_classes=3)


@pytest.mark.parametrize("head_weight_decay", [None, 0.0])
def test_the_head_trains_at_its_own_rate_as_the_references(head_weight_decay):
    """head_lr_mult: the encoder in the backbone group at lr, every other trained parameter (main
    and aux classifiers) in the head group at lr x 10, both at the references' weight decay unless
    head_weight_decay says otherwise; BatchNorm's fixed affine in neither. The poly schedule decays
    each group from its own base."""
    from segadv.engine.optim import parameter_groups

    g = reference_g()
    cfg = OptimizerConfig(name="sgd", lr=2.5e-4, momentum=0.9, weight_decay=5e-4, head_lr_mult=10.0,
                          head_weight_decay=head_weight_decay)
    opt = build_optimizer(g, cfg)
    backbone, head = opt.param_groups
    names = {id(p): n for n, p in g.named_parameters()}
    assert (backbone["name"], head["name"]) == ("backbone", "head")
    assert {names[id(p)] for p in head["params"]} == {
        n for n, _ in g.named_parameters() if n.startswith(("segmentation_head.", "aux_head."))}
    assert all(names[id(p)].startswith("encoder.") and "bn" not in names[id(p)] for p in backbone["params"])
    assert {names[id(p)] for p in [*backbone["params"], *head["params"]]} == {
        n for n, p in g.named_parameters() if p.requires_grad}
    assert backbone["lr"] == 2.5e-4 and head["lr"] == pytest.approx(2.5e-3)
    assert backbone["weight_decay"] == 5e-4 and head["weight_decay"] == (5e-4 if head_weight_decay is None else 0.0)
    scheduler = build_poly_scheduler(opt, 10, 0.9)
    for _ in range(5):
        opt.step()
        scheduler.step()
    assert [group["lr"] for group in opt.param_groups] == pytest.approx([2.5e-4 * 0.5 ** 0.9, 2.5e-3 * 0.5 ** 0.9])
    one = parameter_groups(g, cfg.model_copy(update={"head_lr_mult": 1.0, "head_weight_decay": None}))
    assert len(one) == 1  # the default: one group, as every run saved so far


def test_the_poly_horizon_is_its_own():
    """optim.*.poly_horizon: the schedule decays over it, not over max_steps (the references: 250,000
    steps, stopped at 150,000 or 120,000); null is max_steps; shorter than max_steps is refused."""
    from segadv.config.schema import NetworkAmpConfig
    from segadv.engine.optim import poly_horizon
    from segadv.errors import UserError
    from segadv.training.build import build_amp_optimizer

    cfg = OptimizerConfig(name="sgd", lr=1.0, poly_horizon=250, poly_power=0.9)
    assert poly_horizon(cfg, 150, "generator") == 250
    assert poly_horizon(cfg.model_copy(update={"poly_horizon": None}), 150, "generator") == 150
    with pytest.raises(UserError, match="optim.generator.poly_horizon: 100 is short of train.max_steps 150"):
        poly_horizon(cfg.model_copy(update={"poly_horizon": 100}), 150, "generator")
    model = nn.Linear(2, 2)
    opt = build_amp_optimizer(model, cfg, NetworkAmpConfig(), torch.device("cpu"), poly_horizon(cfg, 150, "generator"),
                              name="generator")
    assert opt.scheduler.total_iters == 250
    for _ in range(150):
        opt.optimizer.step()
        opt.scheduler.step()
    assert opt.lr == pytest.approx((1 - 150 / 250) ** 0.9)


def test_a_discriminator_has_no_head_to_set_apart():
    from pydantic import ValidationError

    from segadv.config.schema import OptimConfig

    with pytest.raises(ValidationError, match="head_lr_mult is G's"):
        OptimConfig(discriminator=OptimizerConfig(name="adam", lr=1e-4, head_lr_mult=10.0))
    with pytest.raises(ValidationError, match="head_weight_decay is G's"):
        OptimConfig(discriminator_aux=OptimizerConfig(name="adam", lr=1e-4, head_weight_decay=0.0))


def test_warmup_ramps_linearly_into_the_poly_schedule():
    import torch

    from segadv.engine.optim import build_poly_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_poly_scheduler(opt, 10, 1.0, warmup=4)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    # step t < 4 at (t + 1) / 4 of the poly value 1 - t / 10; from step 4 the poly value alone
    assert lrs == pytest.approx([0.25, 0.5 * 0.9, 0.75 * 0.8, 1.0 * 0.7, 0.6, 0.5])
    # the config's warm-up holds at resume, not the one saved with the schedule
    state = scheduler.state_dict()
    again = build_poly_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 10, 1.0, warmup=0)
    again.load_state_dict(state)
    assert again.warmup == 0


def test_layer_decay_sets_each_dinov2_layer_apart():
    from segadv.config import load_config
    from segadv.engine.optim import parameter_groups
    from segadv.models.generator import build_generator

    cfg = load_config("dinov2_tiny", ["optim.generator.layer_decay=0.5"])
    g = build_generator(cfg.model.generator, 5)
    groups = {group["name"]: group for group in parameter_groups(g, cfg.optim.generator)}
    lr, depth = cfg.optim.generator.lr, len(g.encoder.blocks)
    # the embedding (layer 0) lowest, block i at layer i + 1, the final norm at depth + 1 at lr
    assert groups["backbone.layer0"]["lr"] == pytest.approx(lr * 0.5 ** (depth + 1))
    assert groups[f"backbone.layer{depth}"]["lr"] == pytest.approx(lr * 0.5)
    assert groups[f"backbone.layer{depth + 1}"]["lr"] == pytest.approx(lr)
    assert groups["head"]["lr"] == pytest.approx(lr * cfg.optim.generator.head_lr_mult)
    assert any(p is g.encoder.cls_token for p in groups["backbone.layer0"]["params"])
    assert any(p is g.encoder.blocks[0].attn.qkv.weight for p in groups["backbone.layer1"]["params"])
    assert sum(len(group["params"]) for group in groups.values()) == len(list(g.parameters()))


def test_layer_decay_is_refused_where_the_arch_numbers_no_layers(capsys):
    from segadv.cli.train import main

    assert main(["--print-config", "optim.discriminator.layer_decay=0.5"]) == 2
    assert "layer_decay" in capsys.readouterr().err


def test_layer_decay_on_a_deeplab_names_the_key():
    from segadv.config import load_config
    from segadv.engine.optim import parameter_groups
    from segadv.errors import UserError
    from segadv.models.generator import build_generator

    cfg = load_config(None, ["optim.generator.layer_decay=0.5", "model.generator.encoder=mobilenet_v2",
                             "model.generator.encoder_depth=3"])
    with pytest.raises(UserError, match="layer_decay=0.5: arch deeplabv3plus numbers no encoder layers"):
        parameter_groups(build_generator(cfg.model.generator, 5), cfg.optim.generator)
