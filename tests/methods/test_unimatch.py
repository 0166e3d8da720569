"""UniMatch and UniMatch V2: their networks and streams by variant, each loss term and the update
held to a transcription of the references' loops (LiheYoung/UniMatch unimatch.py, LiheYoung/
UniMatch-V2 unimatch_v2.py) on a fixed batch with the random draws made equal, the views' draws,
V2's EMA teacher (buffers included), D on top, an exact resume with the views' RNG, and the
folder's switches on the variant (one iteration class per reference, picked in one place)."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import pytest
import torch

from segadv.checkpoint import read_checkpoint
from segadv.config import load_config
from segadv.methods import registry
from segadv.methods.unimatch import iteration as um_iteration
from segadv.methods.unimatch import views
from segadv.parallel import parse_device_map
from segadv.training.build import build_training, start_copies
from segadv.training.loop import train

from conftest import TINY_OVERRIDES
from helpers import FixedStream, assert_checkpoints_equal, batch, resume_cfg
from unimatch_reference import Draws, ViewDraws, reference_v1, reference_v2

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V1 = [*TINY_OVERRIDES, "method.name=unimatch", "method.unimatch.variant=v1"]
V2 = [*TINY_OVERRIDES, "method.name=unimatch"]  # v2: the default
# Plain SGD: one step moves each parameter by -lr * its gradient, which the transcription computes.
# (a random-init G is rarely 0.95 sure: the tests lower method.unimatch.confidence)
SGD = ["optim.generator={name: sgd, lr: 0.1, momentum: 0.0, weight_decay: 0.0, poly_power: 0.0}"]


def built(overrides, device_map="cpu"):
    cfg = load_config(None, overrides)
    parts = build_training(cfg, parse_device_map(device_map))
    start_copies(parts)
    return cfg, parts


def fixed_streams(cfg, parts):
    images, labels = batch(cfg, 2, 0)
    streams = {"labeled": FixedStream((images, labels)), "unlabeled": FixedStream(batch(cfg, 2, 1)[0]),
               "unlabeled_mix": FixedStream(batch(cfg, 2, 2)[0]), "gt": FixedStream(batch(cfg, 2, 3))}
    names = [spec.name for spec in type(parts.method).data_streams(cfg)]
    return {name: streams[name] for name in names}


# One step of a DeepLab G on the CPU in float32: the terms themselves (every placement, wrapper and
# precision over two steps is tests/integration/test_equivalence_unimatch.py's).
CASES = {"plain": [], "channels_last": ["train.channels_last=true"],
         "activation-checkpointing": ["model.generator.activation_checkpointing=true"]}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_each_loss_term_and_the_step_match_a_transcription_of_the_reference(variant, case, monkeypatch):
    # V2's eval-mode teacher at initialisation is barely above 1/5 sure: its threshold lets every pixel pass
    confidence = "method.unimatch.confidence=" + ("0.22" if variant == "v1" else "0.2")
    cfg, parts = built([*(V1 if variant == "v1" else V2), *SGD, confidence, *CASES[case]])
    g = parts.g.bare
    model = copy.deepcopy(g)  # the reference's model: G's weights and BatchNorm statistics now
    model_ema = copy.deepcopy(parts.network("teacher").bare) if variant == "v2" else None
    before = {name: p.detach().clone() for name, p in g.named_parameters()}
    streams = fixed_streams(cfg, parts)
    draws = Draws(monkeypatch)
    torch.manual_seed(7)  # smp's ASPP dropout draws from the global RNG: the same draws on both sides
    losses = parts.method(streams, 0)
    assert len(draws.strong) == (4 if variant == "v1" else 2) and len(draws.boxes) == 2 and len(draws.scales) == 1

    torch.manual_seed(7)
    threshold = cfg.method.unimatch.confidence
    images_x, labels_x = streams["labeled"].batch
    drawn = ViewDraws(draws.strong, draws.boxes, draws.scales[0])
    if variant == "v1":
        expected = reference_v1(model, (images_x, labels_x, streams["unlabeled"].batch,
                                        streams["unlabeled_mix"].batch), drawn, threshold)
    else:
        expected = reference_v2(model, model_ema, (images_x, labels_x, streams["unlabeled"].batch), drawn, threshold)
    del expected["pred_x"]
    for name, value in expected.items():
        assert float(losses[name]) == pytest.approx(float(torch.as_tensor(value).detach()), rel=1e-5, abs=1e-6), name
    assert float(losses["loss_strong"]) > 0 and float(losses["pseudo_confidence"]) > 0  # the terms are live
    lr = cfg.optim.generator.lr
    moved = torch.cat([(g.get_parameter(name).detach() - before[name]).flatten() for name, _ in model.named_parameters()])
    step = torch.cat([(-lr * p.grad).flatten() for _, p in model.named_parameters()])
    torch.testing.assert_close(moved, step, rtol=1e-4, atol=1e-6)  # one SGD step on the reference's total loss
    for name, buffer in model.named_buffers():  # the same BatchNorm statistics: the same forwards in order
        torch.testing.assert_close(g.get_buffer(name), buffer, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("overrides, networks, streams", [
    (V1, ("generator",), ("labeled", "unlabeled", "unlabeled_mix")),
    (V2, ("generator", "teacher"), ("labeled", "unlabeled")),
    ([*V1, "loss.lambda_adv=0.01"], ("generator", "discriminator"), ("labeled", "unlabeled", "unlabeled_mix", "gt")),
    ([*V2, "loss.lambda_adv=0.01"], ("generator", "teacher", "discriminator"), ("labeled", "unlabeled", "gt")),
])
def test_networks_and_streams_by_variant(overrides, networks, streams):
    cfg = load_config(None, overrides)
    cls = registry.method_class("unimatch")
    assert cls.networks(cfg) == networks  # no D with lambda_adv 0 (null: unimatch's 0), no teacher in v1
    assert tuple(spec.name for spec in cls.data_streams(cfg)) == streams


def test_v2s_teacher_is_the_ema_of_g_parameters_and_buffers():
    cfg, parts = built([*V2, "method.unimatch.ema_decay=0.5"])
    streams = fixed_streams(cfg, parts)
    teacher, g = parts.network("teacher").bare, parts.g.bare
    for step in range(3):
        before = {name: t.detach().clone() for name, t in teacher.state_dict().items()}
        parts.method(streams, step)
        decay = min(1 - 1 / (step + 1), 0.5)
        student = g.state_dict()
        for name, tensor in teacher.state_dict().items():
            if tensor.is_floating_point():
                torch.testing.assert_close(tensor, decay * before[name] + (1 - decay) * student[name], msg=name)
    running = [name for name, t in teacher.named_buffers() if "running_mean" in name]
    assert running and not torch.equal(teacher.get_buffer(running[0]), torch.zeros_like(teacher.get_buffer(running[0])))


def test_v2s_teacher_labels_in_eval_mode_and_the_views_paste_the_reversed_batch(monkeypatch):
    cfg, parts = built(V2)
    streams = fixed_streams(cfg, parts)
    draws = Draws(monkeypatch)
    teacher = copy.deepcopy(parts.network("teacher").bare).eval()
    with torch.no_grad():
        expected = teacher(streams["unlabeled"].batch).argmax(dim=1)
    seen = {}
    real = um_iteration.paste

    def spy(box, inside, outside):
        if not outside.is_floating_point():
            seen["pseudo"], seen["inside"] = outside.clone(), inside.clone()
        return real(box, inside, outside)

    monkeypatch.setattr(um_iteration, "paste", spy)
    parts.method(streams, 0)
    assert torch.equal(seen["pseudo"], expected) and torch.equal(seen["inside"], expected.flip(0))
    first, second = draws.scales[0][0].chunk(2)  # complementary: each channel in one view or kept whole
    assert torch.all((first + second == 2) | ((first == 1) & (second == 1)))
    assert set(first.unique().tolist()) <= {0.0, 1.0, 2.0}


def test_the_views_draws():
    gen = torch.Generator().manual_seed(0)
    boxes = views.cutmix_boxes(400, (20, 30), gen, torch.device("cpu"))
    share = boxes.flatten(1).float().mean(dim=1)
    assert 0.4 < float((share > 0).float().mean()) < 0.6  # a box half the time
    # at most 0.4 of the image; the sides' truncation to whole pixels can take a box below 0.02
    assert float(share.max()) <= 0.4 + 1e-6 and float(share[share > 0].min()) > 0
    scales = views.dropout_scales(64, [8, 16], gen, torch.device("cpu"))
    assert [tuple(s.shape) for s in scales] == [(64, 8), (64, 16)]
    assert set(scales[0].unique().tolist()) == {0.0, 2.0}
    pairs = views.complementary_scales(8, [4, 4, 6], gen, torch.device("cpu"))
    assert pairs[0] is pairs[1] and pairs[2].shape == (16, 6)
    whole = (pairs[0][:8] == 1).all(dim=1)
    assert int(whole.sum()) == 4  # int(8 * (1 - 0.5)) pairs keep every channel
    images = torch.randn(6, 3, 16, 16)
    strong = views.strong_view(images, gen, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert strong.shape == images.shape and not torch.equal(strong, images)


def test_d_on_top_trains_d_on_the_weak_view_maps():
    for overrides in (V1, V2):
        cfg, parts = built([*overrides, "loss.lambda_adv=0.01"])
        d = parts.d.bare
        before = [p.detach().clone() for p in d.parameters()]
        losses = parts.method(fixed_streams(cfg, parts), 0)
        assert {"loss_adv", "loss_d"} <= set(losses)
        assert any(not torch.equal(a, p) for a, p in zip(before, d.parameters()))


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_resume_is_bitwise_from_a_mid_run_checkpoint_into_a_new_run_dir(tmp_path, variant):
    extra = ["method.name=unimatch", f"method.unimatch.variant={variant}", "method.unimatch.confidence=0.3",
             "data.labeled_fraction=0.5", "loss.lambda_adv=0.01"]
    full = train(resume_cfg(tmp_path, "full", *extra))
    saved = read_checkpoint(tmp_path / "full" / "checkpoints" / "last.pt")
    assert "mixing_rng" in saved and "discriminator" in saved and ("teacher" in saved) == (variant == "v2")
    train(resume_cfg(tmp_path, "split", *extra), stop_at=4)
    second = train(resume_cfg(tmp_path, "resumed", *extra), resume=str(tmp_path / "split" / "checkpoints" / "last.pt"))
    assert second.step == 6
    resumed = read_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert assert_checkpoints_equal(saved, resumed) > 100


@pytest.mark.parametrize("overrides", [V1, V2], ids=["v1", "v2"])
def test_the_first_strong_view_and_its_labels_are_kept_for_the_panel(overrides, monkeypatch):
    cfg, parts = built([*overrides, "method.unimatch.confidence=0.2"])  # 5 classes: every pixel passes 1/5
    assert parts.method.training_views() is None
    draws = Draws(monkeypatch)
    parts.method(fixed_streams(cfg, parts), 0)
    views_ = parts.method.training_views()
    box = draws.boxes[0]
    inside = draws.strong[2] if len(draws.strong) == 4 else draws.strong[0].flip(0)  # V1: u' view 1; V2: reversed
    expected = torch.where(box[:, None], inside, draws.strong[0])
    assert torch.equal(views_.images, expected) and views_.tag == "train/mixed_batch"
    assert torch.equal(views_.labels == cfg.data.ignore_index, views_.weight == 0)
    assert 0 < float(views_.weight.mean()) <= 1


@pytest.mark.parametrize("overrides", [V1, V2], ids=["v1", "v2"])
def test_a_bfloat16_g_trains_with_its_feature_scales(overrides):
    """Under G's own autocast the scaled features and both views run in bfloat16 and the losses
    come back float32 and finite (the float32 comparison is the transcription's above)."""
    cfg, parts = built([*overrides, "method.unimatch.confidence=0.2", "loss.lambda_adv=0.01",
                        "amp.generator={enabled: true, dtype: bfloat16}"])
    before = [p.detach().clone() for p in parts.g.bare.parameters()]
    losses = parts.method(fixed_streams(cfg, parts), 0)
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in losses.values())
    assert any(not torch.equal(a, p) for a, p in zip(before, parts.g.bare.parameters()))


@pytest.mark.parametrize("overrides, iteration", [(V1, "UniMatchV1"), (V2, "UniMatchV2")], ids=["v1", "v2"])
def test_the_variant_builds_its_references_iteration(overrides, iteration):
    cfg, parts = built(overrides)
    declaration = registry.method_class("unimatch").reference(cfg)
    assert type(parts.method) is getattr(um_iteration, iteration) is declaration.iteration_class()
    assert issubclass(type(parts.method), declaration) and type(parts.method).name == "unimatch"
    assert any("__call__" in vars(c) for c in type(parts.method).__mro__[:-1])


MAX_VARIANT_SWITCHES = 2  # the declaration picking the reference's declaration, and one spare
VARIANT_NAME = re.compile(r"variant|v[12](?![0-9])", re.IGNORECASE)  # variant, self.v2, UniMatchV1Spec


def variant_switches(source: str) -> list[int]:
    """The lines where ``source`` decides something by the UniMatch variant: an ``if``, conditional
    expression, ``while``, comprehension filter or ``match`` whose test reads it, a comparison with it
    outside those tests (a flag kept for later), and a lookup keyed by it (``TABLE[cfg.variant]``).
    A name reads the variant where it matches ``VARIANT_NAME``, a string where it is "v1" or "v2";
    annotations (``Literal["v1", "v2"]``) decide nothing."""
    tree = ast.parse(source)
    annotations = set()
    for node in ast.walk(tree):
        for annotation in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if annotation is not None:
                annotations.update(id(n) for n in ast.walk(annotation))

    def reads_variant(node: ast.AST, strings: bool = True) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and VARIANT_NAME.search(n.id):
                return True
            if isinstance(n, ast.Attribute) and VARIANT_NAME.search(n.attr):
                return True
            if strings and isinstance(n, ast.Constant) and n.value in ("v1", "v2"):
                return True
        return False

    tests = [(n, n.test) for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp, ast.While))]
    tests += [(n, n.subject) for n in ast.walk(tree) if isinstance(n, ast.Match)]
    tests += [(test, test) for n in ast.walk(tree) if isinstance(n, ast.comprehension) for test in n.ifs]
    switches, seen = [], set()
    for node, test in tests:
        if reads_variant(test):
            switches.append(node.lineno)
            seen.update(id(n) for n in ast.walk(test))
    for node in ast.walk(tree):
        if id(node) in seen or id(node) in annotations:
            continue
        if (isinstance(node, ast.Compare) and reads_variant(node)) or (
                isinstance(node, ast.Subscript) and reads_variant(node.slice, strings=False)):
            switches.append(node.lineno)
            seen.update(id(n) for n in ast.walk(node))
    return sorted(switches)


def test_the_switch_counter_sees_every_kind_of_switch():
    source = """
variant: Literal["v1", "v2"] = "v2"
if self.v2 and teacher is None:
    pass
weights = V2 if settings.variant == "v2" else V1
self.v2 = settings.variant == "v2"
cls = REFERENCES[cfg.method.unimatch.variant]
match variant:
    case "v1":
        pass
names = [n for n in names if is_v1]
while self.v2:
    break
"""
    assert variant_switches(source) == [3, 5, 6, 7, 8, 11, 12]
    assert variant_switches("x = TABLE['v2']\ny = WEIGHTS['strong']\n") == []  # a string key is no switch


def test_the_unimatch_folder_switches_on_its_variant_at_most_twice():
    folder = Path(um_iteration.__file__).parent
    switches = {path.name: variant_switches(path.read_text()) for path in sorted(folder.glob("*.py"))}
    where = ", ".join(f"{name}:{line}" for name, lines in switches.items() for line in lines)
    assert sum(len(lines) for lines in switches.values()) <= MAX_VARIANT_SWITCHES, where
