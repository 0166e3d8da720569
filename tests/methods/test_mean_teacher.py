"""The mean teacher (issue 47): its networks by setting (the teacher role, no D with lambda_adv 0),
the teacher's pseudo labels, the mixing per setting, the confidence weights, the EMA after each G
step, D on top, and an exact resume with the teacher and the mixing RNG in the checkpoint."""

from __future__ import annotations

import copy

import pytest
import torch

from segadv.checkpoint import read_checkpoint
from segadv.config import load_config
from segadv.config.roles import role
from segadv.methods import mixing, registry
from segadv.methods.mean_teacher import iteration as mt_iteration
from segadv.parallel import parse_device_map
from segadv.training.build import build_training, start_copies
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from helpers import TARGET_DATA, FixedStream, assert_checkpoints_equal, batch, resume_cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SEMI = [*TINY_OVERRIDES, "method.name=mean_teacher"]
UDA = [*TINY_OVERRIDES, TARGET_DATA, "method.name=mean_teacher"]


def built(overrides, device_map="cpu"):
    cfg = load_config(None, overrides)
    parts = build_training(cfg, parse_device_map(device_map))
    start_copies(parts)
    return cfg, parts


def fixed_streams(cfg, parts, seed=0):
    images, labels = batch(cfg, 2, seed)
    images_u, _ = batch(cfg, 2, seed + 1)
    names = [spec.name for spec in type(parts.method).data_streams(cfg)]  # the streams this run draws
    streams = {}
    for name in names:
        streams[name] = FixedStream(images_u if name in ("unlabeled", "target") else (images, labels))
    return streams, images, labels, images_u


def weights(module):
    return {name: t.detach().clone() for name, t in module.state_dict().items()}


def test_the_teacher_is_a_role_that_is_not_trained():
    spec = role("teacher")
    assert (spec.short, spec.falls_back_to, spec.trained, spec.starts_as) == ("t", "generator", False, "generator")
    assert role("generator").trained and role("discriminator").trained


@pytest.mark.parametrize("overrides, streams", [
    (SEMI, ("labeled", "unlabeled")),
    (UDA, ("source", "target")),
    ([*SEMI, "loss.lambda_adv=0.01"], ("labeled", "unlabeled", "gt")),
    ([*UDA, "loss.lambda_adv=0.001"], ("source", "target")),
])
def test_networks_and_streams_by_setting(overrides, streams):
    cfg = load_config(None, overrides)
    cls = registry.method_class("mean_teacher")
    adversarial = cls.adversarial_weight(cfg) > 0  # null: the mean teacher's 0, no D
    assert cls.networks(cfg) == ("generator", "teacher") + (("discriminator",) if adversarial else ())
    assert tuple(spec.name for spec in cls.data_streams(cfg)) == streams
    assert cls.passes_generator_loss_through_discriminator(cfg) is adversarial


def test_no_discriminator_is_built_with_lambda_adv_zero_and_the_teacher_has_no_optimizer():
    _, parts = built(SEMI)
    assert [r.name for r in parts.roles] == ["generator", "teacher"]
    assert parts.d is None
    teacher = parts.network("teacher")
    assert teacher.opt is None and not teacher.trained
    assert [net.role for net in parts.networks()] == ["generator"]  # what the loop steps and logs
    assert not any(p.requires_grad for p in teacher.bare.parameters())
    assert teacher.bare is not parts.g.bare
    for name, tensor in parts.g.bare.state_dict().items():  # a copy of G's initial weights
        assert torch.equal(tensor, teacher.bare.state_dict()[name]), name


def test_the_teacher_has_its_own_autocast_falling_back_to_g():
    cfg, parts = built([*SEMI, "amp.generator.enabled=true"])
    assert parts.network("teacher").autocast().fast_dtype == torch.bfloat16
    with parts.network("teacher").autocast():
        assert torch.is_autocast_enabled("cpu")
    cfg, parts = built([*SEMI, "amp.generator.enabled=true", "amp.teacher={enabled: false}"])
    with parts.network("teacher").autocast():
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("overrides", [SEMI, [*SEMI, "method.mean_teacher.teacher_batchnorm=running"], UDA],
                         ids=["semi", "semi-running", "uda"])
def test_pseudo_labels_are_the_teachers_argmax_on_the_unmixed_images(overrides, monkeypatch):
    cfg, parts = built(overrides)
    method = parts.method
    streams, images, labels, images_u = fixed_streams(cfg, parts)
    seen = {}
    real_mix = mixing.mix

    def spy_mix(mask, foreground, background):
        if foreground.dim() == 3 and not foreground.is_floating_point():
            seen["pseudo"] = background.clone()
            seen["labels"] = foreground.clone()
            seen["mask"] = mask.clone()
        return real_mix(mask, foreground, background)

    monkeypatch.setattr(mixing, "mix", spy_mix)
    # The teacher's BatchNorm as the setting says (batch: train mode, this batch's statistics, and
    # dropout off as DAFormer's DACS sets it), on a copy: its running statistics are the method's.
    teacher = copy.deepcopy(parts.network("teacher").bare)
    with torch.no_grad():
        teacher.train(cfg.method.mean_teacher.teacher_batchnorm == "batch")
        for module in teacher.modules():
            if isinstance(module, torch.nn.Dropout):
                module.eval()
        expected = teacher(images_u).float().softmax(dim=1).argmax(dim=1)
    method(streams, 0)
    assert torch.equal(seen["pseudo"], expected)
    assert torch.equal(seen["labels"], labels)
    # ClassMix: the mask covers whole classes of the labeled map, about half of those present
    mask = seen["mask"]
    for image in range(len(labels)):
        present = set(labels[image].unique().tolist())
        chosen = set(labels[image][mask[image]].unique().tolist())
        assert chosen <= present and len(chosen) == (len(present) + 1) // 2
        assert torch.equal(mask[image], torch.isin(labels[image], torch.tensor(sorted(chosen))))


def test_cutmix_mixes_with_a_box(monkeypatch):
    cfg, parts = built([*SEMI, "method.mean_teacher.mix=cutmix"])
    streams, *_ = fixed_streams(cfg, parts)
    calls = []
    real_box = mixing.box_mask
    monkeypatch.setattr(mixing, "box_mask", lambda *a, **k: calls.append(a) or real_box(*a, **k))
    monkeypatch.setattr(mixing, "class_mix_mask", lambda *a, **k: pytest.fail("ClassMix under mix: cutmix"))
    parts.method(streams, 0)
    assert calls and calls[0][:2] == (2, (64, 64))


def test_the_mixed_loss_weights_pasted_pixels_one_and_the_rest_by_the_teachers_confidence(monkeypatch):
    cfg, parts = built(SEMI)
    streams, *_ = fixed_streams(cfg, parts)
    seen = {}
    real = mixing.pixel_weighted_cross_entropy

    def spy(logits, labels, weight, ignore_index=255):
        seen["weight"] = weight.clone()
        return real(logits, labels, weight, ignore_index)

    real_mask = mixing.class_mix_mask
    monkeypatch.setattr(mixing, "class_mix_mask", lambda *a, **k: seen.setdefault("mask", real_mask(*a, **k)))
    monkeypatch.setattr(mixing, "pixel_weighted_cross_entropy", spy)
    losses = parts.method(streams, 0)
    mask, weight = seen["mask"], seen["weight"]
    assert torch.all(weight[mask] == 1)
    rest = weight[~mask]
    assert torch.all(rest == rest[0])  # DACS: one share for the batch
    assert torch.allclose(losses["pseudo_confidence"], rest[0])


def test_confidence_weights_follow_the_references():
    _, parts = built(SEMI)
    method = parts.method
    confidence = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(0)) * 0.05 + 0.95
    assert torch.equal(method.pseudo_weight(confidence), mixing.dacs_pseudo_weight(confidence, 0.968))
    method.settings = method.settings.model_copy(update={"confidence_share": "image"})
    assert torch.equal(method.pseudo_weight(confidence), mixing.dacs_pseudo_weight(confidence, 0.968, per_image=True))
    method.settings = method.settings.model_copy(update={"confidence": "french", "confidence_share": "batch"})
    share = (confidence >= 0.97).float().mean()
    assert torch.allclose(method.pseudo_weight(confidence), share.expand_as(confidence))
    method.settings = method.settings.model_copy(update={"confidence_share": "pixel"})
    assert torch.equal(method.pseudo_weight(confidence), (confidence >= 0.97).float())


def test_french_confidence_over_the_batch_tests_the_top_probability_itself():
    # French et al.: conf_tea >= conf_thresh on the teacher's top probability. A pixel whose top
    # probability is at most 1 - threshold is not confident (34 classes: a near-uniform softmax).
    _, parts = built(SEMI)
    method = parts.method
    method.settings = method.settings.model_copy(update={"confidence": "french", "confidence_share": "batch"})
    logits = torch.zeros(2, 34, 4, 4)
    logits[:, 0] = 0.01  # top probability about 0.0297 < 1 - 0.97
    confidence, _ = mixing.teacher_confidence(logits)
    assert confidence.max() <= 1 - 0.97
    assert torch.equal(method.pseudo_weight(confidence), torch.zeros_like(confidence))
    # a lowered threshold: 0.8 with top probabilities 0.1 and 0.85 (half the pixels pass)
    method.settings = method.settings.model_copy(update={"french_threshold": 0.8})
    confidence = torch.full((2, 4, 4), 0.1)
    confidence[:, :2] = 0.85
    assert torch.equal(method.pseudo_weight(confidence), torch.full_like(confidence, 0.5))


@pytest.mark.parametrize("warmup,batchnorm", [(True, "batch"), (False, "batch"), (True, "running")])
def test_the_teacher_is_the_ema_of_g_after_each_g_step(warmup, batchnorm):
    cfg, parts = built([*SEMI, f"method.mean_teacher.ema_warmup={str(warmup).lower()}",
                        f"method.mean_teacher.teacher_batchnorm={batchnorm}"])
    teacher, g = parts.network("teacher"), parts.g
    streams, *_ = fixed_streams(cfg, parts)
    # DACS's EMA averages the parameters (the train-mode teacher's statistics follow its own
    # batches); French et al.'s every float tensor, the running statistics included.
    averaged = {name for name, _ in teacher.bare.named_parameters()}
    if batchnorm == "running":
        averaged |= {name for name, b in teacher.bare.named_buffers() if b.is_floating_point()}
    for step in range(2):
        before = weights(teacher.bare)
        parts.step(streams, step)
        after_g = weights(g.bare)
        decay = mixing.ema_decay(step, 0.99, warmup=warmup)
        for name, tensor in teacher.bare.state_dict().items():
            if name not in averaged:
                continue
            expected = decay * before[name] + (1 - decay) * after_g[name]
            assert torch.allclose(tensor, expected, atol=1e-6), (step, name)
    if warmup:  # DACS's first update copies the student
        assert mixing.ema_decay(0, 0.99) == 0.0


def test_with_accumulation_the_teacher_moves_once_per_optimizer_step():
    cfg, parts = built([*SEMI, "train.accumulation_steps=2", "data.batch_size=4",
                        "model.generator.norm=frozen"])
    streams, *_ = fixed_streams(cfg, parts)
    images, labels = batch(cfg, 4)
    images_u, _ = batch(cfg, 4, 1)
    streams = {"labeled": FixedStream((images, labels)), "unlabeled": FixedStream(images_u)}
    calls = []
    real = mt_iteration.MeanTeacher.update_teacher
    parts.method.update_teacher = lambda step: calls.append(step) or real(parts.method, step)
    parts.step(streams, 0)
    parts.step(streams, 1)
    assert calls == [0, 1]


@pytest.mark.parametrize("overrides", [[*SEMI, "loss.lambda_adv=0.01"],
                                       [*UDA, "loss.lambda_adv=0.001"]], ids=["advsemiseg", "adaptsegnet"])
def test_lambda_adv_trains_d_as_the_method_it_comes_from(overrides):
    cfg, parts = built(overrides)
    assert [r.name for r in parts.roles] == ["generator", "teacher", "discriminator"]
    streams, *_ = fixed_streams(cfg, parts)
    d_before = weights(parts.d.bare)
    losses = parts.step(streams, 0)
    assert {"loss_adv", "loss_d"} <= set(losses)
    assert all(torch.isfinite(v) for v in losses.values())
    assert any(not torch.equal(t, d_before[n]) for n, t in parts.d.bare.state_dict().items())
    if "gt" in streams:
        assert streams["gt"].drawn == 1


def test_a_teacher_entry_in_the_device_map_needs_a_run_with_a_teacher():
    from segadv.errors import UserError

    cfg = load_config(None, [*TINY_OVERRIDES, "method.name=advsemiseg"])
    with pytest.raises(UserError, match="t names a device, but this run trains no teacher"):
        build_training(cfg, parse_device_map("g:cpu,d:cpu,t:cpu"))


@pytest.mark.parametrize("extra", [
    ["method.name=mean_teacher", "data.labeled_fraction=0.5"],
    [TARGET_DATA, "method.name=mean_teacher", "loss.lambda_adv=0.001"],
], ids=["semi", "uda_adv"])
def test_resume_is_bitwise_with_the_teacher_in_the_checkpoint(tmp_path, extra):
    full = train(resume_cfg(tmp_path, "full", *extra))
    assert full.step == 6
    saved = read_checkpoint(tmp_path / "full" / "checkpoints" / "last.pt")
    assert "teacher" in saved and "optim_teacher" not in saved and "mixing_rng" in saved
    assert ("discriminator" in saved) == ("loss.lambda_adv=0.001" in extra)

    first = train(resume_cfg(tmp_path, "split", *extra), stop_at=4)
    assert first.step == 4
    # resumed into a new run dir from the mid-run checkpoint
    second_cfg = resume_cfg(tmp_path, "resumed", *extra)
    second = train(second_cfg, resume=str(tmp_path / "split" / "checkpoints" / "last.pt"))
    assert second.step == 6
    resumed = read_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert assert_checkpoints_equal(saved, resumed) > 100
    assert any(not torch.equal(a, b) for a, b in zip(tensors(saved["teacher"]), tensors(saved["generator"])))


def tensors(value):
    from segadv.checkpoint.state import tensors_in

    return list(tensors_in(value))


def test_the_batch_statistics_teacher_has_batchnorm_in_train_mode_and_dropout_off():
    """DACS's teacher (``teacher_batchnorm: batch``) normalises with the batch's statistics, and its
    pseudo labels are not a dropout draw: two passes over the same images agree."""
    cfg, parts = built(UDA)
    images_u = batch(cfg, 2, 1)[0]
    first, _ = parts.method.pseudo_labels(images_u)
    second, _ = parts.method.pseudo_labels(images_u)
    assert torch.equal(first, second)
    modules = list(parts.network("teacher").bare.modules())
    dropouts = [m for m in modules if isinstance(m, torch.nn.Dropout)]
    norms = [m for m in modules if isinstance(m, torch.nn.BatchNorm2d)]
    assert dropouts and norms  # smp's ASPP has a dropout
    assert not any(m.training for m in dropouts) and all(m.training for m in norms)
