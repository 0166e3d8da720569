"""Domain adaptation (AdaptSegNet, ADVENT, MinEnt): the multi-level G, the iteration's terms, the
aux D, the target stream, best.pt, resume and export of a multi-level checkpoint.

The iteration is checked on tiny stand-in networks (a conv G with a main and an aux output, no
BatchNorm; the real FC discriminators) against an update computed independently by hand.
"""

import copy
import json
import math

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from segadv.training.build import build_amp_optimizer, build_training
from segadv.checkpoint import load_weights, read_checkpoint
from segadv.checkpoint.loader import CheckpointMismatchError
from segadv.config import load_config
from segadv.config.schema import GeneratorConfig, NetworkAmpConfig, OptimizerConfig
from segadv.engine.network import Network
from segadv.errors import UserError
from segadv.cli import export as export_cli
from segadv.methods.domain_adaptation.iteration import (AdaptSegNet, Advent, MinEnt, mean_entropy,
                                                      own_random_stream, self_information)
from segadv.methods.domain_adaptation.declaration import DomainAdaptationConfig, DomainAdaptationSetup, MinEntConfig

ITERATIONS = {cls.name: cls for cls in (AdaptSegNet, Advent, MinEnt)}
from segadv.models import build_generator, build_generator_for_weights
from segadv.models.discriminator import FCDiscriminator
from segadv.monitor.profile import PhaseTimer
from segadv.parallel import parse_device_map
from segadv.cli.train import main as train_main
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from data_builders import make_folder
from helpers import UDA_OVERRIDES, FixedStream, per_step_losses, stream_positions

C = 3


def uda_cfg(tmp_path, name="run", *extra):
    cfg = load_config(None, [*UDA_OVERRIDES, *extra])
    cfg.run_dir = str(tmp_path / name)
    cfg.device_map = "cpu"
    return cfg


# ---------------------------------------------------------------------------- the two maps


def test_self_information_sums_over_channels_to_the_normalised_entropy():
    logits = torch.randn(2, 5, 6, 7) * 3
    p = logits.softmax(dim=1)
    entropy = -(p * torch.log2(p)).sum(dim=1) / math.log2(5)
    info = self_information(logits)
    assert info.shape == logits.shape and (info >= 0).all()
    torch.testing.assert_close(info.sum(dim=1), entropy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mean_entropy(logits), entropy.mean(), rtol=1e-5, atol=1e-6)
    # A one-hot prediction has zero entropy (and no NaN where P underflows to 0).
    certain = torch.full((1, 5, 2, 2), -1e4)
    certain[:, 2] = 1e4
    assert self_information(certain).abs().max() == 0


# ---------------------------------------------------------------------------- multi-level G


def test_aux_output_has_the_input_size_and_its_gradient_reaches_only_encoder_and_aux_head():
    torch.manual_seed(0)
    generator = build_generator(GeneratorConfig(encoder="mobilenet_v2", aux_head=True), 5)
    x = torch.randn(2, 3, 64, 96)
    main, aux = generator(x, return_aux=True)
    assert main.shape == aux.shape == (2, 5, 64, 96)
    generator.eval()
    torch.testing.assert_close(generator(x), generator(x, return_aux=True)[0])  # forward(x): main only
    generator.train()

    generator(x, return_aux=True)[1].sum().backward()
    grads = {n: p.grad for n, p in generator.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads.items() if n.startswith("aux_head."))
    assert any(g is not None for n, g in grads.items() if n.startswith("encoder."))
    assert all(g is None for n, g in grads.items() if n.startswith(("decoder.", "segmentation_head.")))
    generator.zero_grad(set_to_none=True)
    generator(x).sum().backward()  # the main output never touches the aux head
    assert all(p.grad is None for n, p in generator.named_parameters() if n.startswith("aux_head."))


def test_the_loader_leaves_a_files_aux_head_out_of_an_inference_g_and_needs_exclude_the_other_way():
    cfg = GeneratorConfig(encoder="mobilenet_v2", aux_head=True)
    multi = build_generator(cfg, 5).state_dict()
    plain = build_generator_for_weights(cfg, 5)
    assert not any(k.startswith("aux_head.") for k in plain.state_dict())
    load_weights({"generator": multi}, plain, role="generator")  # aux head left out, the rest strict
    torch.testing.assert_close(plain.state_dict()["segmentation_head.0.weight"], multi["segmentation_head.0.weight"])

    aux_model = build_generator(cfg, 5)
    plain_state = {k: v for k, v in multi.items() if not k.startswith("aux_head.")}
    with pytest.raises(CheckpointMismatchError, match="aux_head"):
        load_weights(plain_state, aux_model, role="generator")
    report = load_weights(plain_state, aux_model, role="generator", exclude=["aux_head.*"])
    assert report.skipped and all(k.startswith("aux_head.") for k in report.skipped)


# ---------------------------------------------------------------------------- the iteration


class TwoLevelG(nn.Module):
    """A stand-in multi-level G: a shared trunk, a main and an aux classifier."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU())
        self.main = nn.Conv2d(6, C, 3, padding=1)
        self.aux = nn.Conv2d(6, C, 1)

    def forward(self, x, return_aux=False):
        h = self.trunk(x)
        return (self.main(h), self.aux(h)) if return_aux else self.main(h)


def make_adaptation(method, settings, multi_level=True, seed=0, lambda_adv=0.0):
    torch.manual_seed(seed)
    generator, d_main, d_aux = TwoLevelG(), FCDiscriminator(C, ndf=4), FCDiscriminator(C, ndf=4)
    device = torch.device("cpu")
    sgd = OptimizerConfig(name="sgd", lr=0.5, momentum=0.0)
    opts = [build_amp_optimizer(m, sgd, NetworkAmpConfig(), device, 100, name=n)
            for m, n in ((generator, "generator"), (d_main, "discriminator"), (d_aux, "discriminator_aux"))]
    g, d, d_aux = (Network(n, m, opt, (device,)) for m, n, opt in zip(
        (generator, d_main, d_aux), ("generator", "discriminator", "discriminator_aux"), opts))
    setup = DomainAdaptationSetup(num_classes=C, ignore_index=255, lambda_adv=lambda_adv, settings=settings,
                                  multi_level=multi_level)
    return ITERATIONS[method](setup, {"generator": g, "discriminator": d, "discriminator_aux": d_aux}, PhaseTimer())


def make_streams(seed=1, n_s=2, n_t=3, size=32):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, C, (n_s, size, size), generator=gen)
    labels[:, :3] = 255
    return {"source": FixedStream((torch.randn(n_s, 3, size, size, generator=gen), labels)),
            "target": FixedStream(torch.randn(n_t, 3, size, size, generator=gen))}


def expected_update(method, settings, multi_level, streams, lr=0.5, lambda_adv=0.0):
    """The parameters after one iteration, from a plain hand-written loop on copies (``lambda_adv``:
    the main level's adversarial weight, loss.lambda_adv)."""
    ref = make_adaptation(method, settings, multi_level, lambda_adv=lambda_adv)
    g, d_main, d_aux = copy.deepcopy(ref.g.module), copy.deepcopy(getattr(ref.levels[0].d, "module", None)), None
    if multi_level:
        d_aux = copy.deepcopy(getattr(ref.levels[1].d, "module", None))
    x_s, y_s = streams["source"].batch
    x_t = streams["target"].batch
    to_map = ITERATIONS[method].discriminator_input

    def gan(logits, label):
        target = torch.full_like(logits, label)
        return F.mse_loss(logits, target) if settings.gan == "ls" else F.binary_cross_entropy_with_logits(logits, target)

    main_s, aux_s = g(x_s, return_aux=True)
    main_t, aux_t = g(x_t, return_aux=True)
    loss = F.cross_entropy(main_s, y_s, ignore_index=255)
    levels = [("main", main_s, main_t, d_main, lambda_adv, settings.lambda_ent_main)]
    if multi_level:
        loss = loss + settings.lambda_seg_aux * F.cross_entropy(aux_s, y_s, ignore_index=255)
        levels.append(("aux", aux_s, aux_t, d_aux, settings.lambda_adv_aux, settings.lambda_ent_aux))
    for _, _, out_t, d, lam_adv, lam_ent in levels:
        p = out_t.softmax(dim=1)
        loss = loss + lam_ent * (-(p * torch.log(p)).sum(dim=1) / math.log(C)).mean()
        if to_map is not None and lam_adv > 0:
            loss = loss + lam_adv * gan(_frozen_call(d, to_map(out_t)), 0.0)
    g_grads = torch.autograd.grad(loss, list(g.parameters()), allow_unused=True)  # single level: aux unused
    d_grads = []
    if to_map is not None:
        for _, out_s, out_t, d, _, _ in levels:
            loss_d = 0.5 * (gan(d(to_map(out_s).detach()), 0.0) + gan(d(to_map(out_t).detach()), 1.0))
            d_grads.append((d, torch.autograd.grad(loss_d, list(d.parameters()))))
    with torch.no_grad():
        for p, grad in zip(g.parameters(), g_grads):
            if grad is not None:
                p -= lr * grad
        for d, grads in d_grads:
            for p, grad in zip(d.parameters(), grads):
                p -= lr * grad
    return g, d_main, d_aux


def _frozen_call(d, maps):
    """D's output with its parameters treated as constants (the gradient reaches only G)."""
    params = {n: p.detach() for n, p in d.named_parameters()}
    return torch.func.functional_call(d, params, (maps,))


def assert_same_parameters(actual, expected, atol=1e-6):
    for (name, a), b in zip(actual.named_parameters(), expected.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=lambda m: f"{name}: {m}")


CASES = [  # the main level's adversarial weight is loss.lambda_adv, the iteration's lambda_adv
    ("adaptsegnet", DomainAdaptationConfig(lambda_adv_aux=0.2), True, 0.3),
    ("adaptsegnet", DomainAdaptationConfig(gan="ls"), False, 0.3),
    ("advent", DomainAdaptationConfig(lambda_adv_aux=0.2, lambda_ent_main=0.1), True, 0.3),
    ("minent", MinEntConfig(lambda_ent_main=0.4, lambda_ent_aux=0.2), True, 0.0),
]


@pytest.mark.parametrize("method,settings,multi_level,lambda_adv", CASES,
                         ids=["adaptsegnet-multi", "adaptsegnet-single-ls", "advent-multi", "minent"])
def test_one_iteration_equals_the_hand_written_update(method, settings, multi_level, lambda_adv):
    """G with every D frozen (source CE, aux CE, target adversarial and entropy terms), then each D
    on source maps as 0 and target maps as 1: parameters equal a plain loop's after one step."""
    streams = make_streams()
    uda = make_adaptation(method, settings, multi_level, lambda_adv=lambda_adv)
    losses = uda(streams, step=0)
    g, d_main, d_aux = expected_update(method, settings, multi_level, streams, lambda_adv=lambda_adv)
    assert_same_parameters(uda.g.module, g)
    if method != "minent":
        assert_same_parameters(uda.levels[0].d.module, d_main)
        assert "loss_d" in losses
    else:
        assert "loss_d" not in losses and all(level.d is None for level in uda.levels)
    if multi_level and method != "minent":
        assert_same_parameters(uda.levels[1].d.module, d_aux)
        assert {"loss_seg_aux", "loss_adv_aux", "loss_d_aux"} <= set(losses)
    assert streams["source"].drawn == streams["target"].drawn == 1


def test_the_aux_discriminator_sees_only_aux_maps_and_the_main_one_only_main_maps():
    uda = make_adaptation("adaptsegnet", DomainAdaptationConfig(lambda_adv_aux=0.2), lambda_adv=0.3)
    streams = make_streams()
    seen = {"main": [], "aux": []}
    outputs = []
    uda.g.module.register_forward_hook(lambda m, args, out: outputs.append([o.detach() for o in out]))
    for level in uda.levels:
        level.d.module.register_forward_hook(
            lambda m, args, out, name=level.name: seen[name].append(args[0].detach()))
    uda(streams, step=0)
    (main_s, aux_s), (main_t, aux_t) = outputs  # G on the source batch, then on the target batch
    # D_<level> sees: the target maps in G's update, then the source and the target maps in its own.
    for name, logits_s, logits_t in (("main", main_s, main_t), ("aux", aux_s, aux_t)):
        g_view, d_source, d_target = seen[name]
        torch.testing.assert_close(g_view, logits_t.softmax(dim=1))
        torch.testing.assert_close(d_source, logits_s.softmax(dim=1))
        torch.testing.assert_close(d_target, logits_t.softmax(dim=1))
    assert not torch.allclose(main_t.softmax(dim=1), aux_t.softmax(dim=1))  # the levels differ


# ---------------------------------------------------------------------------- end to end


def test_training_logs_per_discriminator_losses_and_scales_and_keeps_the_best_snapshot(tmp_path):
    cfg = uda_cfg(tmp_path, "run", "train.max_steps=4", "train.eval_every=1", "train.log_every=2",
                  "log.tensorboard=false", "train.eval_source=true")
    cfg.device_map = "g:cpu,d:cpu,d_aux:cpu"
    result = train(cfg)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = {k for r in records for k in r}
    assert {"train/loss_d", "train/loss_d_aux", "train/loss_adv_aux", "train/loss_seg_aux", "amp/scale_d_aux",
            "train/lr_d_aux", "val/best_mIoU", "val_source/mIoU"} <= logged
    # val/* is the target's, val_source/* the source's: different images, different numbers.
    last = [r for r in records if "val_source/mIoU" in r][-1]
    source_eval = evaluate_on(result.run_dir, cfg.data)
    assert last["val_source/mIoU"] == pytest.approx(source_eval, abs=1e-6)
    last_target = [r for r in records if "val/mIoU" in r][-1]
    assert last_target["val/mIoU"] == pytest.approx(evaluate_on(result.run_dir, cfg.target_data), abs=1e-6)
    evals = [(r["val/mIoU"], r["step"]) for r in records if "val/mIoU" in r]
    best_miou, best_step = max(evals, key=lambda e: (e[0], -e[1]))  # the first of equal bests
    record = json.loads((result.run_dir / "checkpoints" / "best.json").read_text())
    assert (record["step"], record["mIoU"]) == (best_step, best_miou) == (result.best["step"], result.best["mIoU"])
    best = read_checkpoint(result.run_dir / "checkpoints" / "best.pt")
    assert best["step"] == best_step and "discriminator_aux" in best and "optim_discriminator_aux" in best
    assert any(k.startswith("aux_head.") for k in best["generator"])


def test_the_target_pass_draws_from_its_own_stream_and_leaves_the_random_state_as_it_was():
    torch.manual_seed(5)
    before = torch.get_rng_state()
    expected_next = torch.rand(8)
    torch.set_rng_state(before)
    with own_random_stream([torch.device("cpu")]):
        inside = torch.rand(8)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(torch.rand(8), expected_next)
    assert not torch.equal(inside, expected_next)  # not the next source pass's masks again
    torch.set_rng_state(before)
    with own_random_stream([torch.device("cpu")]):
        assert torch.equal(torch.rand(8), inside)  # a function of the state it starts from (resume)


def test_with_frozen_batchnorm_the_control_trains_g_bitwise_as_source_only(tmp_path):
    """The BatchNorm control (AdaptSegNet with no target term) forwards target batches through G;
    with BatchNorm frozen nothing of that may reach G: not its statistics, and not the random state
    (the DeepLabV3+ decoder's dropout masks) that later source passes draw from."""
    common = [o for o in UDA_OVERRIDES if o != "model.generator.aux_head=true"] + [
        "model.generator.aux_head=false", "model.generator.norm=frozen", "train.max_steps=3",
        "train.eval_every=100", "checkpoint.every=100", "log.tensorboard=false", "train.deterministic=true"]
    weights = {}
    for name, extra in (("source_only", ["method.name=supervised", "loss.lambda_adv=0"]),
                        ("control", ["loss.lambda_adv=0"])):
        cfg = load_config(None, [*common, *extra])
        cfg.run_dir, cfg.device_map = str(tmp_path / name), "cpu"
        weights[name] = read_checkpoint(train(cfg).run_dir / "checkpoints" / "last.pt")["generator"]
    source_only, control = weights["source_only"], weights["control"]
    assert any(isinstance(m, nn.Dropout) and m.p > 0 for m in build_generator(
        load_config(None, common).model.generator, 5).modules())  # the case this is about
    assert source_only.keys() == control.keys()
    assert [k for k in source_only if not torch.equal(source_only[k], control[k])] == []


def evaluate_on(run_dir, data_cfg):
    """The final G's mIoU on a data section's val split, computed apart from training."""
    from segadv.data import build_val_loader
    from segadv.engine.evaluate import evaluate

    generator = build_generator_for_weights(load_config(None, UDA_OVERRIDES).model.generator, 5)
    load_weights(run_dir / "checkpoints" / "last.pt", generator, role="generator")
    loader = build_val_loader(data_cfg, seed=0, pin_memory=False)
    return evaluate(generator, loader, torch.device("cpu"), 5).metrics["mIoU"]


def test_target_labels_are_never_read(tmp_path):
    """A folder target whose train split has no masks at all trains; val has its masks."""
    make_folder(tmp_path / "target", n_train=6, n_val=3, num_classes=5)
    for mask in (tmp_path / "target" / "train" / "masks").iterdir():
        mask.unlink()
    (tmp_path / "target" / "train" / "masks").rmdir()
    target = (f"target_data={{kind: folder, root: {tmp_path / 'target'}, num_classes: 5, val_batch_size: 3, "
              "num_workers: 0, train_transforms: [{name: Resize, height: 32, width: 32}], "
              "val_transforms: [{name: Resize, height: 32, width: 32}]}")
    cfg = uda_cfg(tmp_path, "run", target, "train.max_steps=2", "log.tensorboard=false",
                  "data.synthetic.image_size=32")
    result = train(cfg)
    assert result.step == 2 and 0 <= result.val_metrics["mIoU"] <= 1


def test_resume_is_exact_with_source_and_target_streams(tmp_path):
    """7 steps in one go equal 5 + resume + 2, bitwise, with the streams at different epochs
    (source: 8 batches an epoch, target: 4) and the aux D's state restored."""
    extra = ["train.max_steps=7", "train.log_every=1", "train.eval_every=100", "checkpoint.every=3",
             "train.deterministic=true", "log.tensorboard=false", "method.adaptsegnet.target_batch_size=3",
             "loss.lambda_adv=0.1", "method.adaptsegnet.lambda_adv_aux=0.1"]
    keys = ("train/loss_seg", "train/loss_seg_aux", "train/loss_adv", "train/loss_adv_aux", "train/loss_d",
            "train/loss_d_aux")

    full = train(uda_cfg(tmp_path, "full", *extra))
    first = train(uda_cfg(tmp_path, "split", *extra), stop_at=5)
    ckpt = read_checkpoint(tmp_path / "split" / "checkpoints" / "last.pt")
    assert stream_positions(ckpt) == {"source": 5, "target": 5}
    second = train(uda_cfg(tmp_path, "split", *extra), resume="auto")
    assert (full.step, first.step, second.step) == (7, 5, 7)
    assert per_step_losses(second.run_dir, keys) == per_step_losses(full.run_dir, keys)


@pytest.mark.parametrize("device_map,message", [
    ("g:cpu,d:cpu,d_aux:cuda:3", "d_aux"),
    ("g:cpu,d_aux:cpu,d_aux:cpu", "given twice"),
    ("g:cpu,d:cpu,daux:cpu", "unknown role 'daux'"),
])
def test_a_bad_d_aux_exits_2_naming_it(tmp_path, device_map, message, capsys):
    code = train_main(["--device-map", device_map, "--run-dir", str(tmp_path / "r"), *UDA_OVERRIDES])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_d_aux_without_an_aux_discriminator_and_aux_head_outside_adaptation_are_user_errors():
    cfg = load_config(None, [*UDA_OVERRIDES, "model.generator.aux_head=false"])
    with pytest.raises(UserError, match="d_aux"):
        build_training(cfg, parse_device_map("g:cpu,d:cpu,d_aux:cpu"))
    cfg = load_config(None, [*TINY_OVERRIDES, "model.generator.aux_head=true"])
    with pytest.raises(UserError, match="aux_head"):
        build_training(cfg, parse_device_map("cpu"))
    cfg = load_config(None, [*TINY_OVERRIDES, "method.name=advent"])
    with pytest.raises(UserError, match="target_data"):
        build_training(cfg, parse_device_map("cpu"))


@pytest.mark.cuda2
def test_each_discriminator_lives_on_its_own_device(tmp_path):
    cfg = load_config(None, UDA_OVERRIDES)
    parts = build_training(cfg, parse_device_map("g:0,d:1,d_aux:0"))
    devices = {net.role: {p.device for p in net.module.parameters()} for net in parts.networks()}
    assert devices == {"generator": {torch.device("cuda", 0)}, "discriminator": {torch.device("cuda", 1)},
                       "discriminator_aux": {torch.device("cuda", 0)}}
    cfg.device_map, cfg.run_dir = "g:0,d:1,d_aux:0", str(tmp_path / "run")
    assert train(cfg).step == cfg.train.max_steps


@pytest.mark.usefixtures("one_torch_thread")
def test_export_of_a_multi_level_checkpoint_has_the_main_output_only_and_verifies(tmp_path):
    cfg = uda_cfg(tmp_path, "run", "train.max_steps=2", "log.tensorboard=false")
    train(cfg)
    output = tmp_path / "g.onnx"
    assert export_cli.main(["--checkpoint", str(tmp_path / "run" / "checkpoints" / "last.pt"),
                            "--output", str(output)]) == 0
    # Exit 0: verified against eager (the main output of the checkpoint's G). One output, and
    # none of the aux head's weights in the graph.
    model = onnx.load(str(output))
    assert [o.name for o in model.graph.output] == ["logits"] or len(model.graph.output) == 1
    assert not any("aux_head" in init.name for init in model.graph.initializer)
    aux_weight = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["generator"]["aux_head.3.weight"]
    stored = [onnx.numpy_helper.to_array(init) for init in model.graph.initializer]
    assert not any(a.shape == tuple(aux_weight.shape) and np.allclose(a, aux_weight.numpy()) for a in stored)


def test_the_synthetic_target_domain_draws_its_own_samples_with_the_same_classes():
    from segadv.data.synthetic import SyntheticShapes

    source = SyntheticShapes("train", 6, 48, 5, seed=0)
    target = SyntheticShapes("train", 6, 48, 5, seed=0, domain="target")
    again = SyntheticShapes("train", 6, 48, 5, seed=0, domain="target")
    for i in range(6):
        image, mask = target.raw(i)
        assert np.array_equal(image, again.raw(i)[0]) and np.array_equal(mask, again.raw(i)[1])  # deterministic
        assert not np.array_equal(mask, source.raw(i)[1])  # its own draw, not a restyled source sample
        assert set(np.unique(mask)) <= set(range(5))
    # The look differs: the target's colours are less saturated (mean channel spread per pixel).
    def saturation(ds):
        return np.mean([np.ptp(ds.raw(i)[0].astype(float), axis=2).mean() for i in range(6)])
    assert saturation(target) < 0.8 * saturation(source)


def test_segadv_eval_measures_a_multi_level_checkpoint_on_the_target_like_training(tmp_path, capsys):
    from segadv.cli.eval import main as eval_main

    result = train(uda_cfg(tmp_path, "run", "train.max_steps=2", "log.tensorboard=false"))
    capsys.readouterr()
    assert eval_main(["--checkpoint", str(result.run_dir / "checkpoints" / "last.pt"), "--device", "cpu",
                      "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["mIoU"] == pytest.approx(result.val_metrics["mIoU"], abs=1e-6)

    # segadv-ckpt convert writes the inference G: main output only, no aux head.
    from segadv.cli.ckpt import main as ckpt_main

    converted = tmp_path / "g.pt"
    assert ckpt_main(["convert", str(result.run_dir / "checkpoints" / "last.pt"), "--output", str(converted)]) == 0
    weights = torch.load(converted, weights_only=True)
    weights = weights.get("generator", weights) if isinstance(weights.get("generator"), dict) else weights
    assert weights and not any("aux_head" in k for k in weights)
    assert any(k.startswith("segmentation_head.") for k in weights)
