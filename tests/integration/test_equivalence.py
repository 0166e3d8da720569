"""Every placement, wrapper and precision trains what the plain loop trains.

The reference is the AdvSemiSeg step written out plainly in ``reference_step`` below: one device
(the CPU), float32, no wrapper, ``torch.optim`` directly, none of segadv's training code. Each
configuration starts from the reference's initial weights and batch, takes one segadv step (G's
update, then D's) and is compared on three things:

- G's parameter update (after - before) and D's;
- G's adversarial gradient on its own: the gradient that G's adversarial term sends into D's
  input (all that term contributes to G), taken in the step itself and divided by G's loss
  scale. Compared on its own, a zeroed adversarial path cannot hide behind the CE gradient.

lambda_adv is 1e-4 here: on 64x64 crops that puts D's per-pixel gradient where VOC's crops put
it at the default 0.01 (about 6e-9, below float16's smallest subnormal).

Tolerances (stated per dtype):
- float32: every element of each update and of the adversarial gradient within ``FP32_RTOL``
  times the reference's largest magnitude, after allowing an update what storing it costs.
  An update is read off two stored float32 tensors (after - before), each rounded to the
  parameter's own spacing, so two sides whose exact updates differ by d store updates that differ
  by up to d plus one spacing per step that wrote the tensor (:class:`Moved`). That allowance is
  not small: D's first conv weights (about 0.05, spacing 3.7e-9) move by about 1e-7 at the
  harness's learning rate, so one flipped rounding reads as 2e-3 of D's largest update. Without it
  the comparison measured which convolution kernels the CPU's oneDNN picked (AVX2 flipped one
  rounding, AVX-512 none) instead of segadv. What remains is what the two sides computed:
  - ``FP32_RTOL`` (1e-4): the same kernels in the same order (no wrapper, DataParallel on the
    host, activation checkpointing, a split G). The sides differ only in scalar steps (a loss
    divided by K and its gradient scaled back, a term weighted before or after its mean), a few
    roundings of u = 2^-24 = 6e-8 each; 1e-4 is far above that and far below the 1e-2 the
    planted wiring bugs move.
  - ``FP32_SUMMED_ELSEWHERE_RTOL`` (2e-3): the same terms summed in another order (DDP's
    all-reduce, gradient accumulation's micro-batches added, channels_last and compiled kernels,
    CUDA kernels). A conv's weight gradient sums one product per pixel of the batch, n = B * H * W
    = 4 * 64 * 64 = 16,384; a float32 sum of n terms in any order lies within (n - 1) u of the sum
    of their magnitudes (Higham's worst-case bound, any kernel: Winograd's and FFT's too), about
    9.8e-4, and each side carries its own: 2e-3 against the reference's largest element, which
    stands for the magnitudes where an element's terms share a sign. (D's update in the
    semi-supervised methods joins two or three such batches, where the worst case is 4e-3 to 6e-3.)
    Measured, the largest excess on AVX-512, AVX2 and SSE4.1 CPUs was 4.6e-7 (docs/equivalence.md):
    the bound is loose, and still 5x under the 1e-2 the planted wiring bugs move.
- bfloat16 / float16: cosine similarity to the reference of G's update, D's update and the
  adversarial gradient (each flattened) at least ``AMP_MIN_COSINE``, and the adversarial
  gradient not zero.

Dropout is switched off in both (its masks come from device-specific RNGs; that is not what is
compared). BatchNorm keeps batch statistics in the float32 cases, and uses its running statistics
on both sides where
- a configuration splits the batch (DDP, DataParallel over GPUs): per-shard statistics differ from
  the full batch's by design;
- G runs in reduced precision, or in float32 summed in another order (channels_last, CUDA
  kernels): through batch-statistics BatchNorm at initialisation, G's gradient is a small residual
  of large terms that cancel, and half-precision rounding (or float32 rounding in another
  summation order: channels_last measured 1.2e-2 of G's update on the CPU; s4GAN with G on an
  H100, TF32 off, 2.6e-3) does not cancel.
  Measured on this harness's G with plain ``torch.autocast`` and no segadv code: bfloat16 vs
  float32 gradient cosine 0.20 with batch statistics, 0.9998 with running statistics. That is the
  dtype's property, not the wiring's; with running statistics the comparison measures the wiring.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import TINY_OVERRIDES
from helpers import FixedStream
from segadv.training.build import build_training
from segadv.config import load_config
from segadv.config.schema import GeneratorConfig
from segadv.methods import method_class
from segadv.models import build_discriminator, build_generator
from segadv.parallel import parse_device_map, unwrap

HERE = Path(__file__).parent
LAMBDA_ADV = 1e-4
# Both derived in the module's docstring; each is applied to what is left of a deviation after
# float32 storage's spacing (Moved).
FP32_RTOL = 1e-4  # the same kernels in the same order: a few scalar roundings apart
FP32_SUMMED_ELSEWHERE_RTOL = 2e-3  # the same terms summed in another order: 2 (n - 1) u for n = 16,384

AMP_MIN_COSINE = 0.99
BATCH = 4  # two samples per rank under DDP


# SGD for both networks: its update is proportional to the gradient, so comparing updates compares
# the step. Adam's first update is lr * g / (|g| + eps): rounding-level differences in near-zero
# gradients become full-size update differences, which would measure Adam's conditioning instead.
HARNESS_OVERRIDES = [f"loss.lambda_adv={LAMBDA_ADV}", "optim.generator.name=sgd", "optim.discriminator.name=sgd"]


def harness_config(*overrides: str):
    tiny = TINY_OVERRIDES
    if "model.generator.arch=dinov2" in overrides:  # the tiny G's DeepLab keys are not the DINOv2 row's
        tiny = [o for o in TINY_OVERRIDES if not o.startswith("model.generator.")]
    return load_config(None, [*tiny, *HARNESS_OVERRIDES, *overrides])


def amp(network: str, dtype: str) -> tuple[str, ...]:
    return (f"amp.{network}.enabled=true", f"amp.{network}.dtype={dtype}")


@dataclass(frozen=True)
class Case:
    name: str
    device_map: str = "cpu"
    overrides: tuple[str, ...] = ()
    split_batch: bool = False  # the batch is split across replicas (DDP, DataParallel on GPUs)
    marks: tuple = field(default=(), compare=False)

    @property
    def float32(self) -> bool:
        return not any(o.endswith(".enabled=true") for o in self.overrides)

    @property
    def summed_elsewhere(self) -> bool:
        """float32 sums in another order than the CPU reference's: DDP's all-reduce, CUDA kernels,
        oneDNN's channels_last convolutions, the micro-batches' gradients added up, compiled kernels."""
        return self.split_batch or self.accumulates or self.device_map != "cpu" or \
            "train.channels_last=true" in self.overrides or self.compiles

    @property
    def compiles(self) -> bool:
        """torch.compile of G: inductor's fused kernels sum BatchNorm's reductions in their own order."""
        return "compile.generator=true" in self.overrides

    @property
    def accumulates(self) -> bool:
        """Gradient accumulation: the batch in micro-batches, whose BatchNorm batch statistics
        differ from the whole batch's by design (the running statistics are compared)."""
        return any(o.startswith("train.accumulation_steps=") and o != "train.accumulation_steps=1"
                   for o in self.overrides)

    @property
    def freeze_stats(self) -> bool:
        return self.split_batch or self.accumulates or not self.float32 or self.summed_elsewhere

    @property
    def model_overrides(self) -> tuple[str, ...]:
        """The networks' own settings and the input's size: the reference builds the same networks and
        draws the same batch (a DINOv2 G takes multiples of its 14 px patch, not the harness's 64 px)."""
        return tuple(o for o in self.overrides if o.startswith(("model.", "data.synthetic.image_size=")))

    def param(self):
        return pytest.param(self, id=self.name, marks=list(self.marks))


DP = ("parallel.generator=dp", "parallel.discriminator=dp")
# configs/default.yaml's G (resnet18 to layer2, stride 8, a 128-wide decoder) in channels_last.
DEMO_G = ("model.generator.encoder=resnet18", "model.generator.encoder_depth=3", "model.generator.output_stride=8",
          "model.generator.decoder_channels=128", "model.generator.decoder_atrous_rates=[1,2,3]",
          "train.channels_last=true")
CUDA, CUDA2 = (pytest.mark.cuda,), (pytest.mark.cuda2,)
CHECKPOINTING = "model.generator.activation_checkpointing=true"  # the reference builds the plain G
COMPILE = ("compile.generator=true", "compile.discriminator=true")
AOT = "compile.backend=aot_eager"
DEEPLABV2 = ("model.generator.arch=deeplabv2", "model.generator.output_stride=8",
             "model.generator.aspp_v2_rates=early_return")
FROZEN_AFFINE, FROZEN = "model.generator.norm=frozen_affine", "model.generator.norm=frozen"
CASES = [
    Case("cpu"),
    Case("cpu-dataparallel", overrides=DP),
    Case("cpu-channels_last", overrides=("train.channels_last=true",)),
    Case("cpu-demo-generator", overrides=DEMO_G),
    # Two micro-batches of 2 for one batch of 4 (train.accumulation_steps), and in bf16 with an fp16 D
    # (G's GradScaler scales, unscales and steps once over both micro-batches).
    Case("cpu-accumulation-2", overrides=("train.accumulation_steps=2", "data.batch_size=4")),
    Case("accumulation-4-g-bf16-d-fp16",
         overrides=("train.accumulation_steps=4", "data.batch_size=4", *amp("generator", "bfloat16"),
                    *amp("discriminator", "float16"))),
    # G's encoder stages and decoder recomputed in the backward (alone, under G's bf16 autocast, with accumulation).
    Case("cpu-activation-checkpointing", overrides=(CHECKPOINTING,)),
    Case("checkpointing-g-bf16", overrides=(CHECKPOINTING, *amp("generator", "bfloat16"))),
    Case("checkpointing-accumulation-2", overrides=(CHECKPOINTING, "train.accumulation_steps=2", "data.batch_size=4")),
    # torch.compile of both networks (inductor: generated C++ kernels; a resnet18 G to layer2, a
    # minute of C++ compilation where the tiny mobilenet's 17 blocks take two), and with aot_eager
    # (the same graph capture and AOTAutograd, torch's kernels) under AMP, checkpointing and accumulation.
    Case("cpu-compile", overrides=(*COMPILE, *DEMO_G[:3], "model.generator.decoder_channels=32")),
    Case("compile-aot-g-bf16-d-fp16", overrides=(*COMPILE, AOT, *amp("generator", "bfloat16"),
                                                 *amp("discriminator", "float16"))),
    Case("compile-aot-checkpointing-accumulation-2",
         overrides=(*COMPILE, AOT, CHECKPOINTING, "train.accumulation_steps=2", "data.batch_size=4")),
    Case("g-bf16", overrides=amp("generator", "bfloat16")),
    Case("d-bf16", overrides=amp("discriminator", "bfloat16")),
    Case("both-bf16", overrides=(*amp("generator", "bfloat16"), *amp("discriminator", "bfloat16"))),
    Case("g-fp16", overrides=amp("generator", "float16")),
    Case("d-fp16", overrides=amp("discriminator", "float16")),
    Case("both-fp16", overrides=(*amp("generator", "float16"), *amp("discriminator", "float16"))),
    Case("g-bf16-d-fp16", overrides=(*amp("generator", "bfloat16"), *amp("discriminator", "float16"))),
    Case("dataparallel-bf16", overrides=(*DP, *amp("generator", "bfloat16"), *amp("discriminator", "bfloat16"))),
    # One GPU.
    Case("g:cuda:0,d:cpu", "g:cuda:0,d:cpu", marks=CUDA),
    Case("g:cpu,d:cuda:0", "g:cpu,d:cuda:0", marks=CUDA),
    Case("g:cuda:0,d:cuda:0", "g:cuda:0,d:cuda:0", marks=CUDA),
    Case("cuda-dataparallel-1gpu", "g:cuda:0,d:cuda:0", DP, marks=CUDA),
    Case("cuda-channels_last-g-bf16", "g:cuda:0,d:cuda:0", ("train.channels_last=true", *amp("generator", "bfloat16")),
         marks=CUDA),
    Case("cuda-g-bf16", "g:cuda:0,d:cuda:0", amp("generator", "bfloat16"), marks=CUDA),
    Case("cuda-both-bf16", "g:cuda:0,d:cuda:0", (*amp("generator", "bfloat16"), *amp("discriminator", "bfloat16")),
         marks=CUDA),
    Case("cuda-g-fp16", "g:cuda:0,d:cuda:0", amp("generator", "float16"), marks=CUDA),
    Case("cuda-d-fp16", "g:cuda:0,d:cuda:0", amp("discriminator", "float16"), marks=CUDA),
    Case("cuda-both-fp16", "g:cuda:0,d:cuda:0", (*amp("generator", "float16"), *amp("discriminator", "float16")),
         marks=CUDA),
    Case("g:cuda:0-fp16,d:cpu-bf16", "g:cuda:0,d:cpu",
         (*amp("generator", "float16"), *amp("discriminator", "bfloat16")), marks=CUDA),
    Case("g:cpu-bf16,d:cuda:0-fp16", "g:cpu,d:cuda:0",
         (*amp("generator", "bfloat16"), *amp("discriminator", "float16")), marks=CUDA),
    # Two GPUs: G and D apart, and a DataParallel replica set for G.
    Case("g:1,d:0", "g:1,d:0", marks=CUDA2),
    Case("g:1,d:0-both-fp16", "g:1,d:0", (*amp("generator", "float16"), *amp("discriminator", "float16")),
         marks=CUDA2),
    Case("g:0+1,d:1", "g:0+1,d:1", split_batch=True, marks=CUDA2),
    Case("g:0+1,d:1-bf16", "g:0+1,d:1", amp("generator", "bfloat16"), split_batch=True, marks=CUDA2),
    Case("cuda-checkpointing-g-bf16", "g:cuda:0,d:cuda:0", (CHECKPOINTING, *amp("generator", "bfloat16")), marks=CUDA),
    Case("g:0+1,d:1-checkpointing", "g:0+1,d:1", (CHECKPOINTING,), split_batch=True, marks=CUDA2),
    # Inductor's Triton kernels on each network's own GPU; the hand-over between them stays eager.
    Case("cuda-compile", "g:cuda:0,d:cuda:0", COMPILE, marks=CUDA),
    Case("g:1,d:0-compile-g-bf16", "g:1,d:0", (*COMPILE, *amp("generator", "bfloat16")), marks=CUDA2),
    # DeepLab-v2 (the references' two-branch classifier) with the references' BatchNorm (weight and
    # bias fixed), and BatchNorm frozen (eval mode while G trains): alone, in DataParallel, under
    # activation checkpointing, in bf16, on GPUs and split over a replica set.
    Case("cpu-deeplabv2-frozen-affine", overrides=(*DEEPLABV2, FROZEN_AFFINE)),
    Case("cpu-deeplabv2-frozen", overrides=(*DEEPLABV2, FROZEN)),
    Case("cpu-frozen-dataparallel", overrides=(FROZEN, *DP)),
    Case("cpu-frozen-checkpointing", overrides=(FROZEN, CHECKPOINTING)),
    Case("deeplabv2-frozen-g-bf16", overrides=(*DEEPLABV2, FROZEN, *amp("generator", "bfloat16"))),
    Case("compile-aot-deeplabv2-frozen", overrides=(*COMPILE, AOT, *DEEPLABV2, FROZEN)),
    Case("cuda-deeplabv2-frozen-affine", "g:cuda:0,d:cuda:0", (*DEEPLABV2, FROZEN_AFFINE), marks=CUDA),
    Case("g:0+1,d:1-deeplabv2-frozen", "g:0+1,d:1", (*DEEPLABV2, FROZEN), split_batch=True, marks=CUDA2),
]
# The DINOv2 G (segadv/models/dinov2: timm's ViT-S/14 cut to 2 blocks, a narrow DPT head) on 42 px
# inputs (3 x 3 patches; the harness's 64 px is no multiple of 14), under the placements, wrappers and
# precisions of the DeepLab rows above. It has no BatchNorm, so frozen statistics change nothing for
# it. channels_last is left out: the encoder's tokens are (B, N, C) sequences, the only 4-d tensors
# the patch embedding's input and the head's, so the flag has nothing to reorder that matters. Its
# split over pipeline stages is test_a_dinov2_generator_split_into_stages_matches_the_plain_loop.
DINOV2 = ("model.generator.arch=dinov2", "model.generator.encoder=vit_small_patch14_dinov2",
          "model.generator.depth=2", "model.generator.head_features=16",
          "model.generator.head_out_channels=[8,16,32,64]", "data.synthetic.image_size=42")
DINOV2_EVERYWHERE = {
    "cpu", "cpu-dataparallel", "cpu-accumulation-2", "accumulation-4-g-bf16-d-fp16", "cpu-activation-checkpointing",
    "checkpointing-g-bf16", "checkpointing-accumulation-2", "g-bf16", "both-bf16", "g-fp16", "g-bf16-d-fp16",
    "dataparallel-bf16",
    "g:cuda:0,d:cpu", "g:cpu,d:cuda:0", "g:cuda:0,d:cuda:0", "cuda-dataparallel-1gpu", "cuda-g-bf16",
    "cuda-both-fp16", "g:cpu-bf16,d:cuda:0-fp16", "cuda-checkpointing-g-bf16", "g:1,d:0", "g:0+1,d:1",
    "g:0+1,d:1-bf16", "g:0+1,d:1-checkpointing"}


def dinov2_case(case: Case) -> Case:
    return Case(f"dinov2-{case.name}", case.device_map, (*DINOV2, *case.overrides), case.split_batch, case.marks)


DINOV2_CASES = [dinov2_case(c) for c in CASES if c.name in DINOV2_EVERYWHERE]
assert len(DINOV2_CASES) == len(DINOV2_EVERYWHERE)
CASES += DINOV2_CASES


# ----------------------------------------------------------------------------------- the reference


def masked_bce(logits: torch.Tensor, target: float, valid: torch.Tensor) -> torch.Tensor:
    per_pixel = F.binary_cross_entropy_with_logits(logits[:, 0], torch.full_like(logits[:, 0], target),
                                                   reduction="none")
    return (per_pixel * valid).sum() / valid.sum()


def plain_optimizer(module: nn.Module, cfg) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(module.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[cfg.name]
    return kind(module.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


def reference_step(g: nn.Module, d: nn.Module, images, labels, cfg) -> torch.Tensor:
    """One AdvSemiSeg step on the CPU in float32, plainly. Returns G's adversarial gradient at D's
    input; updates ``g`` and ``d`` in place."""
    num_classes, ignore = cfg.data.num_classes, cfg.data.ignore_index
    opt_g, opt_d = plain_optimizer(g, cfg.optim.generator), plain_optimizer(d, cfg.optim.discriminator)
    valid = (labels != ignore).float()

    # G: CE(G(x), y) + lambda * BCE(D(softmax G(x)), real); D's parameters are not updated here.
    logits = g(images)
    probs = logits.softmax(dim=1)
    loss_adv = LAMBDA_ADV * masked_bce(d(probs), 1.0, valid)
    loss_g = F.cross_entropy(logits, labels, ignore_index=ignore) + loss_adv
    (adv_grad,) = torch.autograd.grad(loss_adv, probs, retain_graph=True)
    trained = [p for p in g.parameters() if p.requires_grad]  # model.generator.norm fixes BatchNorm's affine
    grads = torch.autograd.grad(loss_g, trained)
    for p, grad in zip(trained, grads):
        p.grad = grad
    opt_g.step()

    # D: BCE(D(onehot(y)), real) + BCE(D(softmax G(x)), fake), on G's output before its update.
    onehot = F.one_hot(labels.clamp(0, num_classes - 1), num_classes).permute(0, 3, 1, 2).float()
    onehot = onehot * valid[:, None]
    loss_d = masked_bce(d(probs.detach()), 0.0, valid) + masked_bce(d(onehot), 1.0, valid)
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()
    return adv_grad


def no_dropout(module: nn.Module) -> nn.Module:
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):  # nn.Dropout, and the image-level D's nn.Dropout2d
            m.p = 0.0
    return module


@contextlib.contextmanager
def batch_statistics_frozen(frozen: bool = True) -> Iterator[None]:
    """While a run is built: G's BatchNorm will use its running statistics
    (:func:`freeze_batch_statistics`), so it trains on any batch, a micro-batch of one sample too,
    and the config's predicate must say so (segadv/data/batch_checks.py)."""
    if not frozen:
        yield
        return
    with mock.patch.object(GeneratorConfig, "trains_batch_statistics", property(lambda self: False)):
        yield


def freeze_batch_statistics(module: nn.Module) -> None:
    """BatchNorm in eval mode at every forward (the step sets train mode first)."""

    def hook(mod, args):
        for m in mod.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()

    module.register_forward_pre_hook(hook)


def make_batch(cfg, batch: int = BATCH):
    gen = torch.Generator().manual_seed(5)
    size = cfg.data.synthetic.image_size
    images = torch.randn(batch, 3, size, size, generator=gen)
    labels = torch.randint(0, cfg.data.num_classes, (batch, size, size), generator=gen)
    labels[:, :6, :10] = cfg.data.ignore_index  # the same count on every sample: equal DDP shards
    return images, labels


def initial_networks(cfg):
    torch.manual_seed(0)
    g = no_dropout(build_generator(cfg.model.generator, cfg.data.num_classes))
    d = build_discriminator(cfg.model.discriminator, cfg.data.num_classes)
    return g, d


@dataclass
class Outcome:
    g_update: dict[str, torch.Tensor]
    d_update: dict[str, torch.Tensor]
    adv_grad: torch.Tensor
    # Multi-level domain adaptation: the aux D's update and the gradient G's aux term sent into it.
    d_aux_update: dict[str, torch.Tensor] | None = None
    adv_grad_aux: torch.Tensor | None = None


def params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in unwrap(module).named_parameters()}


def float32_spacing(x: torch.Tensor) -> torch.Tensor:
    """The gap from ``|x|`` to the next float32 above it: what one stored element can resolve."""
    magnitude = x.abs().float()
    return torch.nextafter(magnitude, torch.tensor(math.inf)) - magnitude


class Moved(dict):
    """How a network's tensors moved: ``after - before`` by name, with the float32 spacing each
    element is stored at (``spacing``).

    An update is not computed, it is read off two stored float32 tensors: the optimizer writes
    ``p + u`` rounded to p's spacing. Two sides whose exact updates differ by d therefore store
    updates that differ by up to d plus one spacing (half a spacing of rounding on each side) for
    every step that wrote the tensor. At the harness's learning rates that spacing is not small
    against the update: D's first conv weights (about 0.05, spacing 3.7e-9) move by about 1e-7, so a
    last-bit difference in a gradient that flips one rounding reads as 2e-3 of D's largest update
    (measured with oneDNN capped at AVX2, where the float32 convolutions pick other kernels). The
    comparison (:func:`storage_excess`) therefore allows ``steps`` spacings per element and holds
    the rest, which is what the two sides computed differently, to the case's tolerance."""

    def __init__(self, before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], steps: int = 1):
        super().__init__({k: after[k].float() - v for k, v in before.items()})
        self.spacing = {k: steps * float32_spacing(torch.maximum(v.abs(), after[k].float().abs()))
                        for k, v in before.items()}


def update(before: dict, module: nn.Module, steps: int = 1) -> Moved:
    return Moved(before, params(module), steps)


def reference_outcome(freeze_stats: bool, model_overrides: tuple[str, ...] = (), batch: int = BATCH) -> Outcome:
    cfg = harness_config(*model_overrides)
    g, d = initial_networks(cfg)
    g.train()
    if freeze_stats:
        freeze_batch_statistics(g)
    g0, d0 = params(g), params(d)
    adv_grad = reference_step(g, d, *make_batch(cfg, batch), cfg)
    return Outcome(update(g0, g), update(d0, d), adv_grad)


@pytest.fixture(scope="module")
def references():
    cache = {}

    def get(freeze_stats: bool, model_overrides: tuple[str, ...] = (), batch: int = BATCH) -> Outcome:
        key = (freeze_stats, model_overrides, batch)
        if key not in cache:
            cache[key] = reference_outcome(freeze_stats, model_overrides, batch)
        return cache[key]

    return get


# ----------------------------------------------------------------------------------- one step


def capture_adversarial_gradient(discriminator: nn.Module, store: list) -> None:
    """The gradient reaching D's input in G's update (D's own update feeds it detached maps)."""

    def hook(module, args):
        if args[0].requires_grad:
            args[0].register_hook(lambda grad: store.append(grad.detach().float().cpu()))

    unwrap(discriminator).register_forward_pre_hook(hook)


def segadv_outcome(case: Case, *overrides: str, run=None, batches_in_d_input: int = 1) -> Outcome:
    """One segadv iteration under ``case`` from the reference's initial weights. ``run(parts,
    cfg)`` takes the iteration (default: the supervised step on the reference's batch).
    ``batches_in_d_input``: how many streams' batches D's input joins (AdvSemiSeg: labeled and
    unlabeled)."""
    cfg = harness_config(*overrides, *case.overrides)
    init_g, init_d = initial_networks(cfg)
    with batch_statistics_frozen(case.freeze_stats):
        parts = build_training(cfg, parse_device_map(case.device_map))
    unwrap(parts.g.module).load_state_dict(init_g.state_dict())
    unwrap(parts.d.module).load_state_dict(init_d.state_dict())
    no_dropout(parts.g.module)
    if case.freeze_stats:
        freeze_batch_statistics(unwrap(parts.g.module))
    grads: list[torch.Tensor] = []
    capture_adversarial_gradient(parts.d.module, grads)
    g0, d0 = params(parts.g.module), params(parts.d.module)
    scale = parts.g.opt.loss_scale()  # the scale G's loss is multiplied by in this step
    if run is None:
        parts.step({"labeled": FixedStream(make_batch(cfg))}, step=0)
    else:
        run(parts, cfg)
    return Outcome(update(g0, parts.g.module), update(d0, parts.d.module),
                   adversarial_gradient(grads, cfg, batches_in_d_input) / scale)


def adversarial_gradient(grads: list[torch.Tensor], cfg, batches_in_d_input: int = 1) -> torch.Tensor:
    """The adversarial gradient at D's input over the whole batch: one per micro-batch, each at
    its own rows (the micro-batch's loss, divided by K, averages over 1/K of the pixels). Where D's
    input joins several streams' batches, each micro-batch's rows are put back with their batch's."""
    assert len(grads) == cfg.train.accumulation_steps, "G's update must send one adversarial gradient through D " \
                                                       "per micro-batch"
    per_batch = zip(*(grad.chunk(batches_in_d_input) for grad in grads))
    return torch.cat([torch.cat(rows) for rows in per_batch])


# ----------------------------------------------------------------------------------- comparison


def flat(tensors: dict[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
    if isinstance(tensors, torch.Tensor):
        return tensors.flatten().double()
    return torch.cat([t.flatten() for t in tensors.values()]).double()


def cosine(a, b) -> float:
    return float(F.cosine_similarity(flat(a), flat(b), dim=0))


def storage_excess(got, ref) -> torch.Tensor:
    """|got - ref| element by element, flattened; for two :class:`Moved` the part beyond what
    storing the tensors in float32 allows (the larger of the two sides' spacings)."""
    if not isinstance(ref, Moved):
        return (flat(got) - flat(ref)).abs()
    assert isinstance(got, Moved) and got.keys() == ref.keys(), "updates are compared as Moved on both sides"
    return torch.cat([((got[k] - r).abs() - torch.maximum(got.spacing[k], ref.spacing[k])).clamp(min=0).flatten()
                      for k, r in ref.items()]).double()


def worst_relative_deviation(got, ref) -> float:
    """max |got - ref| over every element (beyond float32 storage's spacing, for updates), relative to
    the reference's largest magnitude."""
    return float(storage_excess(got, ref).max() / flat(ref).abs().max())


def assert_equivalent(case: Case, got: Outcome, ref: Outcome) -> dict[str, float]:
    assert got.g_update.keys() == ref.g_update.keys() and got.d_update.keys() == ref.d_update.keys()
    assert flat(got.adv_grad).abs().max() > 0, "G's adversarial gradient is zero"
    pairs = {"G update": (got.g_update, ref.g_update), "D update": (got.d_update, ref.d_update),
             "adversarial gradient": (got.adv_grad, ref.adv_grad)}
    assert (got.d_aux_update is None) == (ref.d_aux_update is None)
    if ref.d_aux_update is not None:
        assert got.d_aux_update.keys() == ref.d_aux_update.keys()
        assert flat(got.adv_grad_aux).abs().max() > 0, "G's aux adversarial gradient is zero"
        pairs.update({"D_aux update": (got.d_aux_update, ref.d_aux_update),
                      "aux adversarial gradient": (got.adv_grad_aux, ref.adv_grad_aux)})
    return within_tolerance(case, pairs)


def within_tolerance(case: Case, pairs: dict[str, tuple]) -> dict[str, float]:
    """Each (segadv's, the reference's) pair by the case's dtype: in float32 the worst element
    relative to the reference's largest, within ``FP32_RTOL`` (``FP32_SUMMED_ELSEWHERE_RTOL`` where
    sums run in another order); under AMP the cosine, at least ``AMP_MIN_COSINE``. Returns the figures."""
    if case.float32:
        rtol = FP32_SUMMED_ELSEWHERE_RTOL if case.summed_elsewhere else FP32_RTOL
        figures = {name: worst_relative_deviation(a, b) for name, (a, b) in pairs.items()}
        assert all(v <= rtol for v in figures.values()), f"float32 deviations {figures} exceed {rtol}"
    else:
        figures = {name: cosine(a, b) for name, (a, b) in pairs.items()}
        assert all(v >= AMP_MIN_COSINE for v in figures.values()), f"cosines {figures} below {AMP_MIN_COSINE}"
    return figures


def test_updates_are_compared_beyond_what_float32_storage_rounds():
    """Two sides whose gradients differ in their last bits may store a parameter one spacing apart:
    an update of 1e-7 on a weight of 0.05 (spacing 3.7e-9) then reads 3.7e-2 apart, which the
    comparison allows; a 1% difference in an update the parameter's spacing resolves is still seen."""
    before = {"w": torch.tensor([0.05, -0.05, 0.0])}
    exact = torch.tensor([1e-7, -3e-8, 1e-7])
    ref = Moved(before, {"w": before["w"] + exact})
    flipped = Moved(before, {"w": torch.nextafter(before["w"] + exact, torch.full((3,), math.inf))})
    assert float((flat(flipped) - flat(ref)).abs().max() / flat(ref).abs().max()) > 3e-2
    assert worst_relative_deviation(flipped, ref) == 0
    two_steps = Moved(before, {"w": before["w"] + exact + 2 * float32_spacing(before["w"])}, steps=2)
    assert worst_relative_deviation(two_steps, ref) == 0  # each step stores once
    off = Moved(before, {"w": before["w"] + exact * torch.tensor([1.0, 1.0, 1.01])})
    assert worst_relative_deviation(off, ref) > FP32_SUMMED_ELSEWHERE_RTOL


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_one_step_matches_the_plain_float32_loop(case, references, no_tf32):
    got = segadv_outcome(case)
    figures = assert_equivalent(case, got, references(case.freeze_stats, case.model_overrides))
    print(f"{case.name}: {figures}")


def test_the_harness_sees_a_zeroed_adversarial_path(references, monkeypatch):
    """The harness must fail a step whose adversarial gradient never reaches G, even though G's
    update (dominated by CE) barely changes."""
    from segadv.methods import adversarial as step_module

    real = step_module.masked_bce_with_logits
    monkeypatch.setattr(step_module, "masked_bce_with_logits",
                        lambda logits, target, valid: real(logits, target, valid) * 0.0)
    with pytest.raises(AssertionError):
        assert_equivalent(Case("cpu"), segadv_outcome(Case("cpu")), references(False))


# ----------------------------------------------------------------------------------- pipeline stages


@dataclass(frozen=True)
class HostStagesCase(Case):
    """G split over pipeline stages on the host: the same kernels summed in the same order as the
    unsplit G, so the strict float32 tolerance and batch statistics apply."""

    @property
    def summed_elsewhere(self) -> bool:
        return False


def split_generator_case(name: str, device_map: str, monkeypatch) -> Outcome:
    """One step of ``device_map`` with tests/pipeline_toy.py's splittable G built by both sides."""
    from pipeline_toy import ToySplitG, use_toy_generator

    monkeypatch.setattr(sys.modules[__name__], "build_generator", lambda cfg, num_classes: ToySplitG(num_classes))
    use_toy_generator(monkeypatch)
    return segadv_outcome(HostStagesCase(name, device_map))


@pytest.mark.parametrize("device_map", ["g:cpu/cpu,d:cpu", "g:cpu/cpu/cpu,d:cpu"])
def test_a_generator_split_into_stages_matches_the_plain_float32_loop(device_map, monkeypatch, no_tf32):
    """``g:cpu/cpu,d:cpu`` (G's blocks over two stages on the host, handed over in its forward)
    trains what the plain loop and the unsplit ``g:cpu,d:cpu`` train, from the same weights."""
    split = split_generator_case(device_map, device_map, monkeypatch)
    reference = reference_outcome(freeze_stats=False)  # the toy G, plainly (build_generator replaced)
    print(f"{device_map}: {assert_equivalent(HostStagesCase(device_map), split, reference)}")
    whole = split_generator_case("g:cpu,d:cpu", "g:cpu,d:cpu", monkeypatch)
    assert_equivalent(HostStagesCase("unsplit"), whole, reference)
    assert all(torch.equal(split.g_update[k], whole.g_update[k]) for k in whole.g_update)  # the same sums
    assert flat(split.d_update).equal(flat(whole.d_update)) and split.adv_grad.equal(whole.adv_grad)


def test_a_dinov2_generator_split_into_stages_matches_the_plain_loop(references, no_tf32):
    """``g:cpu/cpu,d:cpu`` with the DINOv2 G (segadv/models/vit/split.py: the embedding and block 0 on
    the first stage, block 1, the norm and the head on the second) trains what the plain loop and
    the unsplit G train: the same kernels in the same order, so bitwise the unsplit step's."""
    split = segadv_outcome(HostStagesCase("dinov2-g:cpu/cpu,d:cpu", "g:cpu/cpu,d:cpu", DINOV2))
    whole = segadv_outcome(HostStagesCase("dinov2-g:cpu,d:cpu", "g:cpu,d:cpu", DINOV2))
    reference = references(False, dinov2_case(Case("cpu")).model_overrides)
    print(f"dinov2 g:cpu/cpu,d:cpu: {assert_equivalent(HostStagesCase('split'), split, reference)}")
    assert_equivalent(HostStagesCase("unsplit"), whole, reference)
    assert all(torch.equal(split.g_update[k], whole.g_update[k]) for k in whole.g_update)
    assert flat(split.d_update).equal(flat(whole.d_update)) and split.adv_grad.equal(whole.adv_grad)


# ----------------------------------------------------------------------------------- DDP


DDP_CASES = [
    pytest.param("cpu", (), id="ddp-gloo-cpu"),
    pytest.param("cpu", (*amp("generator", "bfloat16"), *amp("discriminator", "float16")), id="ddp-gloo-cpu-amp"),
    # Two micro-batches of one sample per rank: no_sync on the first, one all-reduce in the second.
    pytest.param("cpu", ("train.accumulation_steps=2",), id="ddp-gloo-cpu-accumulation"),
    pytest.param("cpu", (CHECKPOINTING,), id="ddp-gloo-cpu-checkpointing"),
    # Each rank compiles its networks before DDP wraps them (DDP's bucket splits: dynamo's DDPOptimizer).
    pytest.param("cpu", (*COMPILE, AOT), id="ddp-gloo-cpu-compile"),
    pytest.param("cpu", (*DEEPLABV2, FROZEN), id="ddp-gloo-cpu-deeplabv2-frozen"),
    pytest.param("g:0,d:0", (), id="ddp-cuda", marks=pytest.mark.cuda),
    pytest.param("g:0,d:0", COMPILE, id="ddp-cuda-compile", marks=pytest.mark.cuda),
]


@pytest.mark.parametrize("device_map, overrides", DDP_CASES)
def test_ddp_step_on_two_processes_matches_the_plain_loop(tmp_path, references, device_map, overrides):
    """Two processes, each with half the batch (gloo on CPU; on CUDA nccl when each rank has a GPU
    of its own, else gloo over the shared GPU)."""
    cfg = harness_config(*overrides)
    init_g, init_d = initial_networks(cfg)
    images, labels = make_batch(cfg)
    torch.save({"g": init_g.state_dict(), "d": init_d.state_dict(), "images": images, "labels": labels},
               tmp_path / "input.pt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(HERE / "equivalence_worker.py"), str(tmp_path), device_map, *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for net in ("g", "d"):  # DDP keeps the ranks identical
        assert all(torch.equal(ranks[0][net][k], ranks[1][net][k]) for k in ranks[0][net]), net
    g0, d0 = params(init_g), params(init_d)
    # Each rank's adversarial loss is a mean over its half: the full batch's gradient is half of it.
    adv_grad = torch.cat([r["adv_grad"] for r in ranks]) / 2
    got = Outcome(Moved(g0, ranks[0]["g"]), Moved(d0, ranks[0]["d"]), adv_grad)
    case = Case("ddp", device_map, tuple(overrides), split_batch=True)
    print(f"ddp {device_map} {overrides}: {assert_equivalent(case, got, references(True, case.model_overrides))}")


# ----------------------------------------------------------------------------------- AdvSemiSeg

# The semi-supervised iteration under the same placements, wrappers and precisions. Every term is
# on at step 0; mask_threshold 0 lets every pixel through (near-tie pixels would flip under reduced
# precision; that the mask is exact is tested in test_advsemiseg.py), so what is compared is the
# wiring: the unlabeled forward on G's device, D's confidence on D's, the pseudo labels back on G's.
SEMI_OVERRIDES = ("method.name=advsemiseg", "method.advsemiseg.semi_start=0", "method.advsemiseg.semi_start_adv=0",
                  "method.advsemiseg.lambda_semi=0.1", f"method.advsemiseg.lambda_semi_adv={LAMBDA_ADV}",
                  "method.advsemiseg.mask_threshold=0.0", "data.labeled_fraction=0.5")
SEMI_CASES = [c for c in CASES if c.name in {
    "cpu", "cpu-dataparallel", "both-bf16", "g-bf16-d-fp16", "g:cuda:0,d:cpu", "g:cpu,d:cuda:0",
    "cuda-both-fp16", "g:1,d:0", "g:0+1,d:1", "cpu-accumulation-2", "cpu-activation-checkpointing"}]


def make_semi_batches(cfg):
    images_l, labels_l = make_batch(cfg)
    gen = torch.Generator().manual_seed(6)
    images_u = torch.randn(BATCH, 3, *images_l.shape[2:], generator=gen)
    labels_gt = torch.randint(0, cfg.data.num_classes, labels_l.shape, generator=gen)
    labels_gt[:, -4:] = cfg.data.ignore_index
    return images_l, labels_l, images_u, labels_gt


def reference_semi_step(g: nn.Module, d: nn.Module, images_l, labels_l, images_u, labels_gt, cfg) -> torch.Tensor:
    """One AdvSemiSeg iteration on the CPU in float32, plainly; returns the adversarial gradient
    at D's input (labeled and unlabeled maps)."""
    num_classes, ignore, semi = cfg.data.num_classes, cfg.data.ignore_index, cfg.method.advsemiseg
    opt_g, opt_d = plain_optimizer(g, cfg.optim.generator), plain_optimizer(d, cfg.optim.discriminator)
    n = len(images_l)
    valid_l = (labels_l != ignore).float()
    every = torch.ones(len(images_u), *labels_l.shape[1:])

    logits = g(torch.cat([images_l, images_u]))
    probs = logits.softmax(dim=1)
    d_out = d(probs)
    loss_adv = LAMBDA_ADV * masked_bce(d_out[:n], 1.0, valid_l) + semi.lambda_semi_adv * masked_bce(d_out[n:], 1.0, every)
    confidence = torch.sigmoid(d_out[n:, 0]).detach()
    pseudo = logits[n:].detach().argmax(dim=1)
    pseudo[confidence < semi.mask_threshold] = ignore
    loss_g = (F.cross_entropy(logits[:n], labels_l, ignore_index=ignore) + loss_adv
              + semi.lambda_semi * F.cross_entropy(logits[n:], pseudo, ignore_index=ignore))
    (adv_grad,) = torch.autograd.grad(loss_adv, probs, retain_graph=True)
    grads = torch.autograd.grad(loss_g, list(g.parameters()))
    for p, grad in zip(g.parameters(), grads):
        p.grad = grad
    opt_g.step()

    valid_gt = (labels_gt != ignore).float()
    onehot = F.one_hot(labels_gt.clamp(0, num_classes - 1), num_classes).permute(0, 3, 1, 2).float() * valid_gt[:, None]
    loss_d = 0.5 * (masked_bce(d(probs.detach()), 0.0, torch.cat([valid_l, every])) + masked_bce(d(onehot), 1.0, valid_gt))
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()
    return adv_grad


@pytest.fixture(scope="module")
def semi_references():
    cache = {}

    def get(freeze_stats: bool) -> Outcome:
        if freeze_stats not in cache:
            cfg = harness_config(*SEMI_OVERRIDES)
            g, d = initial_networks(cfg)
            g.train()
            if freeze_stats:
                freeze_batch_statistics(g)
            g0, d0 = params(g), params(d)
            adv_grad = reference_semi_step(g, d, *make_semi_batches(cfg), cfg)
            cache[freeze_stats] = Outcome(update(g0, g), update(d0, d), adv_grad)
        return cache[freeze_stats]

    return get


def semi_iteration(parts, cfg) -> None:
    images_l, labels_l, images_u, labels_gt = make_semi_batches(cfg)
    streams = {"labeled": FixedStream((images_l, labels_l)), "unlabeled": FixedStream(images_u),
               "gt": FixedStream((images_u, labels_gt))}
    out = parts.step(streams, step=0)
    assert out["semi_pixel_ratio"].item() == 1.0


@pytest.mark.parametrize("case", [c.param() for c in SEMI_CASES])
def test_advsemiseg_iteration_matches_the_plain_float32_loop(case, semi_references, no_tf32):
    got = segadv_outcome(case, *SEMI_OVERRIDES, run=semi_iteration, batches_in_d_input=2)
    print(f"advsemiseg {case.name}: {assert_equivalent(case, got, semi_references(case.freeze_stats))}")


# ----------------------------------------------------------------------------------- s4GAN

# s4GAN's iteration (image-level D, feature matching as G's only term through D, whole-image
# self-training) under the same placements, wrappers and precisions, its reference defaults
# (lambda_fm 0.1, lambda_st 1). Threshold 0 lets every image through (a near-tie score would flip
# under reduced precision; that the selection is exact is tested in test_s4gan.py). D's dropout is
# off on both sides, as G's is. Split batches are left out: under DDP each rank's feature matching
# compares its own shard's means, by design not the full batch's (docs/methods.md).
S4GAN_OVERRIDES = ("method.name=s4gan", "model.discriminator.kind=image", "method.s4gan.st_start=0",
                   "method.s4gan.threshold=0.0", "data.labeled_fraction=0.5",
                   "loss.lambda_adv=null")  # s4GAN has no such term (its D reaches G by method.s4gan.lambda_fm)
S4GAN_CASES = [c for c in CASES if c.name in {
    "cpu", "cpu-dataparallel", "cpu-channels_last", "g-bf16", "d-fp16", "both-bf16", "g-bf16-d-fp16",
    "dataparallel-bf16", "g:cuda:0,d:cpu", "g:cpu,d:cuda:0", "cuda-both-fp16", "g:1,d:0"}]


def make_s4gan_batches(cfg):
    images_l, labels_l, images_u, labels_gt = make_semi_batches(cfg)
    images_gt = torch.randn(images_l.shape, generator=torch.Generator().manual_seed(8))
    return images_l, labels_l, images_u, images_gt, labels_gt


def unit_range(images: torch.Tensor) -> torch.Tensor:
    low, high = images.amin(dim=(1, 2, 3), keepdim=True), images.amax(dim=(1, 2, 3), keepdim=True)
    return (images - low) / (high - low)


def reference_s4gan_step(g: nn.Module, d: nn.Module, images_l, labels_l, images_u, images_gt, labels_gt,
                         cfg) -> torch.Tensor:
    """One s4GAN iteration on the CPU in float32, plainly; returns the feature-matching gradient at
    D's input (the unlabeled images with G's softmax)."""
    num_classes, ignore, s = cfg.data.num_classes, cfg.data.ignore_index, cfg.method.s4gan
    opt_g, opt_d = plain_optimizer(g, cfg.optim.generator), plain_optimizer(d, cfg.optim.discriminator)

    loss_ce = F.cross_entropy(g(images_l), labels_l, ignore_index=ignore)
    logits_u = g(images_u)
    fake = torch.cat([logits_u.softmax(dim=1), unit_range(images_u)], dim=1)
    valid_gt = (labels_gt != ignore).float()
    onehot = F.one_hot(labels_gt.clamp(0, num_classes - 1), num_classes).permute(0, 3, 1, 2).float() * valid_gt[:, None]
    real = torch.cat([onehot, unit_range(images_gt)], dim=1)
    _, features_fake = d(fake, return_features=True)
    _, features_real = d(real, return_features=True)
    loss_fm = s.lambda_fm * (features_real.mean(dim=0) - features_fake.mean(dim=0)).abs().mean()
    loss_st = s.lambda_st * F.cross_entropy(logits_u, logits_u.detach().argmax(dim=1))  # threshold 0: every image
    (adv_grad,) = torch.autograd.grad(loss_fm, fake, retain_graph=True)
    grads = torch.autograd.grad(loss_ce + loss_fm + loss_st, list(g.parameters()))
    for p, grad in zip(g.parameters(), grads):
        p.grad = grad
    opt_g.step()

    loss_d = 0.5 * (bce(d(fake.detach()), 0.0) + bce(d(real), 1.0))
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()
    return adv_grad


@pytest.fixture(scope="module")
def s4gan_references():
    cache = {}

    def get(freeze_stats: bool) -> Outcome:
        if freeze_stats not in cache:
            cfg = harness_config(*S4GAN_OVERRIDES)
            g, d = initial_networks(cfg)
            no_dropout(d)
            g.train()
            if freeze_stats:
                freeze_batch_statistics(g)
            g0, d0 = params(g), params(d)
            adv_grad = reference_s4gan_step(g, d, *make_s4gan_batches(cfg), cfg)
            cache[freeze_stats] = Outcome(update(g0, g), update(d0, d), adv_grad)
        return cache[freeze_stats]

    return get


def s4gan_iteration(parts, cfg) -> None:
    no_dropout(parts.d.module)
    images_l, labels_l, images_u, images_gt, labels_gt = make_s4gan_batches(cfg)
    streams = {"labeled": FixedStream((images_l, labels_l)), "unlabeled": FixedStream(images_u),
               "gt": FixedStream((images_gt, labels_gt))}
    out = parts.method(streams, step=0)
    assert out["st_image_ratio"].item() == 1.0


@pytest.mark.parametrize("case", [c.param() for c in S4GAN_CASES])
def test_s4gan_iteration_matches_the_plain_float32_loop(case, s4gan_references, no_tf32):
    got = segadv_outcome(case, *S4GAN_OVERRIDES, run=s4gan_iteration)
    print(f"s4gan {case.name}: {assert_equivalent(case, got, s4gan_references(case.freeze_stats))}")


# ----------------------------------------------------------------------------------- domain adaptation

# Multi-level AdaptSegNet (and AdvEnt) under the same placements, wrappers and precisions, with the
# aux D placed, wrapped and run in its own precision too. Both adversarial weights are LAMBDA_ADV
# (see the module docstring); every term is on at step 0.
UDA_OVERRIDES = (
    "target_data={kind: synthetic, num_classes: 5, val_batch_size: 4, num_workers: 0, "
    "synthetic: {image_size: 64, train_size: 8, val_size: 4, domain: target, seed: 1}}",
    "model.generator.aux_head=true", "method.adaptsegnet.lambda_seg_aux=0.1",
    f"loss.lambda_adv={LAMBDA_ADV}", f"method.adaptsegnet.lambda_adv_aux={LAMBDA_ADV}",
    f"method.advent.lambda_adv_aux={LAMBDA_ADV}",
)
D_AUX_APART = (*amp("discriminator", "bfloat16"), *amp("discriminator_aux", "float16"))
UDA_CASES = [c for c in CASES if c.name in {
    "cpu", "cpu-dataparallel", "cpu-channels_last", "both-bf16", "g-bf16-d-fp16", "g:cuda:0,d:cpu",
    "g:cpu,d:cuda:0", "cuda-both-fp16", "g:1,d:0", "g:0+1,d:1", "cpu-accumulation-2",
    "cpu-activation-checkpointing"}] + [
    Case("d-bf16-d_aux-fp16", overrides=D_AUX_APART),
    Case("g:cpu,d:cpu,d_aux:cuda:0", "g:cpu,d:cpu,d_aux:cuda:0", marks=CUDA),
    Case("g:cuda:0,d:cpu-bf16,d_aux:cuda:0-fp16", "g:cuda:0,d:cpu,d_aux:cuda:0", D_AUX_APART, marks=CUDA),
    Case("g:1,d:0,d_aux:1", "g:1,d:0,d_aux:1", marks=CUDA2),
]
MAPS = {"adaptsegnet": lambda logits: logits.softmax(dim=1),
        "advent": lambda logits: -logits.softmax(dim=1) * logits.log_softmax(dim=1) / math.log(logits.shape[1])}


def make_uda_batches(cfg):
    images_s, labels_s = make_batch(cfg)
    images_t = torch.randn(images_s.shape, generator=torch.Generator().manual_seed(7))
    return images_s, labels_s, images_t


def initial_uda_networks(cfg):
    """G, D and D_aux at initialisation, each D's output bias set to 2. Fresh D's give logits near 0
    on both domains' (near-identical, freshly initialised) maps, so D's source (0) and target (1)
    gradients cancel to about 1% of their size: (sigmoid - 0) / 2 + (sigmoid - 1) / 2 with sigmoid
    about 0.5. In reduced precision the remainder is rounding (measured: D_aux update cosine
    0.44-0.91 under bfloat16 / float16 D's). Biased, the halves no longer cancel, as after any
    training, and the harness compares the wiring rather than the cancellation."""
    torch.manual_seed(0)
    g = no_dropout(build_generator(cfg.model.generator, cfg.data.num_classes))
    d, d_aux = (build_discriminator(cfg.model.discriminator, cfg.data.num_classes) for _ in range(2))
    with torch.no_grad():
        for net in (d, d_aux):
            net.classifier.bias.fill_(2.0)
    return g, d, d_aux


def bce(logits: torch.Tensor, target: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


def reference_uda_step(g, d, d_aux, images_s, labels_s, images_t, cfg, method: str) -> tuple[torch.Tensor, ...]:
    """One multi-level adaptation iteration on the CPU in float32, plainly: source (0) and target
    (1), D's parameters untouched by G's update. Returns the adversarial gradients at D's and
    D_aux's inputs."""
    settings, to_map = getattr(cfg.method, method), MAPS[method]
    params_g = list(g.parameters())
    opt_g = plain_optimizer(g, cfg.optim.generator)
    opt_d, opt_d_aux = (plain_optimizer(net, cfg.optim.discriminator) for net in (d, d_aux))

    main_s, aux_s = g(images_s, return_aux=True)
    ignore = cfg.data.ignore_index
    loss_s = F.cross_entropy(main_s, labels_s, ignore_index=ignore) + settings.lambda_seg_aux * F.cross_entropy(
        aux_s, labels_s, ignore_index=ignore)
    grads = torch.autograd.grad(loss_s, params_g)
    main_t, aux_t = g(images_t, return_aux=True)
    maps_t, maps_aux_t = to_map(main_t), to_map(aux_t)
    loss_adv = method_class(method).adversarial_weight(cfg) * bce(d(maps_t), 0.0)
    loss_adv_aux = settings.lambda_adv_aux * bce(d_aux(maps_aux_t), 0.0)
    adv_grad, adv_grad_aux = torch.autograd.grad(loss_adv + loss_adv_aux, [maps_t, maps_aux_t], retain_graph=True)
    grads_t = torch.autograd.grad(loss_adv + loss_adv_aux, params_g, allow_unused=True)
    for p, a, b in zip(params_g, grads, grads_t):
        p.grad = a if b is None else a + b
    opt_g.step()

    for net, opt, source, target in ((d, opt_d, main_s, main_t), (d_aux, opt_d_aux, aux_s, aux_t)):
        opt.zero_grad()
        loss_d = 0.5 * (bce(net(to_map(source).detach()), 0.0) + bce(net(to_map(target).detach()), 1.0))
        loss_d.backward()
        opt.step()
    return adv_grad, adv_grad_aux


@pytest.fixture(scope="module")
def uda_references():
    cache = {}

    def get(method: str, freeze_stats: bool) -> Outcome:
        if (method, freeze_stats) not in cache:
            cfg = harness_config(*UDA_OVERRIDES, f"method.name={method}")
            g, d, d_aux = initial_uda_networks(cfg)
            g.train()
            if freeze_stats:
                freeze_batch_statistics(g)
            g0, d0, a0 = params(g), params(d), params(d_aux)
            adv_grad, adv_grad_aux = reference_uda_step(g, d, d_aux, *make_uda_batches(cfg), cfg, method)
            cache[method, freeze_stats] = Outcome(update(g0, g), update(d0, d), adv_grad, update(a0, d_aux),
                                                  adv_grad_aux)
        return cache[method, freeze_stats]

    return get


def uda_outcome(case: Case, method: str) -> Outcome:
    """One segadv adaptation iteration under ``case`` from the reference's initial weights."""
    cfg = harness_config(*UDA_OVERRIDES, f"method.name={method}", *case.overrides)
    with batch_statistics_frozen(case.freeze_stats):
        parts = build_training(cfg, parse_device_map(case.device_map))
    for net, init in zip((parts.g.module, parts.d.module, parts.d_aux.module),
                         initial_uda_networks(cfg)):
        unwrap(net).load_state_dict(init.state_dict())
    no_dropout(parts.g.module)
    if case.freeze_stats:
        freeze_batch_statistics(unwrap(parts.g.module))
    grads: list[torch.Tensor] = []
    grads_aux: list[torch.Tensor] = []
    capture_adversarial_gradient(parts.d.module, grads)
    capture_adversarial_gradient(parts.d_aux.module, grads_aux)
    before = [params(net) for net in (parts.g.module, parts.d.module, parts.d_aux.module)]
    scale = parts.g.opt.loss_scale()
    images_s, labels_s, images_t = make_uda_batches(cfg)
    parts.step({"source": FixedStream((images_s, labels_s)), "target": FixedStream(images_t)}, step=0)
    g_up, d_up, aux_up = (update(b, net) for b, net in
                          zip(before, (parts.g.module, parts.d.module, parts.d_aux.module)))
    return Outcome(g_up, d_up, adversarial_gradient(grads, cfg) / scale, aux_up,
                   adversarial_gradient(grads_aux, cfg) / scale)


@pytest.mark.parametrize("method", ["adaptsegnet", "advent"])
@pytest.mark.parametrize("case", [c.param() for c in UDA_CASES])
def test_domain_adaptation_iteration_matches_the_plain_float32_loop(case, method, uda_references, no_tf32):
    if method == "advent" and case.name not in {"cpu", "both-bf16", "g:1,d:0,d_aux:1"}:
        pytest.skip("AdvEnt differs from AdaptSegNet only in D's input map: a few placements suffice")
    got = uda_outcome(case, method)
    print(f"{method} {case.name}: {assert_equivalent(case, got, uda_references(method, case.freeze_stats))}")


def test_the_harness_sees_the_aux_discriminator_trained_on_the_wrong_maps(uda_references, monkeypatch):
    """A subtle miswiring: D_aux's own update fed a uniform map as its source half. G's update and
    both adversarial gradients are untouched, so only the D_aux comparison can catch it."""
    from segadv.methods.domain_adaptation.iteration import DomainAdaptation

    real = DomainAdaptation.discriminator_maps

    def wrong_aux_source(self, level, logits):
        maps = real(self, level, logits)
        if level.name == "aux" and not torch.is_grad_enabled():  # the source half, for D_aux's update
            return torch.full_like(maps, 1.0 / maps.shape[1])
        return maps

    monkeypatch.setattr(DomainAdaptation, "discriminator_maps", wrong_aux_source)
    with pytest.raises(AssertionError, match="D_aux update"):
        assert_equivalent(Case("cpu"), uda_outcome(Case("cpu"), "adaptsegnet"), uda_references("adaptsegnet", False))


UDA_DDP_CASES = [
    pytest.param("cpu", (), id="ddp-gloo-cpu"),
    pytest.param("cpu", (*amp("generator", "bfloat16"), *D_AUX_APART), id="ddp-gloo-cpu-amp"),
    pytest.param("g:0,d:0", (), id="ddp-cuda", marks=pytest.mark.cuda),
]


@pytest.mark.parametrize("device_map, overrides", UDA_DDP_CASES)
def test_ddp_domain_adaptation_on_two_processes_matches_the_plain_loop(tmp_path, uda_references, device_map,
                                                                        overrides):
    """G, D and D_aux each under their own DDP, each rank with half the source and half the target."""
    cfg = harness_config(*UDA_OVERRIDES, "method.name=adaptsegnet", *overrides)
    init_g, init_d, init_d_aux = initial_uda_networks(cfg)
    images, labels, target = make_uda_batches(cfg)
    torch.save({"g": init_g.state_dict(), "d": init_d.state_dict(), "d_aux": init_d_aux.state_dict(),
                "images": images, "labels": labels, "target": target}, tmp_path / "input.pt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(HERE / "equivalence_worker.py"), str(tmp_path), device_map, *UDA_OVERRIDES,
           "method.name=adaptsegnet", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for net in ("g", "d", "d_aux"):  # DDP keeps the ranks identical
        assert all(torch.equal(ranks[0][net][k], ranks[1][net][k]) for k in ranks[0][net]), net
    starts = {net: params(init) for net, init in (("g", init_g), ("d", init_d), ("d_aux", init_d_aux))}
    moved = {net: Moved(start, ranks[0][net]) for net, start in starts.items()}
    # Each rank's adversarial losses are means over its half: the full batch's gradient is half of it.
    got = Outcome(moved["g"], moved["d"], torch.cat([r["adv_grad"] for r in ranks]) / 2, moved["d_aux"],
                  torch.cat([r["adv_grad_aux"] for r in ranks]) / 2)
    case = Case("ddp", device_map, tuple(overrides), split_batch=True)
    print(f"adaptsegnet ddp {device_map} {overrides}: {assert_equivalent(case, got, uda_references('adaptsegnet', True))}")


# ----------------------------------------------------------------------------------- mean teacher

# The mean teacher (issue 47) over MT_STEPS iterations, so that the second step's pseudo labels
# come from a teacher that has moved (DACS's warm-up: decay 0, then 1/2), compared on G's update,
# the teacher's (parameters; with running statistics its buffers follow G's) and, with D on top,
# D's and the adversarial gradient. The reference calls mixing.py's primitives (held to the
# references in tests/methods/test_mixing.py) with its own generator seeded as the method's, in
# the method's draw order (mask, jitter, blur), and not the method's iteration.
# dacs_threshold: at DACS's 0.968 a fresh G's share is 0 and the pseudo-labelled pixels would not
# count. A train-mode teacher's top probabilities straddle 0.3 (measured quartiles 0.27-0.35), so in
# adaptation the weight is a share between 0 and 1; an eval-mode fresh teacher's are all near 0.2135
# at both steps (5 classes; measured 0.2120-0.2136), a knife edge: above it the share is 0, the
# pseudo labels weigh nothing and the teacher's forward goes uncompared. The semi-supervised
# settings take 0.2, 1/num_classes, which every top probability reaches: the share is 1, and every
# pseudo label counts as the pasted pixels' labels do.
MT_STEPS = 2
MT_OVERRIDES = ("method.name=mean_teacher", "method.mean_teacher.dacs_threshold=0.2", "data.labeled_fraction=0.5")
MT_SETTINGS = {  # after the harness's loss.lambda_adv: 0 builds no D
    # French et al.: semi-supervised, the teacher on running statistics (eval mode) and their EMA.
    "semi": ("method.mean_teacher.teacher_batchnorm=running", "loss.lambda_adv=0"),
    "semi-adv": ("method.mean_teacher.teacher_batchnorm=running", f"loss.lambda_adv={LAMBDA_ADV}"),
    # DACS: adaptation, the teacher's BatchNorm on batch statistics (train mode).
    "adaptation": (UDA_OVERRIDES[0], "method.mean_teacher.teacher_batchnorm=batch",
                   "method.mean_teacher.dacs_threshold=0.3", "loss.lambda_adv=0"),
}
# Accumulation and DDP cut the batch into parts the method runs on one at a time (a micro-batch, a
# rank's shard). Each part draws its own mixing (the micro-batches in turn from the one generator,
# each rank from its own, seeded with its rank), its teacher with teacher_batchnorm: batch normalises
# with the part's statistics (as G's BatchNorm does: docs/training.md, "What BatchNorm sees"), and
# its losses count 1/K of the step's. DACS's confidence weight (confidence_share: batch) is the
# share of confident pixels over the batch (docs/methods.md); segadv's iteration counts it over what
# it is handed, the part (docs/methods.md, the mean teacher's confidence_share), a different number. These cases count it per image (confidence_share: image), the same number
# whether the image is seen in its batch or in its part, so the plain loop keeps DACS's definition
# (and refuses the batch share on parts) and the comparison does not depend on which is meant.
MT_PER_IMAGE = "method.mean_teacher.confidence_share=image"
# Near-ties in the teacher's argmax. DACS's train-mode teacher normalises with batch statistics,
# which at initialisation amplify rounding: its probabilities moved up to 6.3e-6 in channels_last
# and 2.0e-6 from float64 (measured on the CPU), while among the 16,384 pixels of a step some have
# their top two probabilities 1e-6 apart (smallest measured gap 7.5e-7; 0.13 % of the pixels lie
# within 1e-4). A flipped pseudo label is not rounding in the comparison: 3 + 2 flipped pixels moved
# G's update by 1.9e-2 of its largest element. So in float32 the plain loop checks segadv's pseudo
# labels against its own argmax wherever its top two are more than PSEUDO_LABEL_TIE apart (every
# pixel must agree), and only within it takes segadv's, which must be one of its top two. The
# eval-mode teachers of the semi-supervised settings have no such pixels (smallest gap 8e-3).
PSEUDO_LABEL_TIE = 1e-4
# Two micro-batches of 2, and French et al.'s EMA without DACS's warm-up, at decay 1/2: with the
# warm-up (decay 0, then 1/2) a teacher moved after each micro-batch instead of once per optimizer
# step would come out the same (an update before G steps averages the teacher with G, which it
# already is); without it, the second step's extra update shows in the teacher and its pseudo labels.
MT_ACCUMULATION = Case("cpu-accumulation-2-per-image",
                       overrides=("train.accumulation_steps=2", "data.batch_size=4", MT_PER_IMAGE,
                                  "method.mean_teacher.ema_warmup=false", "method.mean_teacher.ema_decay=0.5"))
# The teacher on its own: under its own autocast with G in float32 (amp.teacher; compared by cosine,
# as the AMP cases), compiled alone (compile.teacher; aot_eager: graph capture without minutes of
# C++), and placed apart from G by the device map (t, segadv/config/roles.py; where the map leaves
# it out it shares G's devices, as every other case has it).
MT_TEACHER_CASES = [
    Case("teacher-bf16", overrides=amp("teacher", "bfloat16")),
    Case("compile-aot-teacher", overrides=("compile.teacher=true", AOT)),
    Case("g:cpu,d:cpu,t:cuda:0", "g:cpu,d:cpu,t:cuda:0", marks=CUDA),
    Case("g:cuda:0,d:cuda:0,t:cpu-bf16", "g:cuda:0,d:cuda:0,t:cpu", amp("teacher", "bfloat16"), marks=CUDA),
    Case("g:1,d:0,t:0", "g:1,d:0,t:0", marks=CUDA2),
]
# Every placement and wrapper the other methods' iterations run under, in each setting; the AMP
# cases where the setting has the network (no D in "semi" and "adaptation"); the teacher's autocast
# in eval and in train mode (running and batch statistics); its compile (8 s of graph capture on
# the CPU) with DACS's train-mode teacher, the default; the device maps in every setting.
MT_EVERYWHERE = {"cpu", "cpu-dataparallel", "cpu-channels_last", "cpu-activation-checkpointing", "g:cuda:0,d:cpu",
                 "g:cpu,d:cuda:0", "cuda-both-fp16", "g:1,d:0", "g:0+1,d:1"}
MT_AMP = {"semi": {"g-bf16"}, "semi-adv": {"both-bf16", "g-bf16-d-fp16"}, "adaptation": {"g-bf16"}}
MT_TEACHER_SETTINGS = {"teacher-bf16": ("semi", "adaptation"), "compile-aot-teacher": ("adaptation",)}
MT_CASES = [(setting, c) for setting in MT_SETTINGS for c in CASES if c.name in MT_EVERYWHERE | MT_AMP[setting]] + [
    (setting, c) for setting in MT_SETTINGS for c in (MT_ACCUMULATION, *MT_TEACHER_CASES)
    if setting in MT_TEACHER_SETTINGS.get(c.name, MT_SETTINGS)]
# The DINOv2 G as student and teacher, with AdvSemiSeg's D on top (every network the method has):
# the placements, wrappers and precisions above (channels_last left out, as for the one step).
MT_DINOV2 = [("semi-adv", dinov2_case(c)) for c in (*CASES, MT_ACCUMULATION, *MT_TEACHER_CASES)
             if c.name in (MT_EVERYWHERE - {"cpu-channels_last"}) | MT_AMP["semi-adv"] |
             {MT_ACCUMULATION.name, "teacher-bf16", "g:cpu,d:cpu,t:cuda:0", "g:1,d:0,t:0"}]
assert len(MT_DINOV2) == 14
MT_CASES += MT_DINOV2


def mean_teacher_config(setting: str, *overrides: str):
    return harness_config(*MT_OVERRIDES, *MT_SETTINGS[setting], *overrides)


def mt_reference_overrides(case: Case) -> tuple[str, ...]:
    """The case's settings the plain loop reads: the networks', the method's and the accumulation."""
    return tuple(o for o in case.overrides
                 if o.startswith(("model.", "method.", "train.accumulation_steps=", "data.batch_size=",
                                  "data.synthetic.image_size=")))


def make_mt_batches(cfg):
    images_l, labels_l = make_batch(cfg)
    images_u = torch.randn(images_l.shape, generator=torch.Generator().manual_seed(7))
    labels_gt = torch.randint(0, cfg.data.num_classes, labels_l.shape, generator=torch.Generator().manual_seed(9))
    return images_l, labels_l, images_u, labels_gt


def averaged(module: nn.Module, running: bool) -> list[torch.Tensor]:
    """What the teacher's EMA averages: the parameters, and with running statistics the floating buffers."""
    return list(module.parameters()) + ([b for b in module.buffers() if b.is_floating_point()] if running else [])


def reference_mean_teacher(g, teacher, d, images_l, labels_l, images_u, labels_gt, cfg, ranks: int = 1,
                           teacher_replicas: int = 1, ties: list[torch.Tensor] | None = None) -> torch.Tensor | None:
    """MT_STEPS mean-teacher iterations on the CPU in float32, plainly; returns G's adversarial
    gradients at D's input (by step, then by part, concatenated) where D is on, else None.

    The batch in parts: ``train.accumulation_steps`` micro-batches, in turn, from one mixing
    generator; or ``ranks`` DDP shards, each with the generator seeded with its rank. Each part's
    losses count 1/parts of the step's (accumulation divides them, DDP averages the ranks'
    gradients); G and D step once, and the teacher moves once, per step. ``teacher_replicas``: the
    teacher split over a DataParallel replica set, each replica normalising its chunk of a batch
    with that chunk's statistics (with ``teacher_batchnorm: batch``). ``ties``: segadv's pseudo
    labels, one tensor per step and part, checked against the teacher's argmax here and taken
    where its top two probabilities are within ``PSEUDO_LABEL_TIE``."""
    from segadv.data.resumable import derived_seed
    from segadv.methods import mixing

    s, num_classes, ignore = cfg.method.mean_teacher, cfg.data.num_classes, cfg.data.ignore_index
    mean, std = cfg.data.input_normalization.mean, cfg.data.input_normalization.std
    micro_batches = cfg.train.accumulation_steps
    assert ranks == 1 or micro_batches == 1, "the plain loop cuts the batch for DDP or for accumulation, not both"
    parts = ranks * micro_batches
    assert parts == 1 or s.confidence_share == "image", \
        "DACS's batch share over a part is not the batch's: cut batches compare confidence_share=image"
    generators = [torch.Generator().manual_seed(derived_seed(cfg.train.seed, 47, rank))  # the method's, by rank
                  for rank in range(ranks)]
    opt_g = plain_optimizer(g, cfg.optim.generator)
    opt_d = plain_optimizer(d, cfg.optim.discriminator) if d is not None else None
    running = s.teacher_batchnorm == "running"
    adv_grads = []
    theirs = iter(ties) if ties is not None else None
    for step in range(MT_STEPS):
        for opt, own in ((opt_g, cfg.optim.generator), (opt_d, cfg.optim.discriminator)):
            if opt is not None:  # the poly schedule, in closed form
                for group in opt.param_groups:
                    group["lr"] = own.lr * (1 - step / cfg.train.max_steps) ** own.poly_power
                opt.zero_grad()
        for part, rows in enumerate(torch.arange(len(images_l)).chunk(parts)):
            generator = generators[part if ranks > 1 else 0]
            x_l, y_l, x_u, y_gt = (t[rows] for t in (images_l, labels_l, images_u, labels_gt))
            g.train()
            logits_l = g(x_l)
            (F.cross_entropy(logits_l, y_l, ignore_index=ignore) / parts).backward()
            with torch.no_grad():
                teacher.train(not running)
                logits_t = torch.cat([teacher(chunk) for chunk in x_u.chunk(teacher_replicas)])
                probs_t = torch.softmax(logits_t, dim=1)
                confidence, pseudo = probs_t.max(dim=1)
                if theirs is not None:
                    pseudo = broken_ties(probs_t, pseudo, next(theirs))
                mask = mixing.class_mix_mask(y_l, generator, num_classes, ignore)
                mixed = torch.where(mask[:, None], x_l, x_u)
                mixed_labels = torch.where(mask, y_l, pseudo)
                mixed = mixing.dacs_color_jitter(mixed, generator, mean=mean, std=std)
                mixed = mixing.dacs_gaussian_blur(mixed, generator)
                confident = (confidence >= s.dacs_threshold).double()
                over = (1, 2) if s.confidence_share == "image" else (0, 1, 2)  # each image's pixels, or the batch's
                share = confident.mean(dim=over, keepdim=True).float()
                weight = torch.where(mask, torch.ones_like(confidence), share.expand_as(confidence))
            if d is not None:
                probs_u = g(x_u).softmax(dim=1)
                d.requires_grad_(False)
                loss_adv = F.binary_cross_entropy_with_logits(d(probs_u), torch.ones_like(probs_u[:, :1]))
                d.requires_grad_(True)
                loss_adv = method_class("mean_teacher").adversarial_weight(cfg) * loss_adv / parts
                (adv_grad,) = torch.autograd.grad(loss_adv, probs_u, retain_graph=True)  # the gradient at D's input
                adv_grads.append(adv_grad)
                loss_adv.backward()
            per_pixel = F.cross_entropy(g(mixed), mixed_labels, ignore_index=ignore, reduction="none")
            (s.lambda_unsup * (per_pixel * weight).mean() / parts).backward()
            if d is not None:  # AdvSemiSeg's D: G's labeled and unlabeled maps (pre-step) fake, one-hot y_gt real
                valid_l, valid_gt = (y_l != ignore).float(), (y_gt != ignore).float()
                onehot = F.one_hot(y_gt.clamp(0, num_classes - 1), num_classes).permute(0, 3, 1, 2).float()
                fake = torch.cat([logits_l.detach().softmax(dim=1), probs_u.detach()])
                valid_fake = torch.cat([valid_l, torch.ones_like(valid_l)])
                loss_d = 0.5 * (masked_bce(d(fake), 0.0, valid_fake) + masked_bce(d(onehot * valid_gt[:, None]), 1.0,
                                                                                  valid_gt))
                (loss_d / parts).backward()
        opt_g.step()
        decay = min(1 - 1 / (step + 1), s.ema_decay) if s.ema_warmup else s.ema_decay
        with torch.no_grad():  # once per optimizer step
            for t, live in zip(averaged(teacher, running), averaged(g, running)):
                t.copy_(decay * t + (1 - decay) * live)
        if opt_d is not None:
            opt_d.step()
    assert theirs is None or next(theirs, None) is None, "segadv's teacher labelled more batches than the loop"
    return torch.cat(adv_grads) if adv_grads else None


def broken_ties(probs: torch.Tensor, pseudo: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """The plain loop's pseudo labels with its near-ties (top two within ``PSEUDO_LABEL_TIE``) taken
    from segadv's ``theirs``, after checking segadv's: its argmax everywhere else, one of its top two
    at a tie."""
    assert theirs.shape == pseudo.shape, \
        f"segadv's pseudo labels {tuple(theirs.shape)}, the loop's {tuple(pseudo.shape)}"
    top2 = probs.topk(2, dim=1)
    tie = top2.values[:, 0] - top2.values[:, 1] < PSEUDO_LABEL_TIE
    wrong = (theirs != pseudo) & ~tie
    assert not wrong.any(), f"segadv's pseudo labels differ from the teacher's argmax on {int(wrong.sum())} pixels"
    assert ((theirs == top2.indices[:, 0]) | (theirs == top2.indices[:, 1]))[tie].all(), \
        "at a near-tie segadv's pseudo label is neither of the teacher's top two classes"
    return torch.where(tie, theirs, pseudo)


@dataclass
class TeacherOutcome:
    updates: dict[str, dict[str, torch.Tensor]]  # by network: g, teacher (every averaged tensor), d
    adv_grad: torch.Tensor | None
    pseudo_labels: list[torch.Tensor] = field(default_factory=list)  # segadv's, by step and part


def teacher_state(module: nn.Module, running: bool) -> dict[str, torch.Tensor]:
    names = dict(unwrap(module).named_parameters())
    if running:
        names.update((k, v) for k, v in unwrap(module).named_buffers() if v.is_floating_point())
    return {k: v.detach().float().cpu().clone() for k, v in names.items()}


@pytest.fixture(scope="module")
def mt_references():
    cache = {}

    def get(setting: str, freeze_stats: bool, overrides: tuple[str, ...] = (), ranks: int = 1,
            teacher_replicas: int = 1, ties: list[torch.Tensor] | None = None) -> TeacherOutcome:
        """The plain loop's outcome; with segadv's pseudo labels (``ties``) computed afresh."""
        key = (setting, freeze_stats, overrides, ranks, teacher_replicas)
        if ties is not None or key not in cache:
            cfg = mean_teacher_config(setting, *overrides)
            g, d = initial_networks(cfg)
            teacher = no_dropout(build_generator(cfg.model.generator, cfg.data.num_classes))
            teacher.load_state_dict(g.state_dict())
            if freeze_stats:
                freeze_batch_statistics(g)
            d = d if method_class("mean_teacher").adversarial_weight(cfg) > 0 else None
            running = cfg.method.mean_teacher.teacher_batchnorm == "running"
            before = {"g": params(g), "teacher": teacher_state(teacher, running)} | ({"d": params(d)} if d else {})
            adv = reference_mean_teacher(g, teacher, d, *make_mt_batches(cfg), cfg, ranks, teacher_replicas, ties)
            after = {"g": params(g), "teacher": teacher_state(teacher, running)} | ({"d": params(d)} if d else {})
            outcome = TeacherOutcome({n: Moved(before[n], after[n], MT_STEPS) for n in before}, adv)
            if ties is not None:
                return outcome
            cache[key] = outcome
        return cache[key]

    return get


def mt_outcome(case: Case, setting: str) -> TeacherOutcome:
    from segadv.training.build import start_copies

    cfg = mean_teacher_config(setting, *case.overrides)
    init_g, init_d = initial_networks(cfg)
    with batch_statistics_frozen(case.freeze_stats):
        parts = build_training(cfg, parse_device_map(case.device_map))
    unwrap(parts.g.module).load_state_dict(init_g.state_dict())
    if parts.d is not None:
        unwrap(parts.d.module).load_state_dict(init_d.state_dict())
    start_copies(parts)  # the teacher starts as G, after G's initial weights (as the loop)
    teacher = parts.network("teacher")
    no_dropout(parts.g.module)
    no_dropout(teacher.bare)
    if case.freeze_stats:
        freeze_batch_statistics(unwrap(parts.g.module))
    grads: list[torch.Tensor] = []
    if parts.d is not None:
        capture_adversarial_gradient(parts.d.module, grads)
    running = cfg.method.mean_teacher.teacher_batchnorm == "running"
    seen = record_pseudo_labels(parts.method)
    nets = {"g": parts.g.module} | ({"d": parts.d.module} if parts.d is not None else {})
    before = {n: params(m) for n, m in nets.items()} | {"teacher": teacher_state(teacher.bare, running)}
    scale = parts.g.opt.loss_scale()
    images_l, labels_l, images_u, labels_gt = make_mt_batches(cfg)
    labeled, unlabeled = ("source", "target") if cfg.target_data is not None else ("labeled", "unlabeled")
    streams = {labeled: FixedStream((images_l, labels_l)), unlabeled: FixedStream(images_u),
               "gt": FixedStream((images_l, labels_gt))}
    for step in range(MT_STEPS):
        parts.step(streams, step=step)
    after = {n: params(m) for n, m in nets.items()} | {"teacher": teacher_state(teacher.bare, running)}
    # One adversarial gradient per micro-batch, in step order: the plain loop's parts.
    return TeacherOutcome({n: Moved(before[n], after[n], MT_STEPS) for n in before},
                          torch.cat(grads) / scale if grads else None, seen)


def record_pseudo_labels(method) -> list[torch.Tensor]:
    """The pseudo labels ``method`` (a MeanTeacher) hands its mixing, on the host, one per call."""
    seen: list[torch.Tensor] = []
    labels = method.pseudo_labels

    def recorded(images):
        pseudo, confidence = labels(images)
        seen.append(pseudo.detach().cpu())
        return pseudo, confidence

    method.pseudo_labels = recorded
    return seen


def assert_mt_equivalent(case: Case, setting: str, got: TeacherOutcome, ref: TeacherOutcome) -> dict[str, float]:
    assert got.updates.keys() == ref.updates.keys()
    assert ("d" in got.updates) == (setting == "semi-adv")  # D built only where lambda_adv > 0
    pairs = {name: (got.updates[name], ref.updates[name]) for name in ref.updates}
    for name, (a, b) in pairs.items():
        assert a.keys() == b.keys(), name
        assert flat(b).abs().max() > 0, f"the reference's {name} did not move"
    if ref.adv_grad is not None:
        assert got.adv_grad is not None and flat(got.adv_grad).abs().max() > 0, "G's adversarial gradient is zero"
        pairs["adversarial gradient"] = (got.adv_grad, ref.adv_grad)
    return within_tolerance(case, pairs)


@pytest.mark.parametrize("setting, case", [pytest.param(s, c, id=f"{s}-{c.name}", marks=list(c.marks))
                                           for s, c in MT_CASES])
def test_mean_teacher_iterations_match_the_plain_float32_loop(setting, case, mt_references, no_tf32):
    got = mt_outcome(case, setting)
    # A DataParallel replica set for the teacher (G's, where the map leaves it out) splits its batch:
    # each replica's BatchNorm statistics are its chunk's (parsed here: the map names GPUs).
    replicas = len(parse_device_map(case.device_map).devices_of("teacher"))
    # In float32 the loop holds segadv's pseudo labels to its argmax and takes its near-ties (PSEUDO_LABEL_TIE);
    # under reduced precision labels flip anyway, and the cosine comparison allows for it.
    ties = got.pseudo_labels if case.float32 else None
    ref = mt_references(setting, case.freeze_stats, mt_reference_overrides(case), teacher_replicas=replicas, ties=ties)
    print(f"mean_teacher {setting} {case.name}: {assert_mt_equivalent(case, setting, got, ref)}")


# Two gloo processes, each with half of every batch, against the plain loop cut into the ranks'
# halves (each rank's mixing generator is seeded with its rank; the confidence counted per image:
# see MT_PER_IMAGE). Only the comparison with the plain loop is here: that the ranks hold one
# teacher bitwise is tests/parallel/test_distributed.py's.
MT_DDP_CASES = [pytest.param("semi-adv", id="ddp-gloo-cpu-semi-adv"),
                pytest.param("adaptation", id="ddp-gloo-cpu-adaptation")]


@pytest.mark.parametrize("setting", MT_DDP_CASES)
def test_ddp_mean_teacher_on_two_processes_matches_the_plain_loop(tmp_path, mt_references, setting):
    overrides = (MT_PER_IMAGE,)
    cfg = mean_teacher_config(setting, *overrides)
    init_g, init_d = initial_networks(cfg)
    images_l, labels_l, images_u, labels_gt = make_mt_batches(cfg)
    has_d = method_class("mean_teacher").adversarial_weight(cfg) > 0
    torch.save({"g": init_g.state_dict(), **({"d": init_d.state_dict()} if has_d else {}), "images": images_l,
                "labels": labels_l, "images_u": images_u, "labels_gt": labels_gt}, tmp_path / "input.pt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(HERE / "equivalence_worker.py"), str(tmp_path), "cpu", *MT_OVERRIDES, *MT_SETTINGS[setting], *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    nets = ("g", "d") if has_d else ("g",)
    for net in nets:  # DDP keeps the ranks identical
        assert all(torch.equal(ranks[0][net][k], ranks[1][net][k]) for k in ranks[0][net]), net
    running = cfg.method.mean_teacher.teacher_batchnorm == "running"
    starts = {"g": params(init_g), "teacher": teacher_state(init_g, running)} | ({"d": params(init_d)} if has_d else {})
    updates = {net: Moved(start, ranks[0][net], MT_STEPS) for net, start in starts.items()}
    adv_grad = None
    if has_d:  # each rank's adversarial loss is a mean over its half: the full batch's gradient is half of it
        by_rank = [r["adv_grad"].chunk(MT_STEPS) for r in ranks]
        adv_grad = torch.cat([by_rank[r][step] for step in range(MT_STEPS) for r in (0, 1)]) / 2
    ties = [ranks[r]["pseudo_labels"][step] for step in range(MT_STEPS) for r in (0, 1)]  # the loop's order of parts
    case = Case("ddp", "cpu", overrides, split_batch=True)
    ref = mt_references(setting, True, overrides, ranks=2, ties=ties)
    print(f"mean_teacher ddp {setting}: {assert_mt_equivalent(case, setting, TeacherOutcome(updates, adv_grad), ref)}")
