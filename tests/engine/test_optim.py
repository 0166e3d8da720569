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


# ----------------------------------------------------------------------------- when the lr is set: poly_lag


def segadv_lrs(base: float, horizon: int, power: float, lag: int, warmup: int = 0, groups: int = 1) -> list[list[float]]:
    """The lr of each group at iterations 0..horizon-1, as segadv's loop sees it (read before the step)."""
    params = [{"params": [nn.Parameter(torch.zeros(1))], "lr": base * 10 ** g} for g in range(groups)]
    opt = torch.optim.SGD(params, lr=base)
    scheduler = build_poly_scheduler(opt, horizon, power, warmup=warmup, lag=lag)
    seen = []
    for _ in range(horizon):
        seen.append([group["lr"] for group in opt.param_groups])
        opt.step()
        scheduler.step()
    return seen


def before_step_reference(base: float, horizon: int, power: float, groups: int = 1) -> list[list[float]]:
    """hfslyc/AdvSemiSeg train.py 160-168, 308-319, 452 (AdaptSegNet, ADVENT, s4GAN, DACS alike): the lr
    set from i_iter before the step."""
    def lr_poly(base_lr, iter, max_iter, power):
        return base_lr * ((1 - float(iter) / max_iter) ** (power))

    opt = torch.optim.SGD([{"params": [nn.Parameter(torch.zeros(1))]} for _ in range(groups)], lr=base)
    seen = []
    for i_iter in range(horizon):
        lr = lr_poly(base, i_iter, horizon, power)
        opt.param_groups[0]["lr"] = lr
        if groups > 1:
            opt.param_groups[1]["lr"] = lr * 10
        seen.append([group["lr"] for group in opt.param_groups])
        opt.step()
    return seen


def after_step_reference(base: float, horizon: int, power: float, groups: int = 1) -> list[list[float]]:
    """LiheYoung/UniMatch unimatch.py 54-56, 192-208 (UniMatch-V2 unimatch_v2.py 67-72, 206-219 alike):
    the optimizer built at lr, the lr set from the iteration just run after the step."""
    opt = torch.optim.SGD([{"params": [nn.Parameter(torch.zeros(1))], "lr": base * 10 ** g} for g in range(groups)],
                          lr=base)
    seen = []
    for iters in range(horizon):
        seen.append([group["lr"] for group in opt.param_groups])
        opt.step()
        lr = base * (1 - iters / horizon) ** power
        opt.param_groups[0]["lr"] = lr
        if groups > 1:
            opt.param_groups[1]["lr"] = lr * 10
    return seen


@pytest.mark.parametrize("horizon", [1, 2, 7, 40])
def test_poly_lag_0_is_the_lr_set_before_the_step(horizon):
    """Iteration k (0-based) at base * (1 - k / T) ** p: the formula and AdvSemiSeg's loop, exactly."""
    formula = [[2.5e-4 * (1 - k / horizon) ** 0.9] for k in range(horizon)]
    assert segadv_lrs(2.5e-4, horizon, 0.9, lag=0) == formula == before_step_reference(2.5e-4, horizon, 0.9)


@pytest.mark.parametrize("horizon", [1, 2, 7, 40])
def test_poly_lag_1_is_the_lr_set_after_the_step_as_unimatch(horizon):
    """Iteration 0 at base, iteration k >= 1 at base * (1 - (k - 1) / T) ** p: the formula and
    UniMatch's loop, exactly; one step behind poly_lag 0 throughout."""
    formula = [[1e-3]] + [[1e-3 * (1 - (k - 1) / horizon) ** 0.9] for k in range(1, horizon)]
    lagged = segadv_lrs(1e-3, horizon, 0.9, lag=1)
    assert lagged == formula == after_step_reference(1e-3, horizon, 0.9)
    assert lagged[1:] == segadv_lrs(1e-3, horizon, 0.9, lag=0)[:-1]


@pytest.mark.parametrize("lag, reference", [(0, before_step_reference), (1, after_step_reference)])
def test_both_timings_hold_for_the_head_group(lag, reference):
    """The head at 10x (the references' second group): each group decays from its own base."""
    got, expected = segadv_lrs(1e-3, 12, 0.9, lag=lag, groups=2), reference(1e-3, 12, 0.9, groups=2)
    assert [lr for lrs in got for lr in lrs] == pytest.approx([lr for lrs in expected for lr in lrs], rel=1e-14)


@pytest.mark.parametrize("lag", [0, 1])
def test_the_warmup_counts_the_iteration_and_the_lag_shifts_the_decay_only(lag):
    """Iteration k at min(1, (k + 1) / W) * base * (1 - max(k - lag, 0) / T) ** p: the warm-up keeps
    its W steps whatever the lag."""
    horizon, warmup = 10, 4
    formula = [[(1 - max(k - lag, 0) / horizon) ** 0.9 * min(1.0, (k + 1) / warmup)] for k in range(horizon)]
    assert segadv_lrs(1.0, horizon, 0.9, lag=lag, warmup=warmup) == formula
    if lag:
        assert segadv_lrs(1.0, horizon, 0.9, lag=1, warmup=warmup)[:2] == [[0.25], [0.5]]


def trained(lag: int, steps: int, state: bytes | None = None, warmup: int = 2):
    """A model's SGD run (momentum, head group at 10x, warm-up, ``lag``) over ``steps`` steps of a
    10-step horizon, from ``state`` (a saved model and AmpOptimizer) if given: the lrs it trained at,
    its weights and its state."""
    import io

    from segadv.config.schema import NetworkAmpConfig
    from segadv.training.build import build_amp_optimizer

    torch.manual_seed(1 if state else 0)  # a resumed model's own init is overwritten
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    cfg = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, poly_power=0.9, poly_lag=lag, warmup_steps=warmup)
    opt = build_amp_optimizer(model, cfg, NetworkAmpConfig(), torch.device("cpu"), 10)
    done = 0
    if state is not None:
        saved = torch.load(io.BytesIO(state), weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        done = saved["steps"]
    lrs = []
    for step in range(done, steps):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(step))
        lrs.append(opt.lr)
        opt.backward(model(x).square().mean())
        opt.step()
    out = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "steps": steps}, out)
    return lrs, [p.detach().clone() for p in model.parameters()], out.getvalue()


@pytest.mark.parametrize("lag", [0, 1])
def test_a_lagged_schedule_resumes_mid_run_bitwise(lag):
    """8 steps in one go equal 3, a save, a fresh model and optimizer loading it, then 5: the same lrs
    at every iteration and the same weights, bitwise (the lag is the config's, the position the state's)."""
    straight, weights, _ = trained(lag, 8)
    first, _, state = trained(lag, 3)
    second, resumed, _ = trained(lag, 8, state)
    assert first + second == straight
    assert all(torch.equal(a, b) for a, b in zip(resumed, weights))
    if lag:
        assert straight[:3] == [0.025, 0.05, 0.05 * (1 - 1 / 10) ** 0.9]  # warm-up 2, the decay one step behind


def test_a_schedule_saved_before_the_lag_existed_restores_exactly():
    """A scheduler state without ``lag`` (nor ``warmup``: written before either) resumes at the
    step and lr it was saved at, the config's lag (0, the default an old config reads as)."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = build_poly_scheduler(opt, 10, 0.9)
    for _ in range(4):
        opt.step()
        scheduler.step()
    old = {k: v for k, v in scheduler.state_dict().items() if k not in ("lag", "warmup")}
    again = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    restored = build_poly_scheduler(again, 10, 0.9)
    restored.load_state_dict(old)
    assert (restored.last_epoch, restored.lag, again.param_groups[0]["lr"]) == (4, 0, opt.param_groups[0]["lr"])
    assert again.param_groups[0]["lr"] == 0.1 * (1 - 4 / 10) ** 0.9


@pytest.mark.parametrize("value", ["2", "-1", "true", "1.0", "'1'", "null"])
def test_poly_lag_is_0_or_1(value):
    from segadv.config import load_config
    from segadv.errors import UserError

    with pytest.raises(UserError, match="optim.generator.poly_lag"):
        load_config(None, [f"optim.generator.poly_lag={value}"])
    assert load_config(None, ["optim.discriminator.poly_lag=1"]).optim.discriminator.poly_lag == 1


SETS_LR_AFTER_STEP = {"unimatch_voc", "unimatch_v2_dinov2_voc", "unimatch_v2_dinov2_cityscapes"}


def test_the_configs_whose_reference_sets_the_lr_after_the_step_lag_it():
    """UniMatch's and UniMatch V2's G at poly_lag 1 (their D, when on, is AdvSemiSeg's: 0); every other
    shipped config, the _reference ones included (AdvSemiSeg, AdaptSegNet, ADVENT, s4GAN set it
    before the step), at 0."""
    from segadv.config import load_config
    from segadv.config.shipped import config_names

    assert SETS_LR_AFTER_STEP <= set(config_names())
    for name in config_names():
        optim = load_config(name, []).optim
        lags = {role: getattr(optim, role).poly_lag for role in type(optim).model_fields if getattr(optim, role)}
        expected = 1 if name in SETS_LR_AFTER_STEP else 0
        assert lags.pop("generator") == expected, name
        assert set(lags.values()) <= {0}, name


def test_the_lr_reported_at_a_step_is_the_one_that_step_used():
    """``last_step_lr`` (train/lr_<net>, logged after the scheduler stepped) is the LR read before
    the step, not the next step's."""
    model, opt = stepped_optimizer(lr=1e-3, weight_decay=0.0)
    assert opt.last_step_lr == opt.lr == 1e-3
    used = []
    for _ in range(3):
        used.append(opt.lr)
        opt.backward(model(torch.randn(4, 3)).square().mean())
        opt.step()
        assert opt.last_step_lr == used[-1] != opt.lr
    assert used == pytest.approx([1e-3 * (1 - k / 10) ** 0.9 for k in range(3)], rel=1e-12)
