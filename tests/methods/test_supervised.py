"""The adversarial step: placement, which parameters each update touches, gradients, AMP."""

import copy

import pytest
import torch
import torch.nn.functional as F

from segadv.training.build import build_training
from segadv.parallel import devices_of, parse_device_map, unwrap

from helpers import batch

DEVICE_MAPS = [
    "g:cpu,d:cpu",
    pytest.param("g:cuda:0,d:cpu", marks=pytest.mark.cuda),
    pytest.param("g:cpu,d:cuda:0", marks=pytest.mark.cuda),
    pytest.param("g:1,d:0", marks=pytest.mark.cuda2),
]


def snapshot(module):
    return {k: v.detach().clone() for k, v in unwrap(module).named_parameters()}


def changed(before, module):
    """Names of the parameters that moved (buffers such as BN statistics are not counted)."""
    after = dict(unwrap(module).named_parameters())
    return {k for k, v in before.items() if not torch.equal(v, after[k])}


def build(cfg, spec="g:cpu,d:cpu"):
    torch.manual_seed(0)
    return build_training(cfg, parse_device_map(spec))


@pytest.mark.parametrize("spec", DEVICE_MAPS)
def test_placement_and_cross_device_forward(tiny_cfg, spec):
    parts = build(tiny_cfg, spec)
    g_dev, d_dev = parts.device_map.generator, parts.device_map.devices_of("discriminator")[0]
    assert devices_of(parts.g.module) == {g_dev}
    assert devices_of(parts.d.module) == {d_dev}

    seen = {"g_in": set(), "d_in": set(), "g_out": set()}
    parts.g.module.register_forward_pre_hook(lambda m, a: seen["g_in"].add(a[0].device))
    parts.g.module.register_forward_hook(lambda m, a, out: seen["g_out"].add(out.device))
    parts.d.module.register_forward_pre_hook(lambda m, a: seen["d_in"].add(a[0].device))
    losses = parts.method.iteration(*batch(tiny_cfg), step=0)
    assert seen == {"g_in": {g_dev}, "d_in": {d_dev}, "g_out": {g_dev}}
    assert losses.loss_seg.device == g_dev and losses.loss_d.device == d_dev
    assert all(torch.isfinite(v) for v in losses.as_dict().values())
    # The optimizers' state lives with the parameters it belongs to.
    for opt, dev in ((parts.g.opt, g_dev), (parts.d.opt, d_dev)):
        for state in opt.optimizer.state.values():
            assert {t.device for t in state.values() if torch.is_tensor(t) and t.dim() > 0} <= {dev}


def test_one_step_updates_both_networks(tiny_cfg):
    parts = build(tiny_cfg)
    g0, d0 = snapshot(parts.g.module), snapshot(parts.d.module)
    parts.method.iteration(*batch(tiny_cfg), step=0)
    assert changed(g0, parts.g.module) and changed(d0, parts.d.module)


def test_generator_update_leaves_d_alone_and_d_update_leaves_g_alone(tiny_cfg):
    parts = build(tiny_cfg)
    images, labels = batch(tiny_cfg)
    valid = labels != tiny_cfg.data.ignore_index
    g0, d0 = snapshot(parts.g.module), snapshot(parts.d.module)
    probs, _, loss_adv = parts.method.update_generator(images, labels, valid, step=0)
    assert loss_adv is not None  # the adversarial term was on
    assert changed(g0, parts.g.module)
    assert not changed(d0, parts.d.module)
    assert all(p.requires_grad for p in parts.d.module.parameters())  # unfrozen afterwards

    g1 = snapshot(parts.g.module)
    parts.method.update_discriminator(probs, labels, valid)
    assert changed(d0, parts.d.module)
    assert not changed(g1, parts.g.module)


def generator_grads(parts, images, labels, step):
    """G's gradients from one G update, captured before the optimizer step."""
    parts.g.opt.step = lambda: None  # keep the gradients (the step would apply and clear them)
    torch.manual_seed(1)  # same dropout masks as the reference forward
    valid = labels != parts.method.ignore_index
    parts.method.update_generator(images, labels, valid, step=step)
    grads = {n: p.grad.clone() for n, p in parts.g.module.named_parameters() if p.grad is not None}
    parts.g.module.zero_grad(set_to_none=True)
    return grads


def ce_only_grads(parts, images, labels):
    parts.g.module.zero_grad(set_to_none=True)
    parts.g.module.train()
    torch.manual_seed(1)
    loss = F.cross_entropy(parts.g.module(images).float(), labels, ignore_index=parts.method.ignore_index)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in parts.g.module.named_parameters() if p.grad is not None}
    parts.g.module.zero_grad(set_to_none=True)
    return grads


def assert_grads(a, b, equal):
    assert a.keys() == b.keys()
    same = all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)
    assert same == equal


@pytest.mark.parametrize(
    "lambda_adv, warmup, step, equal",
    [(0.0, 0, 0, True), (0.5, 5, 0, True), (0.5, 5, 5, False), (0.5, 0, 0, False)],
)
def test_adversarial_gradient_reaches_g_only_when_on(tiny_cfg, lambda_adv, warmup, step, equal):
    tiny_cfg.loss.lambda_adv = lambda_adv
    tiny_cfg.loss.adv_warmup_steps = warmup
    parts = build(tiny_cfg)
    # BatchNorm running stats move with every forward: compare from identical module states.
    images, labels = batch(tiny_cfg)
    state = copy.deepcopy(parts.g.module.state_dict())
    grads = generator_grads(parts, images, labels, step)
    parts.g.module.load_state_dict(state)
    assert_grads(grads, ce_only_grads(parts, images, labels), equal)


def test_d_overflow_skips_only_ds_step(tiny_cfg):
    for net in ("generator", "discriminator"):
        setattr(getattr(tiny_cfg.amp, net), "enabled", True)
        setattr(getattr(tiny_cfg.amp, net), "dtype", "float16")
        setattr(getattr(tiny_cfg.amp, net), "init_scale", 256.0)
    parts = build(tiny_cfg)
    assert parts.g.opt.scaler.is_enabled() and parts.d.opt.scaler.is_enabled()
    scale_g, scale_d = parts.g.opt.loss_scale(), parts.d.opt.loss_scale()
    first_conv = unwrap(parts.d.module).features[0].weight
    first_conv.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    g0, d0 = snapshot(parts.g.module), snapshot(parts.d.module)

    parts.method.iteration(*batch(tiny_cfg), step=0)

    assert not changed(d0, parts.d.module), "D's step must be skipped on inf gradients"
    assert parts.d.opt.loss_scale() == scale_d * 0.5
    assert changed(g0, parts.g.module), "G's step must still be taken"
    assert parts.g.opt.loss_scale() == scale_g


def test_bfloat16_autocast_per_network_on_cpu(tiny_cfg):
    tiny_cfg.amp.generator.enabled = True  # bf16 for G only; D stays float32
    parts = build(tiny_cfg)
    dtypes = {}

    def record(name):
        def hook(module, args, out):
            dtypes.setdefault(name, out.dtype)  # returns None: the output is left alone

        return hook

    parts.g.module.register_forward_hook(record("g"))
    unwrap(parts.d.module).classifier.register_forward_hook(record("d"))
    losses = parts.method.iteration(*batch(tiny_cfg), step=0)
    assert dtypes == {"g": torch.bfloat16, "d": torch.float32}
    assert not parts.g.opt.scaler.is_enabled()  # no loss scaling for bfloat16
    assert all(torch.isfinite(v) for v in losses.as_dict().values())


@pytest.mark.cuda
def test_float16_amp_with_both_scalers_on_cuda(tiny_cfg):
    for net in (tiny_cfg.amp.generator, tiny_cfg.amp.discriminator):
        net.enabled, net.dtype = True, "float16"
    parts = build(tiny_cfg, "g:cuda:0,d:cpu")
    assert parts.g.opt.scaler.is_enabled() and parts.d.opt.scaler.is_enabled()
    for step in range(3):
        losses = parts.method.iteration(*batch(tiny_cfg, seed=step), step=step)
    assert all(torch.isfinite(v) for v in losses.as_dict().values())
    assert parts.g.opt.loss_scale() > 0 and parts.d.opt.loss_scale() > 0


@pytest.mark.parametrize("devices, warn_only", [(["cpu"], False), (["cpu", "cuda:0"], True)])
def test_deterministic_is_strict_on_cpu_and_warns_on_cuda(monkeypatch, devices, warn_only):
    """CUDA has no deterministic kernel for bilinear upsampling's backward: strict mode would stop
    at the first backward there. The CPU guarantee stays bitwise (strict)."""
    from segadv.training.process import seed_everything

    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda mode, **kw: calls.append((mode, kw)))
    monkeypatch.setattr("logging.captureWarnings", lambda capture: None)
    seed_everything(0, deterministic=True, devices=[torch.device(d) for d in devices])
    assert calls == [(True, {"warn_only": warn_only})]


@pytest.mark.cuda
def test_deterministic_training_runs_on_cuda(tiny_cfg):
    from segadv.training.loop import train

    tiny_cfg.device_map = "g:cuda:0,d:cuda:0"
    tiny_cfg.train.deterministic = True
    tiny_cfg.train.max_steps = 2
    assert train(tiny_cfg).step == 2
