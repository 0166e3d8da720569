"""The step's hot path: no host sync, and no asynchronous copy the host could read too early.

On the CPU a host sync cannot be observed directly, so the step is run under a TorchFunctionMode
that fails on every call that reads a tensor's value on the host (``.item()``, ``.tolist()``,
``bool()``, ``float()``, ``int()``). The optimizers' own ``step()`` is exempt: the ``.item()`` calls
there read the CPU step counters torch keeps for every device, which never waits for a GPU. With
float16 the GradScalers' inf check is one allowed, documented sync per scaled network. On CUDA the
profiler counts real synchronisations.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from segadv.training.build import build_training
from segadv.config import load_config
from segadv.parallel import parse_device_map, to_device

from conftest import TINY_OVERRIDES
from helpers import FixedStream, NoHostReads, batch, exempt_optimizer_steps


@pytest.mark.parametrize("bfloat16", [False, True], ids=["float32", "bfloat16"])
def test_step_reads_nothing_on_the_host(tiny_cfg, bfloat16):
    tiny_cfg.amp.generator.enabled = tiny_cfg.amp.discriminator.enabled = bfloat16
    parts = build_training(tiny_cfg, parse_device_map("cpu"))
    mode = NoHostReads()
    exempt_optimizer_steps(parts, mode)
    images, labels = batch(tiny_cfg)
    with mode:
        for step in range(2):
            parts.method.iteration(images, labels, step=step)


def test_the_guard_catches_an_item_call(tiny_cfg, monkeypatch):
    from segadv.methods import adversarial as step_module

    real = step_module.masked_bce_with_logits

    def with_item(logits, target, valid):
        loss = real(logits, target, valid)
        loss.item()  # a per-step log line would do this
        return loss

    monkeypatch.setattr(step_module, "masked_bce_with_logits", with_item)
    parts = build_training(tiny_cfg, parse_device_map("cpu"))
    mode = NoHostReads()
    exempt_optimizer_steps(parts, mode)
    with pytest.raises(AssertionError, match="item"), mode:
        parts.method.iteration(*batch(tiny_cfg), step=0)


class RecordCopies(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.non_blocking_to_cpu = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and kwargs.get("non_blocking"):
            target = next((a for a in args[1:] if isinstance(a, (torch.device, str))), kwargs.get("device"))
            if target is not None and torch.device(target).type == "cpu":
                self.non_blocking_to_cpu.append(target)
        return func(*args, **kwargs)


def test_no_copy_to_the_cpu_is_non_blocking(tiny_cfg):
    """A non-blocking CUDA->CPU copy returns before its data arrives; the host reads it at once.
    Every copy the step makes towards the CPU must block (the CPU map makes the same calls)."""
    parts = build_training(tiny_cfg, parse_device_map("cpu"))
    with RecordCopies() as copies:
        parts.method.iteration(*batch(tiny_cfg), step=0)
    assert copies.non_blocking_to_cpu == []


def test_to_device_is_asynchronous_only_towards_cuda():
    with RecordCopies() as copies:
        to_device(torch.ones(2), torch.device("cpu"))
    assert copies.non_blocking_to_cpu == []


@pytest.mark.cuda
@pytest.mark.parametrize("spec", ["g:cuda:0,d:cuda:0", "g:cuda:0,d:cpu"])
def test_step_makes_no_cuda_sync(tiny_cfg, spec):
    """Counted by the profiler inside the iteration's own span (the profiler synchronises the
    device when it stops): no stream/device synchronisation and no blocking device-to-host copy in
    a bfloat16 step on the GPU. The map with D on the CPU has exactly its three blocking copies by
    design: G's maps to D, the adversarial loss back to G's device, and its gradient back in G's
    backward."""
    from torch.profiler import ProfilerActivity, profile, record_function

    tiny_cfg.amp.generator.enabled = True  # bfloat16: no scaler
    parts = build_training(tiny_cfg, parse_device_map(spec))
    images, labels = batch(tiny_cfg)
    parts.method.iteration(images, labels, step=0)  # warm-up (cuDNN autotuning, allocator)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        with record_function("segadv_iteration"):
            parts.method.iteration(images, labels, step=1)
    syncs = syncs_within(prof.events(), "segadv_iteration")
    if spec.endswith("d:cpu"):
        assert len(syncs) <= 3, syncs
    else:
        assert syncs == [], syncs


SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def syncs_within(events, span_name: str) -> list[str]:
    """The synchronising CUDA calls that start inside the span named ``span_name``, each with the
    innermost segadv frame of its stack (when the profiler recorded one)."""
    span = next(e for e in events if e.name == span_name)
    inside = [e for e in events if e.name in SYNCS and span.time_range.start <= e.time_range.start <= span.time_range.end]
    return [f"{e.name} at {next((f for f in (e.stack or []) if 'segadv' in f), '?')}" for e in inside]


def semi_iterations(overrides, bfloat16):
    """Two iterations of a semi-supervised method on fixed streams, under NoHostReads; their last output."""
    return semi_run(overrides, bfloat16)[1]


def semi_run(overrides, bfloat16):
    """``semi_iterations``: the run's parts and the last output."""
    cfg = load_config(None, [*TINY_OVERRIDES, *overrides])
    cfg.amp.generator.enabled = cfg.amp.discriminator.enabled = bfloat16
    parts = build_training(cfg, parse_device_map("cpu"))
    images, labels = batch(cfg, n=cfg.data.batch_size)
    streams = {"labeled": FixedStream((images, labels)), "unlabeled": FixedStream(images),
               "gt": FixedStream((images, labels))}
    mode = NoHostReads()
    exempt_optimizer_steps(parts, mode)
    with mode:
        for step in range(2):
            out = parts.step(streams, step=step)
    return parts, out


@pytest.mark.parametrize("bfloat16", [False, True], ids=["float32", "bfloat16"])
def test_advsemiseg_iteration_reads_nothing_on_the_host(bfloat16):
    """Every AdvSemiSeg term on (pseudo labels, confidence mask, pixel ratio stay on the device)."""
    out = semi_iterations(["method.name=advsemiseg", "method.advsemiseg.semi_start=0"], bfloat16)
    assert set(out) >= {"loss_semi", "loss_semi_adv", "semi_pixel_ratio"}


@pytest.mark.parametrize("bfloat16", [False, True], ids=["float32", "bfloat16"])
def test_accumulation_and_checkpointing_read_nothing_on_the_host(bfloat16):
    """Two micro-batches per step (the losses averaged on the device) and G's recompute in the backward."""
    out = semi_iterations(["method.name=advsemiseg", "method.advsemiseg.semi_start=0", "data.batch_size=4",
                           "train.accumulation_steps=2", "model.generator.activation_checkpointing=true"], bfloat16)
    assert set(out) >= {"loss_semi", "loss_semi_adv", "semi_pixel_ratio"}


@pytest.mark.parametrize("bfloat16", [False, True], ids=["float32", "bfloat16"])
def test_s4gan_iteration_reads_nothing_on_the_host(bfloat16):
    """Every s4GAN term on (the image selection, the pseudo labels and D's accuracies stay on the device)."""
    out = semi_iterations(["method.name=s4gan", "model.discriminator.kind=image", "method.s4gan.st_start=0",
                           "method.s4gan.threshold=0.0"], bfloat16)
    assert set(out) >= {"loss_fm", "loss_st", "st_image_ratio", "d_acc_real", "d_acc_fake"}
    assert out["st_image_ratio"].item() == 1.0 and out["loss_st"].item() > 0


@pytest.mark.parametrize("bfloat16", [False, True], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("extra", [[], ["loss.lambda_adv=0.01"]], ids=["no-d", "d-on-top"])
def test_mean_teacher_iteration_reads_nothing_and_keeps_its_mixed_batch_by_reference(bfloat16, extra, monkeypatch):
    """The mean teacher's step (the teacher's pseudo labels, the mix, the confidence weight, the
    EMA, D on top) reads nothing on the host, and the mixed batch it offers TensorBoard
    (``training_views``) is the tensors its loss read, not a copy: the step pays nothing for the
    panel, which is drawn (and copied to the host) only at an evaluation."""
    from segadv.methods import mixing
    from segadv.methods.mean_teacher.iteration import MeanTeacher

    read, student_inputs = [], []
    real_loss, real_student = mixing.pixel_weighted_cross_entropy, MeanTeacher.student

    def loss(logits, labels, weight, ignore_index):
        read.append((labels, weight))
        return real_loss(logits, labels, weight, ignore_index)

    def student(self, images):
        student_inputs.append(images)
        return real_student(self, images)

    monkeypatch.setattr(mixing, "pixel_weighted_cross_entropy", loss)
    monkeypatch.setattr(MeanTeacher, "student", student)
    parts, out = semi_run(["method.name=mean_teacher", *extra], bfloat16)
    assert set(out) >= {"loss_seg", "loss_unsup", "pseudo_confidence"}
    with NoHostReads():
        views = parts.method.training_views()
    labels, weight = read[-1]
    mixed = student_inputs[-1]  # the last forward of the step: the mixed images
    for kept, used in ((views.images, mixed), (views.labels, labels), (views.weight, weight)):
        assert kept.data_ptr() == used.data_ptr() and kept.shape == used.shape and not kept.requires_grad
    assert views.tag == "train/mixed_batch" and views.labels.dtype == torch.long
