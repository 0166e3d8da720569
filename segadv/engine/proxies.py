"""Label-free scores of G at an evaluation (``proxy/*``): what a run without target labels can
choose its checkpoint by (``checkpoint.best_by``; docs/training.md "Choosing a checkpoint without
labels"). Computed from the val images alone; no label reaches this module.

- ``entropy``: the mean over pixels of the entropy of G's softmax, divided by log(C) (0: certain,
  1: uniform). Lower is better (ADVENT's premise: low target entropy goes with accuracy).
- ``flip_agreement``: the share of pixels whose argmax is the same on the image and, flipped
  back, on its horizontal mirror. Higher is better.
- ``scale_agreement``: the same against the image at 0.75 of its size (rounded down to the
  multiple of 8, 16, ... that G's input needs, and no smaller than one), G's logits resampled to
  the full size. Higher is better.
- ``snd``: soft neighborhood density (Saito et al., ICCV 2021, "Tune it the Right Way:
  Unsupervised Validation of Domain Adaptation via Soft Neighborhood Density";
  VisionLearningGroup/SND, transcribed in KevinMusgrave/pytorch-adapt's ``SNDValidator``): over
  L2-normalised softmax vectors, the cosine similarity of each to the others (itself left out)
  divided by a temperature of 0.05, a softmax per row, and the mean entropy of those rows. The
  paper scores image classifiers; here the vectors are ``snd_pixels`` pixels drawn from the val
  maps with a fixed seed (the same pixels at every evaluation of a run). Higher is better.
- ``d_confidence``: D's mean probability that G's maps of the val images are on the side G is
  trained to imitate (ground truth in AdvSemiSeg, the source in AdaptSegNet: "real"), where the
  method has a D (``Method.discriminator_realness``). Higher is better.

Each score is a sum and a count on the device, summed over DDP ranks like the confusion matrix;
SND is each rank's over its own pixels, averaged over ranks.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

SND_TEMPERATURE = 0.05  # Saito et al.'s and pytorch-adapt's
SCALE = 0.75  # the rescaled view's size, of the image's

# (images, output size) -> G's logits at that size, as evaluation calls G
Predict = Callable[[torch.Tensor, Sequence[int]], torch.Tensor]
# (images, G's logits) -> D's probability of "real" per D output, or None without a D
Realness = Callable[[torch.Tensor, torch.Tensor], Optional[torch.Tensor]]


def soft_neighborhood_density(probs: torch.Tensor, temperature: float = SND_TEMPERATURE) -> torch.Tensor:
    """SND of (N, C) probability vectors: the mean entropy of each vector's softmax over its
    cosine similarities to the others (itself excluded) divided by ``temperature``. 0-dim float32."""
    normed = F.normalize(probs.float(), dim=1)
    sim = normed @ normed.t() / temperature
    sim.fill_diagonal_(float("-inf"))
    p = sim.softmax(dim=1)
    return -(p * torch.log(p + 1e-5)).sum(dim=1).mean()


class ProxyMeter:
    """The label-free scores over one evaluation's batches: ``update(images, logits)`` with each
    batch's images and G's logits (computed once, by the evaluation), ``compute()`` at the end."""

    def __init__(self, predict: Predict, device: torch.device | str, *, snd_pixels: int = 1024,
                 realness: Optional[Realness] = None, seed: int = 0, divisor: int = 1) -> None:
        """``divisor``: what G's input height and width must be multiples of (smp's encoders:
        their output stride)."""
        self.predict, self.realness, self.snd_pixels, self.divisor = predict, realness, snd_pixels, divisor
        self.sums = torch.zeros(5, dtype=torch.float64, device=device)  # entropy, flip, scale, d, snd
        self.counts = torch.zeros(5, dtype=torch.float64, device=device)
        self.snd_vectors: list[torch.Tensor] = []
        self.snd_taken = 0
        self.rng = torch.Generator(device="cpu").manual_seed(seed)  # the same pixels every evaluation

    def update(self, images: torch.Tensor, logits: torch.Tensor) -> None:
        size = logits.shape[-2:]
        probs = logits.float().softmax(dim=1)
        pred = probs.argmax(dim=1)
        num_classes = probs.shape[1]
        entropy = -(probs * torch.log(probs.clamp_min(1e-12))).sum(dim=1) / math.log(num_classes)
        flipped = self.predict(images.flip(-1), size).flip(-1).argmax(dim=1)
        small = F.interpolate(images, size=self.smaller(images.shape[-2:]), mode="bilinear", align_corners=False)
        rescaled = self.predict(small, size).argmax(dim=1)
        pixels = float(pred.numel())
        self.sums[0] += entropy.sum().double()
        self.sums[1] += (flipped == pred).sum().double()
        self.sums[2] += (rescaled == pred).sum().double()
        self.counts[:3] += pixels
        if self.realness is not None:
            real = self.realness(images, logits)
            if real is not None:
                self.sums[3] += real.double().sum().to(self.sums.device)
                self.counts[3] += float(real.numel())
        self._sample(probs)

    def smaller(self, size: Sequence[int]) -> tuple[int, int]:
        """The rescaled view's size: ``SCALE`` of ``size``, down to a multiple of ``divisor``."""
        d = self.divisor
        return tuple(max(d, int(n * SCALE) // d * d) for n in size)  # type: ignore[return-value]

    def _sample(self, probs: torch.Tensor) -> None:
        """Up to ``snd_pixels`` softmax vectors in all, a few from each batch, at pixels drawn
        from the meter's own generator (the batch's share of what is left)."""
        left = self.snd_pixels - self.snd_taken
        if left <= 0:
            return
        vectors = probs.permute(0, 2, 3, 1).reshape(-1, probs.shape[1])
        take = min(left, vectors.shape[0], max(1, self.snd_pixels // 8))
        index = torch.randperm(vectors.shape[0], generator=self.rng)[:take].to(vectors.device)
        self.snd_vectors.append(vectors.index_select(0, index))
        self.snd_taken += take

    def all_reduce(self) -> None:
        """The evaluation's end, on the device: SND of the pixels drawn, every sum over DDP ranks
        (each rank calls it once, as the confusion matrix's)."""
        if self.snd_taken > 1:
            self.sums[4] += soft_neighborhood_density(torch.cat(self.snd_vectors)).double()
            self.counts[4] += 1.0
        self.snd_vectors = []
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(self.sums)
            dist.all_reduce(self.counts)

    def compute(self) -> dict[str, float]:
        """``proxy/<name>`` by name, read to the host after :meth:`all_reduce`;
        ``proxy/d_confidence`` only with a D."""
        sums, counts = self.sums.cpu().tolist(), self.counts.cpu().tolist()
        names = ("entropy", "flip_agreement", "scale_agreement", "d_confidence", "snd")
        return {f"proxy/{name}": s / c for name, s, c in zip(names, sums, counts) if c > 0}
