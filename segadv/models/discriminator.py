"""The discriminators D (``model.discriminator.kind``): AdvSemiSeg's fully convolutional one (Hung
et al., 2018), which scores a class-probability map per pixel, real (one-hot ground truth) vs fake
(softmax of G); s4GAN's image-level one (Mittal et al., 2019), which scores an image with its class
maps as a whole.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from segadv.config.schema import DiscriminatorConfig
from segadv.errors import UserError


def check_map_size(x: torch.Tensor, depth: int) -> None:
    """D's input against its depth, where no config told the training size up front (images of
    their own sizes): a shape check on the host, as smp's G makes, naming the key instead of
    convolution's "kernel size can't be greater than actual input size"."""
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return
    side = min(x.shape[-2:])
    if side >> depth < 1:
        raise UserError(
            f"model.discriminator.num_downsamples (or discriminator_aux's): {depth} stride-2 convolutions leave "
            f"no cell of a {side}-pixel side of D's input {tuple(x.shape[-2:])}; at most {side.bit_length() - 1} "
            "fit, or train on larger images")


class FCDiscriminator(nn.Module):
    """``num_downsamples`` 4x4 stride-2 convolutions, LeakyReLU(0.2) between them, no
    normalisation. The reference's five: C -> ndf -> 2ndf -> 4ndf -> 8ndf -> 1; with fewer the
    last ones go (three: C -> ndf -> 2ndf -> 1), with more the width stays at 8ndf.

    Each convolution halves the size (rounded down), so D's logit map is the input halved
    ``num_downsamples`` times (five: 10x10 at 321 px, 2x2 at 80 px; three: 10x10 at 80 px), and
    each logit sees a window 1 + 3 * (2**num_downsamples - 1) pixels wide (five: 94). The map is
    upsampled back to the input (label) size, bilinearly; ``align_corners`` True as the reference
    does (hfslyc/AdvSemiSeg's ``interp``)."""

    def __init__(self, num_classes: int, ndf: int = 64, num_downsamples: int = 5, align_corners: bool = True) -> None:
        super().__init__()
        self.align_corners = align_corners
        widths = [num_classes] + [ndf * 2 ** min(i, 3) for i in range(num_downsamples - 1)]
        self.features = nn.ModuleList(
            nn.Conv2d(c_in, c_out, kernel_size=4, stride=2, padding=1)
            for c_in, c_out in zip(widths[:-1], widths[1:])
        )
        self.classifier = nn.Conv2d(widths[-1], 1, kernel_size=4, stride=2, padding=1)

    def forward(self, probs: torch.Tensor) -> torch.Tensor:
        check_map_size(probs, len(self.features) + 1)
        x = probs
        for conv in self.features:
            x = F.leaky_relu(conv(x), negative_slope=0.2)
        logits = self.classifier(x)
        return F.interpolate(logits, size=probs.shape[-2:], mode="bilinear", align_corners=self.align_corners)


IMAGE_CHANNELS = 3  # RGB: what the image-level D reads besides the class maps


class ImageDiscriminator(nn.Module):
    """s4GAN's D: ``num_downsamples`` 4x4 stride-2 convolutions (ndf, 2ndf, 4ndf, 8ndf, then 8ndf)
    with LeakyReLU(0.2), Dropout2d(0.5) after each but the last, global average pooling and a
    linear layer to one logit per image.

    Its input is C class maps (softmax or one-hot) and the image, concatenated on channels:
    ``num_classes + 3`` channels. ``forward`` returns the (N,1) logits; with
    ``return_features``, also the pooled (N,8ndf,1,1) features (feature matching). Logits, not the
    reference's sigmoid: the losses take BCE with logits, numerically safe in reduced precision.
    """

    def __init__(self, num_classes: int, ndf: int = 64, num_downsamples: int = 4) -> None:
        super().__init__()
        widths = [num_classes + IMAGE_CHANNELS] + [ndf * 2 ** min(i, 3) for i in range(num_downsamples)]
        self.features = nn.ModuleList(
            nn.Conv2d(c_in, c_out, kernel_size=4, stride=2, padding=1)
            for c_in, c_out in zip(widths[:-1], widths[1:])
        )
        self.dropout = nn.Dropout2d(0.5)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(widths[-1], 1)

    def forward(
        self, x: torch.Tensor, return_features: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        check_map_size(x, len(self.features))
        for i, conv in enumerate(self.features):
            x = F.leaky_relu(conv(x), negative_slope=0.2)
            if i < len(self.features) - 1:
                x = self.dropout(x)
        features = self.pool(x)
        logits = self.classifier(features.flatten(1))
        return (logits, features) if return_features else logits


DISCRIMINATORS: dict[str, type[nn.Module]] = {"fc": FCDiscriminator, "image": ImageDiscriminator}
DEFAULT_DOWNSAMPLES = {"fc": 5, "image": 4}  # each reference's


def downsamples(cfg: DiscriminatorConfig) -> int:
    """D's stride-2 convolutions: ``num_downsamples``, or its kind's reference."""
    return DEFAULT_DOWNSAMPLES[cfg.kind] if cfg.num_downsamples is None else cfg.num_downsamples


def check_input_side(cfg: DiscriminatorConfig, side: int, key: str, source: str) -> None:
    """Each 4x4 stride-2 convolution (padding 1) halves a side, rounding down: D's deepest map
    must keep at least one cell of the smallest side it is given (``source`` says where it comes
    from). ``key``: D's section, named in the error."""
    depth = downsamples(cfg)
    if side >> depth < 1:
        most = side.bit_length() - 1
        raise UserError(
            f"{key}.num_downsamples: {depth} stride-2 convolutions leave no cell of a {side}-pixel side "
            f"({source}); at most {most} fit, or train on larger images")


def build_discriminator(cfg: DiscriminatorConfig, num_classes: int) -> nn.Module:
    try:
        cls = DISCRIMINATORS[cfg.kind]
    except KeyError:
        raise KeyError(f"unknown discriminator {cfg.kind!r}; valid: {sorted(DISCRIMINATORS)}") from None
    depth = downsamples(cfg)
    upsampling = {"align_corners": cfg.align_corners} if cfg.kind == "fc" else {}
    return cls(num_classes=num_classes, ndf=cfg.ndf, num_downsamples=depth, **upsampling)
