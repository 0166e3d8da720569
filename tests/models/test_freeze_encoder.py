"""``model.generator.freeze_encoder``: G's encoder (its arch row's backbone) takes no gradient and
holds no optimizer state, its BatchNorm stays in eval mode, and every encoder tensor stays as
built while the head trains; checkpoints keep every key and a frozen run resumes bitwise.

The run tests shrink configs/dinov2_tiny.yaml as tests/integration/test_dinov2_run.py does (ViT-S
cut to 2 blocks, a narrow head, 42 px images, 4 steps)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vit_runs
from segadv.checkpoint import read_checkpoint
from segadv.config.schema import GeneratorConfig
from segadv.engine.optim import build_optimizer
from segadv.models import build_generator

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMMAND = vit_runs.command("dinov2_tiny")
SMALL = [*vit_runs.small(42), "model.generator.freeze_encoder=true"]


def deeplab(freeze: bool) -> torch.nn.Module:
    cfg = GeneratorConfig(arch="deeplabv3plus", encoder="resnet18", encoder_depth=4, decoder_channels=32,
                          decoder_atrous_rates=[1, 2, 3], freeze_encoder=freeze)
    torch.manual_seed(0)
    return build_generator(cfg, num_classes=3)


def test_a_frozen_deeplab_encoder_keeps_every_tensor_while_its_head_trains():
    """A few SGD steps: the encoder's parameters and BatchNorm statistics are bitwise as built
    (its BatchNorm in eval mode through ``train()``), the decoder's moved, and the optimizer holds
    the head's parameters alone."""
    model = deeplab(True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert model.state_dict().keys() == deeplab(False).state_dict().keys()
    opt = build_optimizer(model, _sgd())
    encoder_params = {id(p) for p in model.encoder.parameters()}
    model.train()
    for step in range(3):
        x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    assert all(p.grad is None for p in model.encoder.parameters())
    assert not any(id(p) in encoder_params for group in opt.param_groups for p in group["params"])
    assert opt.state and not any(id(p) in encoder_params for p in opt.state)
    after = model.state_dict()
    moved_encoder = [k for k in before if k.startswith("encoder.") and not torch.equal(before[k], after[k])]
    assert not moved_encoder, moved_encoder[:3]
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("decoder."))
    assert not any(m.training for m in model.encoder.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert any(m.training for m in model.decoder.modules() if isinstance(m, torch.nn.BatchNorm2d))


def _sgd():
    from segadv.config.schema import OptimizerConfig

    return OptimizerConfig(name="sgd", lr=0.1, momentum=0.9, head_lr_mult=10.0)


def test_the_inference_build_of_a_frozen_config_is_the_plain_network():
    from segadv.models.generator import build_generator_for_weights

    cfg = GeneratorConfig(arch="deeplabv3plus", encoder="resnet18", encoder_depth=4, decoder_atrous_rates=[1, 2, 3],
                          freeze_encoder=True)
    model = build_generator_for_weights(cfg, 3)
    assert all(p.requires_grad for p in model.parameters())


def train(run_dir: Path, *extra: str) -> int:
    return vit_runs.train(COMMAND, SMALL, run_dir, *extra)


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory, one_torch_thread):
    return vit_runs.trained(tmp_path_factory.mktemp("frozen") / "run", COMMAND, SMALL)


def test_a_frozen_dinov2_run_moves_the_head_alone_and_keeps_no_encoder_optimizer_state(frozen_run):
    mid, last = (read_checkpoint(frozen_run / "checkpoints" / name) for name in ("step_2.pt", "last.pt"))
    g_mid, g_last = mid["generator"], last["generator"]
    encoder = [k for k in g_last if k.startswith("encoder.")]
    head = [k for k in g_last if k.startswith("head.")]
    assert encoder and head and g_mid.keys() == g_last.keys()
    assert not [k for k in encoder if not torch.equal(g_mid[k], g_last[k])]
    assert [k for k in head if not torch.equal(g_mid[k], g_last[k])]
    # the teacher's copy of the encoder follows G's fixed one (an EMA of equal tensors)
    for k in encoder:
        torch.testing.assert_close(last["teacher"][k], g_last[k], rtol=0, atol=1e-6)
    optimizer = last["optim_generator"]["optimizer"]
    held = sum(len(group["params"]) for group in optimizer["param_groups"])
    head_params = sum(1 for k in head if k.endswith((".weight", ".bias")))
    assert held == head_params == len(optimizer["state"])


def test_a_frozen_run_resumes_bitwise(frozen_run, tmp_path):
    resumed = tmp_path / "resumed"
    assert train(resumed, "--resume", str(frozen_run / "checkpoints" / "step_2.pt")) == 0
    ours, theirs = (read_checkpoint(d / "checkpoints" / "last.pt") for d in (resumed, frozen_run))
    for net in ("generator", "teacher", "discriminator"):
        differ = [k for k in theirs[net] if not torch.equal(ours[net][k], theirs[net][k])]
        assert not differ, f"{net}: {differ[:3]}"


def test_freeze_encoder_is_refused_for_an_arch_without_a_backbone():
    from pydantic import ValidationError

    from segadv.config.generator_section import arch_field
    from segadv.models.registry import GeneratorArch, register_arch, unregister_arch

    class Bare(GeneratorConfig):
        arch: str = arch_field("bare_test_arch")

    register_arch(GeneratorArch("bare_test_arch", Bare, "segadv.models.generator:build_generator"))
    try:
        with pytest.raises(ValidationError, match="names no encoder"):
            GeneratorConfig(arch="bare_test_arch", freeze_encoder=True)
    finally:
        unregister_arch("bare_test_arch")


def test_sync_bn_converts_the_heads_batchnorm_and_leaves_the_frozen_encoders_in_eval_mode():
    """parallel.sync_bn (segadv/training/build.py): torch's conversion would give the frozen
    encoder's BatchNorm back as a plain SyncBatchNorm, whose statistics train."""
    from segadv.models.norm import EvalModeNorm, sync_batch_norms

    model = deeplab(True)
    keys = model.state_dict().keys()
    assert sync_batch_norms(model) is model and model.state_dict().keys() == keys
    encoder = [m for m in model.encoder.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    head = [m for m in model.decoder.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert encoder and all(isinstance(m, EvalModeNorm) and not isinstance(m, torch.nn.SyncBatchNorm) for m in encoder)
    assert head and all(isinstance(m, torch.nn.SyncBatchNorm) for m in head)
    model.train()
    assert not any(m.training for m in encoder) and all(m.training for m in head)

