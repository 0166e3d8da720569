"""UniMatch's DeepLabV3+ (``model.generator.arch: deeplabv3plus_unimatch``): the head of
LiheYoung/UniMatch ``model/semseg/deeplabv3plus.py`` (``DeepLabV3Plus``, ``ASPPModule``) on an smp
encoder, the network UniMatch V1's loop assumes.

smp's DeepLabV3Plus differs from it in ways smp's keywords reach only in part:

- a ``Dropout(0.5)`` after the ASPP projection (``decoder_aspp_dropout``, reachable). In train mode
  it makes V1's weak-view forward, whose argmax are the pseudo labels, a random draw; the
  reference's forward is deterministic.
- separable 3x3 convolutions in the ASPP (``decoder_aspp_separable``, reachable);
- a separable 3x3 conv-BN-ReLU after the ASPP and a single separable 3x3 fuse block, where the
  reference has no conv after the ASPP and fuses with two plain 3x3 conv-BN-ReLU (not reachable);
- the ASPP output upsampled by a fixed factor (4 or 2), the logits by 4: sides must be multiples of
  the encoder's stride. The reference resizes to the stride-4 map's and to the input's size
  (``align_corners=True``), so it takes any size (UniMatch crops 321 and 801 px).

Its modules keep the reference's names under ``decoder`` (``aspp`` is the reference's ``head``),
so a reference state dict maps onto it by prefix. Widths: the reference's ASPP is 2048 // 8 = 256
wide and its fuse 256, both ``model.generator.decoder_channels`` here (default 256).
"""

from __future__ import annotations

from typing import List, Sequence

import torch
import torch.nn.functional as F
from segmentation_models_pytorch.encoders import get_encoder
from torch import nn

from segadv.models.deeplab.base import DeepLabGenerator
from segadv.models.features import FeatureScalingMixin

LOW_LEVEL_CHANNELS = 48  # the reference's reduce of the stride-4 map (the DeepLabV3+ paper's)
LOW_LEVEL_STAGE = 2  # smp's encoders hand the input first, then stride 2, 4, ...: the reference's c1


def conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1) -> nn.Sequential:
    """A plain convolution (no bias), BatchNorm, ReLU: every block of the reference's head."""
    padding = dilation * (kernel_size // 2)
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, dilation=dilation, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class ASPPPooling(nn.Module):
    """The image-pooling branch: global average, 1x1 conv-BN-ReLU, spread back over the map."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.gap = nn.Sequential(nn.AdaptiveAvgPool2d(1), *conv_bn_relu(in_channels, out_channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.gap(x), size=x.shape[-2:], mode="bilinear", align_corners=True)


class ASPP(nn.Module):
    """The reference's ``ASPPModule``: a 1x1 branch, three dilated 3x3 branches, image pooling, all
    plain conv-BN-ReLU, concatenated and projected by a 1x1 conv-BN-ReLU (no dropout)."""

    def __init__(self, in_channels: int, out_channels: int, atrous_rates: Sequence[int]) -> None:
        super().__init__()
        rate1, rate2, rate3 = atrous_rates
        self.b0 = conv_bn_relu(in_channels, out_channels, 1)
        self.b1 = conv_bn_relu(in_channels, out_channels, 3, rate1)
        self.b2 = conv_bn_relu(in_channels, out_channels, 3, rate2)
        self.b3 = conv_bn_relu(in_channels, out_channels, 3, rate3)
        self.b4 = ASPPPooling(in_channels, out_channels)
        self.project = conv_bn_relu(5 * out_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = [self.b0(x), self.b1(x), self.b2(x), self.b3(x), self.b4(x)]
        return self.project(torch.cat(branches, dim=1))


class UniMatchDecoder(nn.Module):
    """The reference's ``_decode`` up to its classifier: ASPP on the deepest map, resized to the
    stride-4 map's size; that map reduced to 48 channels; both concatenated and fused by two 3x3
    conv-BN-ReLU."""

    def __init__(self, low_channels: int, high_channels: int, channels: int, atrous_rates: Sequence[int]) -> None:
        super().__init__()
        self.aspp = ASPP(high_channels, channels, atrous_rates)
        self.reduce = conv_bn_relu(low_channels, LOW_LEVEL_CHANNELS, 1)
        self.fuse = nn.Sequential(*conv_bn_relu(channels + LOW_LEVEL_CHANNELS, channels, 3),
                                  *conv_bn_relu(channels, channels, 3))

    def forward(self, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        high = F.interpolate(self.aspp(high), size=low.shape[-2:], mode="bilinear", align_corners=True)
        return self.fuse(torch.cat([self.reduce(low), high], dim=1))


class UniMatchDeepLabV3Plus(DeepLabGenerator):
    """UniMatch's DeepLabV3+ on smp's encoder ``encoder_name``; its keyword arguments are smp's
    DeepLabV3Plus's that segadv sets, so the DeepLab builder builds it as it builds smp's."""

    def __init__(self, encoder_name: str, encoder_depth: int, encoder_weights: str | None, encoder_output_stride: int,
                 in_channels: int, classes: int, decoder_channels: int,
                 decoder_atrous_rates: Sequence[int]) -> None:
        super().__init__()
        self.encoder = get_encoder(encoder_name, in_channels=in_channels, depth=encoder_depth,
                                   weights=encoder_weights, output_stride=encoder_output_stride)
        self.low_level_stage = LOW_LEVEL_STAGE  # an attribute: TorchScript reads no module globals
        channels = self.encoder.out_channels
        self.decoder = UniMatchDecoder(channels[LOW_LEVEL_STAGE], channels[-1], decoder_channels, decoder_atrous_rates)
        self.classifier = nn.Conv2d(decoder_channels, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode_features(self.decoder_inputs(x), x)

    def decoder_inputs(self, x: torch.Tensor) -> List[torch.Tensor]:
        """The two maps the decoder reads, the stride-4 one and the deepest (the reference's c1, c4)."""
        features = self.encoder(x)
        return [features[self.low_level_stage], features[-1]]

    def decode_features(self, features: List[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.decoder(features[0], features[1]))
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=True)

    def input_divisor(self) -> int:
        return 1  # every map is resized to the one it meets, the logits to the input

    def feature_channels(self) -> tuple[int, ...]:
        """c1's and c4's channels: V1's ``need_fp`` drops channels of both (deeplabv3plus.py 41-42)."""
        channels = self.encoder.out_channels
        return int(channels[LOW_LEVEL_STAGE]), int(channels[-1])


class UniMatchDeepLabV3PlusTrained(FeatureScalingMixin, UniMatchDeepLabV3Plus):
    """The trained G: ``feature_scales`` / ``with_unperturbed`` scale c1 and c4 before the decoder,
    V1's ``need_fp``. The mixin's smp defaults would shadow the network's own two maps and head."""

    decoder_inputs = UniMatchDeepLabV3Plus.decoder_inputs
    decode_features = UniMatchDeepLabV3Plus.decode_features
