"""UniMatch and UniMatch V2, with D on top, train under every placement, wrapper and precision what
the plain loop trains.

The plain loop is the references' iteration transcribed (tests/unimatch_reference.py: unimatch.py,
unimatch_v2.py) on the CPU in float32, no wrapper, ``torch.optim`` directly, with AdvSemiSeg's D on
top as segadv adds it (G's term on its weak-view maps, D on G's labeled and weak-view maps against
one-hot ground truth). The networks, batches, tolerances and the BatchNorm and dropout rules are
tests/integration/test_equivalence.py's (its docstring says why). Two steps, so that D's step and
V2's teacher (its EMA at decays 0 then 1/2) feed the second; compared: G's update, D's, the
teacher's (V2: parameters and floating buffers) and G's adversarial gradient at D's input.

The random draws (strong views, CutMix boxes, feature scales) are segadv's, recorded and handed to
the plain loop (tests/unimatch_reference.py ``Draws``): what is compared is what the placements and
wrappers do with them. ``method.unimatch.confidence`` is 0.2, 1/num_classes, which every top
probability reaches, so every pseudo label counts; in float32 the plain loop holds segadv's pseudo
labels to its own argmax and takes only its near-ties (test_equivalence.py ``PSEUDO_LABEL_TIE``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import FixedStream
from segadv.methods import mixing
from segadv.models import build_generator
from segadv.parallel import parse_device_map, unwrap
from segadv.training.build import build_training, start_copies
from test_equivalence import (
    HERE,
    CASES,
    LAMBDA_ADV,
    Case,
    Moved,
    amp,
    averaged,
    batch_statistics_frozen,
    broken_ties,
    capture_adversarial_gradient,
    dinov2_case,
    flat,
    freeze_batch_statistics,
    harness_config,
    initial_networks,
    make_mt_batches,
    masked_bce,
    mt_reference_overrides,
    no_dropout,
    params,
    plain_optimizer,
    teacher_state,
    within_tolerance,
)
from unimatch_reference import Draws, ViewDraws, reference_v1, reference_v2

STEPS = 2
UM_OVERRIDES = ("method.name=unimatch", "method.unimatch.confidence=0.2", "data.labeled_fraction=0.5",
                f"loss.lambda_adv={LAMBDA_ADV}")
VARIANTS = {"v1": ("method.unimatch.variant=v1",), "v2": ("method.unimatch.variant=v2",)}
STRONG_VIEWS = {"v1": 4, "v2": 2}  # strong_view calls an iteration: V1 also the pasted batch's two
# Every placement and wrapper the other methods run under, their AMP cases with both networks, the
# micro-batches (accumulation: each draws its own views and pastes within itself; the teacher moves
# once per step), and the DINOv2 G as student and teacher. GPU cases are marked as in test_equivalence.
UM_EVERYWHERE = {"cpu", "cpu-dataparallel", "cpu-channels_last", "cpu-activation-checkpointing", "cpu-accumulation-2",
                 "g-bf16", "both-bf16", "g-bf16-d-fp16", "dataparallel-bf16", "accumulation-4-g-bf16-d-fp16",
                 "g:cuda:0,d:cpu", "g:cpu,d:cuda:0", "cuda-both-fp16", "cuda-checkpointing-g-bf16", "g:1,d:0",
                 "g:0+1,d:1", "g:0+1,d:1-bf16"}
# V2's teacher on its own: its own autocast, and placed apart from G by the device map (t).
UM_TEACHER_CASES = [
    Case("teacher-bf16", overrides=amp("teacher", "bfloat16")),
    Case("g:cpu,d:cpu,t:cuda:0", "g:cpu,d:cpu,t:cuda:0", marks=(pytest.mark.cuda,)),
    Case("g:1,d:0,t:0", "g:1,d:0,t:0", marks=(pytest.mark.cuda2,)),
]
UM_DINOV2 = {"cpu", "cpu-dataparallel", "cpu-accumulation-2", "g-bf16", "g:cuda:0,d:cpu", "g:1,d:0", "g:0+1,d:1"}
UM_CASES = [(variant, c) for variant in VARIANTS for c in CASES if c.name in UM_EVERYWHERE] + \
           [("v2", c) for c in UM_TEACHER_CASES] + \
           [(variant, dinov2_case(c)) for variant in VARIANTS for c in CASES if c.name in UM_DINOV2] + \
           [("v2", dinov2_case(c)) for c in UM_TEACHER_CASES]
assert len(UM_CASES) == 2 * len(UM_EVERYWHERE) + 2 * len(UM_DINOV2) + 2 * len(UM_TEACHER_CASES)


def unimatch_config(variant: str, *overrides: str):
    return harness_config(*UM_OVERRIDES, *VARIANTS[variant], *overrides)


def make_um_batches(cfg):
    """The labeled batch, the unlabeled one, D's ground truth (test_equivalence's), and V1's second
    unlabeled batch."""
    images_l, labels_l, images_u, labels_gt = make_mt_batches(cfg)
    images_mix = torch.randn(images_u.shape, generator=torch.Generator().manual_seed(11))
    return images_l, labels_l, images_u, labels_gt, images_mix


@dataclass
class UniMatchOutcome:
    updates: dict[str, dict[str, torch.Tensor]]  # by network: g, teacher (V2), d
    adv_grad: torch.Tensor  # G's adversarial gradient at D's input, by step then part
    draws: list[ViewDraws]  # segadv's, by step then part
    pseudo_labels: list[torch.Tensor]  # segadv's, in the order the iteration labels


def reference_unimatch(variant: str, g: nn.Module, teacher: nn.Module | None, d: nn.Module, batches, cfg,
                       draws: list[ViewDraws], ties: list[torch.Tensor] | None, ranks: int = 1) -> torch.Tensor:
    """STEPS UniMatch iterations with D on top on the CPU in float32, plainly. The batch in parts
    (``train.accumulation_steps`` micro-batches, or ``ranks`` DDP shards), each 1/parts of the
    step's losses and its own draws; G, D and (V2) the teacher's EMA once a step. Returns G's
    adversarial gradients at D's input (by step, then part)."""
    images_l, labels_l, images_u, labels_gt, images_mix = batches
    num_classes, ignore = cfg.data.num_classes, cfg.data.ignore_index
    settings = cfg.method.unimatch
    assert ranks == 1 or cfg.train.accumulation_steps == 1, "the plain loop cuts the batch for DDP or accumulation"
    parts = ranks * cfg.train.accumulation_steps
    opt_g, opt_d = plain_optimizer(g, cfg.optim.generator), plain_optimizer(d, cfg.optim.discriminator)
    theirs = iter(ties) if ties is not None else None
    tie_break = (lambda probs, pseudo: broken_ties(probs, pseudo, next(theirs))) if theirs is not None else None
    drawn = iter(draws)
    adv_grads = []
    for step in range(STEPS):
        for opt, own in ((opt_g, cfg.optim.generator), (opt_d, cfg.optim.discriminator)):
            for group in opt.param_groups:  # the poly schedule, in closed form
                group["lr"] = own.lr * (1 - step / cfg.train.max_steps) ** own.poly_power
            opt.zero_grad()
        for rows in torch.arange(len(images_l)).chunk(parts):
            x_l, y_l, x_u, y_gt, x_mix = (t[rows] for t in batches)
            seen = {}

            def adversarial(logits_u):  # AdvSemiSeg's term on G's weak-view maps, D frozen
                probs_u = logits_u.softmax(dim=1)
                d.requires_grad_(False)
                loss_adv = LAMBDA_ADV * F.binary_cross_entropy_with_logits(d(probs_u), torch.ones_like(probs_u[:, :1]))
                d.requires_grad_(True)
                (seen["adv_grad"],) = torch.autograd.grad(loss_adv / parts, probs_u, retain_graph=True)
                seen["probs_u"] = probs_u.detach()
                return loss_adv

            if variant == "v1":
                out = reference_v1(g, (x_l, y_l, x_u, x_mix), next(drawn), settings.confidence, parts=parts,
                                   tie_break=tie_break, adversarial=adversarial)
            else:
                out = reference_v2(g, teacher, (x_l, y_l, x_u), next(drawn), settings.confidence, parts=parts,
                                   tie_break=tie_break, adversarial=adversarial)
            adv_grads.append(seen["adv_grad"])
            # D: G's labeled and weak-view maps (before G's step) fake, one-hot ground truth real.
            # One forward over both, as segadv's (D has no batch statistics): with two, the batched
            # convolutions round otherwise, and where D's real and fake gradients nearly cancel
            # (V2 with the DINOv2 G) D's update moved 7.4e-4 of its largest element (measured).
            valid_l, valid_gt = (y_l != ignore).float(), (y_gt != ignore).float()
            onehot = F.one_hot(y_gt.clamp(0, num_classes - 1), num_classes).permute(0, 3, 1, 2).float()
            fake = torch.cat([out["pred_x"].softmax(dim=1), seen["probs_u"]])
            valid_fake = torch.cat([valid_l, torch.ones_like(valid_l)])
            logits_fake, logits_real = d(torch.cat([fake, onehot * valid_gt[:, None]])).split([len(fake), len(y_gt)])
            loss_d = 0.5 * (masked_bce(logits_fake, 0.0, valid_fake) + masked_bce(logits_real, 1.0, valid_gt))
            (loss_d / parts).backward()
        opt_g.step()
        if teacher is not None:  # unimatch_v2.py 221-226, parameters and buffers
            decay = min(1 - 1 / (step + 1), settings.ema_decay)
            with torch.no_grad():
                for t, live in zip(averaged(teacher, True), averaged(g, True)):
                    t.copy_(decay * t + (1 - decay) * live)
        opt_d.step()
    assert next(drawn, None) is None, "segadv drew views for more iterations than the loop ran"
    assert theirs is None or next(theirs, None) is None, "segadv labelled more batches than the loop"
    return torch.cat(adv_grads)


def frozen_batchnorm(module: nn.Module) -> None:
    """Each BatchNorm in eval mode at its own forward: the transcription's feature-perturbed forward
    calls G's encoder and decoder, not G (test_equivalence's hook is on G's own forward)."""
    def hook(mod, args):
        mod.eval()

    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.register_forward_pre_hook(hook)


def record_pseudo_labels(monkeypatch) -> list[torch.Tensor]:
    """Every pseudo label map segadv's iteration takes (``mixing.teacher_confidence``: V1's on the
    pasted batch and on the weak view, V2's teacher's), on the host, in call order."""
    seen: list[torch.Tensor] = []
    real = mixing.teacher_confidence

    def recorded(logits):
        confidence, pseudo = real(logits)
        seen.append(pseudo.detach().cpu())
        return confidence, pseudo

    monkeypatch.setattr(mixing, "teacher_confidence", recorded)
    return seen


def unimatch_outcome(variant: str, case: Case, monkeypatch) -> UniMatchOutcome:
    cfg = unimatch_config(variant, *case.overrides)
    init_g, init_d = initial_networks(cfg)
    with batch_statistics_frozen(case.freeze_stats):
        parts = build_training(cfg, parse_device_map(case.device_map))
    unwrap(parts.g.module).load_state_dict(init_g.state_dict())
    unwrap(parts.d.module).load_state_dict(init_d.state_dict())
    start_copies(parts)  # V2's teacher starts as G
    no_dropout(parts.g.module)
    if case.freeze_stats:
        freeze_batch_statistics(unwrap(parts.g.module))
    teacher = parts.network("teacher").bare if variant == "v2" else None
    grads: list[torch.Tensor] = []
    capture_adversarial_gradient(parts.d.module, grads)
    draws, labels = Draws(monkeypatch), record_pseudo_labels(monkeypatch)
    nets = {"g": parts.g.module, "d": parts.d.module}
    before = {n: params(m) for n, m in nets.items()} | ({"teacher": teacher_state(teacher, True)} if teacher else {})
    scale = parts.g.opt.loss_scale()
    images_l, labels_l, images_u, labels_gt, images_mix = make_um_batches(cfg)
    streams = {"labeled": FixedStream((images_l, labels_l)), "unlabeled": FixedStream(images_u),
               "unlabeled_mix": FixedStream(images_mix), "gt": FixedStream((images_l, labels_gt))}
    streams = {spec.name: streams[spec.name] for spec in type(parts.method).data_streams(cfg)}
    for step in range(STEPS):
        parts.step(streams, step=step)
    after = {n: params(m) for n, m in nets.items()} | ({"teacher": teacher_state(teacher, True)} if teacher else {})
    updates = {n: Moved(before[n], after[n], STEPS) for n in before}
    return UniMatchOutcome(updates, torch.cat(grads) / scale, draws.iterations(STRONG_VIEWS[variant]), labels)


def plain_outcome(variant: str, case: Case, got: UniMatchOutcome) -> UniMatchOutcome:
    """The plain loop from the same initial weights and batches, on segadv's draws (and in float32
    its near-tie pseudo labels)."""
    cfg = unimatch_config(variant, *mt_reference_overrides(case))
    g, d = initial_networks(cfg)
    teacher = None
    if variant == "v2":
        teacher = no_dropout(build_generator(cfg.model.generator, cfg.data.num_classes))
        teacher.load_state_dict(g.state_dict())
    if case.freeze_stats:
        frozen_batchnorm(g)
    before = {"g": params(g), "d": params(d)} | ({"teacher": teacher_state(teacher, True)} if teacher else {})
    adv_grad = reference_unimatch(variant, g, teacher, d, make_um_batches(cfg), cfg, got.draws,
                                  got.pseudo_labels if case.float32 else None)
    after = {"g": params(g), "d": params(d)} | ({"teacher": teacher_state(teacher, True)} if teacher else {})
    return UniMatchOutcome({n: Moved(before[n], after[n], STEPS) for n in before}, adv_grad,
                           got.draws, [])


def assert_unimatch_equivalent(case: Case, got: UniMatchOutcome, ref: UniMatchOutcome) -> dict[str, float]:
    assert got.updates.keys() == ref.updates.keys()
    pairs = {name: (got.updates[name], ref.updates[name]) for name in ref.updates}
    for name, (a, b) in pairs.items():
        assert a.keys() == b.keys(), name
        assert flat(b).abs().max() > 0, f"the plain loop's {name} did not move"
    assert flat(got.adv_grad).abs().max() > 0, "G's adversarial gradient is zero"
    pairs["adversarial gradient"] = (got.adv_grad, ref.adv_grad)
    return within_tolerance(case, pairs)


@pytest.mark.parametrize("variant, case", [pytest.param(v, c, id=f"{v}-{c.name}", marks=list(c.marks))
                                           for v, c in UM_CASES])
def test_unimatch_iterations_with_d_match_the_plain_float32_loop(variant, case, monkeypatch, no_tf32):
    got = unimatch_outcome(variant, case, monkeypatch)
    assert len(got.draws) == STEPS * unimatch_config(variant, *case.overrides).train.accumulation_steps
    ref = plain_outcome(variant, case, got)
    print(f"unimatch {variant} {case.name}: {assert_unimatch_equivalent(case, got, ref)}")


def test_the_harness_sees_the_feature_perturbation_dropped(monkeypatch, no_tf32):
    """A planted bug: segadv's G reading its features unscaled (V1's perturbed stream a copy of the
    clean one) while the plain loop scales them moves G's update beyond float32 rounding."""
    from segadv.models import features

    def unscaled(maps, scales, *, with_unperturbed=False):
        return [torch.cat((f, f)) if with_unperturbed else f for f in maps]

    monkeypatch.setattr(features, "scale_features", unscaled)
    case = next(c for c in CASES if c.name == "cpu")
    got = unimatch_outcome("v1", case, monkeypatch)
    # caught at G's update, or earlier at its pseudo labels of the second step
    with pytest.raises(AssertionError, match="float32 deviations|pseudo labels differ"):
        assert_unimatch_equivalent(case, got, plain_outcome("v1", case, got))


# Two gloo processes, each with half of every batch and its own views (its generator seeded with its
# rank), against the plain loop cut into the ranks' halves. That the ranks hold G, D and V2's teacher
# bitwise equal is tests/parallel/test_distributed.py's.
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ddp_unimatch_on_two_processes_matches_the_plain_loop(tmp_path, variant):
    case = Case("ddp", "cpu", (), split_batch=True)
    cfg = unimatch_config(variant)
    init_g, init_d = initial_networks(cfg)
    images_l, labels_l, images_u, labels_gt, images_mix = make_um_batches(cfg)
    torch.save({"g": init_g.state_dict(), "d": init_d.state_dict(), "images": images_l, "labels": labels_l,
                "images_u": images_u, "labels_gt": labels_gt, "images_mix": images_mix}, tmp_path / "input.pt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(HERE / "equivalence_worker.py"), str(tmp_path), "cpu", *UM_OVERRIDES, *VARIANTS[variant]]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    starts = {"g": params(init_g), "d": params(init_d)} | ({"teacher": teacher_state(init_g, True)} if variant == "v2"
                                                           else {})
    for net in ("g", "d"):  # DDP keeps the ranks' parameters identical
        assert all(torch.equal(ranks[0][net][k], ranks[1][net][k]) for k in starts[net]), net
    updates = {net: Moved(start, ranks[0][net], STEPS) for net, start in starts.items()}
    # the loop's order of parts: by step, then rank; each rank's adversarial loss is a mean over its
    # half, so the full batch's gradient is half of it
    by_rank = [r["adv_grad"].chunk(STEPS) for r in ranks]
    adv_grad = torch.cat([by_rank[r][step] for step in range(STEPS) for r in (0, 1)]) / 2
    draws = [ViewDraws(**ranks[r]["draws"][step]) for step in range(STEPS) for r in (0, 1)]
    per_step = len(ranks[0]["pseudo_labels"]) // STEPS
    ties = [label for step in range(STEPS) for r in (0, 1)
            for label in ranks[r]["pseudo_labels"][step * per_step:(step + 1) * per_step]]

    g, d = initial_networks(cfg)
    teacher = None
    if variant == "v2":
        teacher = no_dropout(build_generator(cfg.model.generator, cfg.data.num_classes))
        teacher.load_state_dict(g.state_dict())
    frozen_batchnorm(g)  # the worker freezes G's BatchNorm: a shard's statistics are not the batch's
    before = {"g": params(g), "d": params(d)} | ({"teacher": teacher_state(teacher, True)} if teacher else {})
    ref_grad = reference_unimatch(variant, g, teacher, d, (images_l, labels_l, images_u, labels_gt, images_mix), cfg,
                                  draws, ties, ranks=2)
    after = {"g": params(g), "d": params(d)} | ({"teacher": teacher_state(teacher, True)} if teacher else {})
    ref = UniMatchOutcome({n: Moved(before[n], after[n], STEPS) for n in before}, ref_grad, draws, [])
    got = UniMatchOutcome(updates, adv_grad, draws, [])
    print(f"unimatch ddp {variant}: {assert_unimatch_equivalent(case, got, ref)}")
