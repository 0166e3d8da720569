"""Segmentation metrics from a confusion matrix (as in torchvision's references/segmentation)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from segadv.engine.proxies import ProxyMeter, Realness
from segadv.models.generator import logits_at
from segadv.parallel.placement import to_device, unwrap


class ConfusionMatrix:
    """Rows: ground truth, columns: prediction. Ignored pixels (any id outside [0, C)) are skipped."""

    def __init__(self, num_classes: int, device: torch.device | str = "cpu") -> None:
        self.num_classes = num_classes
        self.mat = torch.zeros((num_classes, num_classes), dtype=torch.int64, device=device)

    def update(self, target: torch.Tensor, pred: torch.Tensor) -> None:
        """Fixed shapes only (no boolean indexing, no bincount, whose output sizes hang on the
        values): no host synchronisation per batch on a GPU, and segadv-plan can run it."""
        n = self.num_classes
        target, pred = target.to(torch.int64), pred.to(torch.int64)
        keep = (target >= 0) & (target < n)
        index = torch.where(keep, n * target + pred, n * n).flatten()  # n * n: the ignored pixels' bin
        counts = torch.zeros(n * n + 1, dtype=torch.int64, device=index.device)
        counts.scatter_add_(0, index, torch.ones_like(index))
        self.mat += counts[: n * n].reshape(n, n).to(self.mat.device)

    def all_reduce(self) -> None:
        """Sum over ranks, so distributed eval equals single-process eval on the same data."""
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(self.mat)

    def compute(self) -> dict[str, object]:
        mat = self.mat.double().cpu()
        true_pos = mat.diag()
        union = mat.sum(0) + mat.sum(1) - true_pos
        iou = true_pos / union  # nan for a class absent from both prediction and ground truth
        total = mat.sum()
        return {
            "mIoU": float(iou.nanmean()) if total > 0 else 0.0,
            "pixel_acc": float(true_pos.sum() / total) if total > 0 else 0.0,
            "iou": [float(v) for v in iou],
        }


@dataclass
class EvalResult:
    confusion: ConfusionMatrix = field(repr=False)
    # First few val samples for image panels: normalised images, labels, predictions (CPU).
    samples: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    meter: ProxyMeter | None = field(default=None, repr=False)  # the label-free scores, where asked for

    @cached_property
    def metrics(self) -> dict[str, object]:
        """mIoU, pixel accuracy and per-class IoU, read to the host when first asked for."""
        return self.confusion.compute()

    @cached_property
    def proxies(self) -> dict[str, float]:
        """The label-free scores (segadv/engine/proxies.py) by ``proxy/<name>``, read to the host
        when first asked for; {} where not asked for."""
        return self.meter.compute() if self.meter is not None else {}

    @cached_property
    def matrix(self) -> torch.Tensor:
        """The confusion matrix on the host (int64 pixel counts; rows: ground truth, columns:
        prediction): segadv-eval --json and the training run's TensorBoard image show it."""
        return self.confusion.mat.cpu()

    @cached_property
    def absent_classes(self) -> list[int]:
        """Classes with no ground-truth pixel in what was evaluated: mIoU cannot measure them."""
        return torch.nonzero(self.confusion.mat.sum(1).cpu() == 0).flatten().tolist()


@torch.no_grad()
def evaluate(
    generator: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    num_classes: int,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
    num_samples: int = 0,
    track: Callable[[Iterable], Iterable] | None = None,
    sink: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    proxies: bool = False,
    realness: Realness | None = None,
    resize_to_multiple: bool = False,
) -> EvalResult:
    """``track``: wraps the loader (a progress bar, segadv/monitor/progress.py). ``sink``: called
    with each batch's ``(labels, predictions)`` as scored, in the loader's order (segadv-eval
    --show-dir writes them). ``proxies``: also the label-free scores, from the images and G's
    logits alone (``realness``: D's view of them, for ``proxy/d_confidence``).
    ``resize_to_multiple`` (``data.val_resize_to_multiple``): G sees each image resized to the
    nearest multiple of its input divisor (:func:`resized_to_multiple`), the proxies' views too."""
    was_training = generator.training
    generator.eval()
    confmat = ConfusionMatrix(num_classes, device)
    samples = None
    network = unwrap(generator)  # its class says how G's logits reach the label's size (logits_at)
    divisor = network.input_divisor()

    def predict(x: torch.Tensor, size) -> torch.Tensor:
        if resize_to_multiple:
            x = resized_to_multiple(x, divisor)  # outside autocast: in the images' float32, as the reference
        with autocast():
            return logits_at(generator, network, x, size)

    meter = ProxyMeter(predict, device, realness=realness, divisor=divisor) if proxies else None
    try:
        for images, labels in (loader if track is None else track(loader)):
            images, labels = to_device(images, device), to_device(labels, device)
            # At the label's size: larger than the image's where data.val_input_size resized the image
            # alone, or back from G's input where it was resized to a multiple; the label is scored as it is.
            logits = predict(images, labels.shape[-2:])
            pred = logits.argmax(dim=1)
            if meter is not None:
                meter.update(images, logits)  # the images and G's logits: no label
            del logits  # G's output is the batch's largest tensor: gone before the next forward
            confmat.update(labels, pred)
            if sink is not None:
                sink(labels, pred)
            if samples is None and num_samples > 0:
                # Copies of k samples: views (what .cpu() gives on the CPU) would hold the whole batch.
                k = min(num_samples, images.shape[0])
                samples = tuple(t[:k].to("cpu", copy=True) for t in (panel_inputs(images[:k], labels), labels, pred))
            del images, labels, pred  # nothing of this batch lives on while the next one runs
    finally:
        generator.train(was_training)
    confmat.all_reduce()
    if meter is not None:
        meter.all_reduce()
    return EvalResult(confmat, samples, meter)


def resized_to_multiple(images: torch.Tensor, divisor: int) -> torch.Tensor:
    """``images`` with each side resized to the nearest multiple of ``divisor`` (halves rounded up,
    at least one multiple), bilinearly with ``align_corners=True``: UniMatch V2's evaluation
    (LiheYoung/UniMatch-V2 supervised.py ``evaluate``, lines 70-81, ``multiplier=14``), whose logits
    go back to the image's size bilinearly with ``align_corners=True`` too (``logits_at``)."""
    size = tuple(max(1, int(side / divisor + 0.5)) * divisor for side in images.shape[-2:])
    if size == tuple(images.shape[-2:]):
        return images
    return F.interpolate(images, size=size, mode="bilinear", align_corners=True)


def panel_inputs(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The panel's input images at their labels' size (a panel's tiles share one size): resized
    back where ``data.val_input_size`` predicted at a smaller input; only the panel's few samples."""
    images = images.float()
    if images.shape[-2:] == labels.shape[-2:]:
        return images
    return F.interpolate(images, size=labels.shape[-2:], mode="bilinear", align_corners=False)
