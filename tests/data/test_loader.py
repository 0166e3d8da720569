"""The one strict loader: every source format round-trips, mismatches fail loudly."""

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from segadv.checkpoint import CheckpointMismatchError, load_weights
from segadv.config.schema import DiscriminatorConfig, GeneratorConfig
from segadv.models import build_discriminator, build_generator

G_CFG = GeneratorConfig(encoder="mobilenet_v2")


def make_g(num_classes=5, encoder="mobilenet_v2", seed=0):
    torch.manual_seed(seed)
    return build_generator(GeneratorConfig(encoder=encoder), num_classes)


def make_d(num_classes=5, seed=0):
    torch.manual_seed(seed)
    return build_discriminator(DiscriminatorConfig(ndf=8), num_classes)


def assert_equal_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def gloo_group(tmp_path_factory):
    """A one-process gloo group, so DistributedDataParallel can be built for real on CPU."""
    store = tmp_path_factory.mktemp("dist") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def wrappers(gloo_group):
    compiled = lambda m: torch.compile(m)  # noqa: E731 - wraps only; nothing is compiled until called
    return {
        "plain": lambda m: m,
        "dataparallel": nn.DataParallel,
        "ddp": nn.parallel.DistributedDataParallel,
        "compiled": compiled,
        "dp(compiled)": lambda m: nn.DataParallel(compiled(m)),
        "compiled(ddp)": lambda m: compiled(nn.parallel.DistributedDataParallel(m)),
    }


@pytest.mark.parametrize("wrapper", ["plain", "dataparallel", "ddp", "compiled", "dp(compiled)", "compiled(ddp)"])
@pytest.mark.parametrize("into_wrapped", [False, True])
def test_raw_state_dict_from_any_wrapper_round_trips(tmp_path, gloo_group, wrapper, into_wrapped):
    wrap = wrappers(gloo_group)[wrapper]
    source = make_g(seed=0)
    path = tmp_path / "w.pt"
    torch.save(wrap(source).state_dict(), path)
    target = make_g(seed=1)
    report = load_weights(path, nn.DataParallel(target) if into_wrapped else target)
    assert_equal_weights(source, target)
    assert len(report.loaded) == len(source.state_dict())
    expected_prefix = {"plain": "", "dataparallel": "module.", "ddp": "module.", "compiled": "_orig_mod.",
                       "dp(compiled)": "module._orig_mod.", "compiled(ddp)": "_orig_mod.module."}[wrapper]
    assert report.prefix == expected_prefix


@pytest.mark.parametrize(
    "layout",
    [
        lambda g, d: {"state_dict": g},  # mmengine / generic
        lambda g, d: {"model": g, "optimizer": {}, "epoch": 3},  # torchvision references
        lambda g, d: {"generator": g, "discriminator": d},
        lambda g, d: {"G": g, "D": d},
        # Lightning: one state dict, keys prefixed by the LightningModule attribute names.
        lambda g, d: {"state_dict": {**{f"generator.{k}": v for k, v in g.items()},
                                     **{f"discriminator.{k}": v for k, v in d.items()}}, "epoch": 1},
        # mmengine GAN with separate DDP wrappers saved without unwrapping.
        lambda g, d: {"meta": {}, "state_dict": {**{f"generator.module.{k}": v for k, v in g.items()},
                                                 **{f"discriminator.module.{k}": v for k, v in d.items()}}},
    ],
    ids=["state_dict", "model", "generator", "G", "lightning", "mmengine-ddp"],
)
def test_weights_under_a_key_or_prefix(tmp_path, layout):
    g, d = make_g(seed=0), make_d(seed=0)
    path = tmp_path / "ckpt.pt"
    torch.save(layout(g.state_dict(), d.state_dict()), path)
    g2, d2 = make_g(seed=1), make_d(seed=1)
    load_weights(path, g2, role="generator")
    assert_equal_weights(g, g2)
    if "discriminator" in str(torch.load(path, weights_only=True).keys()) or "D" in torch.load(path, weights_only=True):
        load_weights(path, d2, role="discriminator")
        assert_equal_weights(d, d2)


def test_wrong_num_classes_lists_shape_mismatches(tmp_path):
    path = tmp_path / "g21.pt"
    torch.save(make_g(num_classes=21).state_dict(), path)
    with pytest.raises(CheckpointMismatchError) as info:
        load_weights(path, make_g(num_classes=5))
    msg = str(info.value)
    assert "g21.pt" in msg and "with a different shape" in msg
    assert "segmentation_head.0.weight: file (21," in msg and "vs model (5," in msg
    assert "21 classes" in msg


def test_wrong_encoder_lists_missing_and_unexpected_grouped(tmp_path):
    path = tmp_path / "r18.pt"
    torch.save(make_g(encoder="resnet18").state_dict(), path)
    with pytest.raises(CheckpointMismatchError) as info:
        load_weights(path, make_g(encoder="mobilenet_v2"))
    msg = str(info.value)
    assert "missing in file" in msg and "unexpected in file" in msg
    assert "encoder.features.*" in msg and "encoder.layer1.*" in msg


def test_discriminator_file_given_as_generator(tmp_path):
    path = tmp_path / "d.pt"
    torch.save(make_d().state_dict(), path)
    with pytest.raises(CheckpointMismatchError, match="looks like a discriminator"):
        load_weights(path, make_g())


def test_partial_init_only_through_explicit_exclude(tmp_path, caplog):
    source = make_g(num_classes=21, seed=0)
    path = tmp_path / "g21.pt"
    torch.save({"state_dict": source.state_dict()}, path)
    target = make_g(num_classes=5, seed=1)
    head_before = {k: v.clone() for k, v in target.state_dict().items() if k.startswith("segmentation_head.")}
    with caplog.at_level("INFO"):
        report = load_weights(path, target, exclude=["segmentation_head.*"])
    assert report.skipped == sorted(head_before)
    assert all(torch.equal(target.state_dict()[k], v) for k, v in head_before.items())
    src = source.state_dict()
    assert all(torch.equal(target.state_dict()[k], src[k]) for k in report.loaded)
    assert "kept 2 model tensors (excluded)" in caplog.text


def test_no_strict_false_anywhere_in_the_codebase():
    root = os.path.join(os.path.dirname(__file__), "..")
    for folder in ("segadv", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if name.endswith(".py"):
                    text = open(os.path.join(dirpath, name), encoding="utf-8").read().replace(" ", "")
                    assert "strict=False" not in text, os.path.join(dirpath, name)
