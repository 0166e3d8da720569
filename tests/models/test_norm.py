"""model.generator.norm: train, frozen_affine (the references'), frozen (mmseg's norm_eval)."""

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from segadv.config.schema import GeneratorConfig, OptimizerConfig
from segadv.engine.optim import build_optimizer
from segadv.models import build_generator
from segadv.parallel.activation_checkpoint import apply_activation_checkpointing
from segadv.parallel.wrap import HostDataParallel

TINY = dict(encoder="mobilenet_v2", encoder_depth=3, output_stride=8, decoder_channels=16,
            decoder_atrous_rates=[1, 2, 3])


def generator(norm, **kwargs):
    torch.manual_seed(0)
    return build_generator(GeneratorConfig(**{**TINY, **kwargs, "norm": norm}), num_classes=3)


def norms(model):
    return [m for m in model.modules() if isinstance(m, _BatchNorm)]


def statistics(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running_" in k or "num_batches" in k}


def affine(model):
    return [p for m in norms(model) for p in m.parameters(recurse=False)]


def sgd_step(model, x):
    opt = build_optimizer(model, OptimizerConfig(name="sgd", lr=0.1, weight_decay=0.1))
    model.train()
    model(x).sum().backward()
    opt.step()
    return opt


def test_train_is_torchs_batchnorm():
    g = generator("train")
    before, weights = statistics(g), [p.clone() for p in affine(g)]
    sgd_step(g, torch.randn(2, 3, 32, 32))
    assert all(m.training for m in norms(g))
    assert any(not torch.equal(before[k], v) for k, v in statistics(g).items())
    assert any(not torch.equal(w, p) for w, p in zip(weights, affine(g)))


def test_frozen_affine_fixes_weight_and_bias_and_updates_the_statistics():
    """The references': requires_grad False on every BatchNorm's weight and bias, none of them in
    the optimizer (no weight decay moves them), batch statistics, running ones updated."""
    g = generator("frozen_affine")
    before, weights = statistics(g), [p.clone() for p in affine(g)]
    opt = sgd_step(g, torch.randn(2, 3, 32, 32))
    optimized = {id(p) for group in opt.param_groups for p in group["params"]}
    assert affine(g) and not any(p.requires_grad or id(p) in optimized for p in affine(g))
    assert all(torch.equal(w, p) for w, p in zip(weights, affine(g)))
    assert all(m.training for m in norms(g))
    assert all(not torch.equal(before[k], v) for k, v in statistics(g).items())
    assert {n for n, p in g.named_parameters() if p.requires_grad} == \
        {n for n, p in generator("train").named_parameters()} - {n for n, p in g.named_parameters() if not p.requires_grad}


@pytest.mark.parametrize("arch", ["deeplabv3", "deeplabv3plus", "deeplabv2"])
def test_frozen_fixes_statistics_and_affine_and_a_batch_of_one_trains(arch):
    """Eval-mode BatchNorm while G trains: the running statistics (and num_batches_tracked) never
    move, weight and bias neither; a batch of one trains, DeepLabV3's image pooling included
    (whose training-mode BatchNorm refuses one value per channel)."""
    g = generator("frozen", arch=arch)
    before, weights = statistics(g), [p.clone() for p in affine(g)]
    one = torch.randn(1, 3, 32, 32)
    sgd_step(g, one)
    sgd_step(g, one)
    assert all(torch.equal(before[k], v) for k, v in statistics(g).items())
    assert all(torch.equal(w, p) for w, p in zip(weights, affine(g)))
    assert not any(m.training for m in norms(g))
    assert g.training
    if arch != "deeplabv2":
        with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
            sgd_step(generator("train", arch=arch), one)


def test_frozen_survives_every_train_call_and_keeps_the_state_dict():
    g = generator("frozen", aux_head=True)
    plain = generator("train", aux_head=True)
    assert list(g.state_dict()) == list(plain.state_dict())  # names and buffers unchanged
    g.load_state_dict(plain.state_dict())  # strict, both ways
    plain.load_state_dict(g.state_dict())
    for call in (lambda: g.train(), lambda: g.train(True), lambda: g.encoder.train(), lambda: g.eval().train(),
                 lambda: [m.train() for m in g.modules()], lambda: HostDataParallel(g).train()):
        call()
        assert not any(m.training for m in norms(g))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():  # the decoder's dropout aside, training mode computes what eval mode does
        g.decoder.apply(lambda m: setattr(m, "p", 0.0) if isinstance(m, nn.Dropout) else None)
        torch.testing.assert_close(g.train()(x), g.eval()(x), rtol=0, atol=0)


def test_frozen_holds_in_dataparallel_replicas():
    """nn.DataParallel builds its replicas with each module's _replicate_for_data_parallel (a new
    object of the module's own class, its flags copied), the call made here directly (replicate
    itself needs CUDA): every replica's BatchNorm stays in eval mode, as the module's."""
    g = generator("frozen").train()
    for norm in norms(g):
        replica = norm._replicate_for_data_parallel()
        assert type(replica) is type(norm) and not replica.training
        replica.train()
        assert not replica.training


def test_frozen_under_activation_checkpointing_recomputes_the_same_forward():
    """The checkpoint's recompute runs each module in its own mode: eval-mode BatchNorm in the
    first forward and the recompute alike, so the gradients are those of the plain frozen G."""
    plain, checkpointed = generator("frozen"), generator("frozen")
    apply_activation_checkpointing(checkpointed)
    before = statistics(checkpointed)
    x = torch.randn(2, 3, 32, 32)
    for g in (plain, checkpointed):
        g.train()
        torch.manual_seed(7)  # the decoder's dropout masks: the same in both (the recompute replays them)
        g(x).square().sum().backward()
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0)
    assert all(torch.equal(before[k], v) for k, v in statistics(checkpointed).items())


def test_an_unknown_norm_setting_is_refused_by_the_schema():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="norm"):
        GeneratorConfig(norm="frozen_stats")


def test_sync_bn_with_frozen_is_a_user_error(tiny_cfg):
    from segadv.training.build import build_training
    from segadv.errors import UserError
    from segadv.parallel import parse_device_map

    tiny_cfg.model.generator.norm = "frozen"
    tiny_cfg.parallel.sync_bn = True
    with pytest.raises(UserError, match="parallel.sync_bn with model.generator.norm=frozen"):
        build_training(tiny_cfg, parse_device_map("g:cpu,d:cpu"))


def test_frozen_module_is_eval_mode_batchnorm_of_its_own_class():
    g = generator("frozen")
    bn = norms(g)[0]
    assert isinstance(bn, nn.BatchNorm2d) and type(bn).__name__ == "EvalModeBatchNorm2d"
