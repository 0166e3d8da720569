"""DeepLab-v2 as the adversarial references train it (``Res_Deeplab``, ``DeeplabMulti``), on any
encoder of segmentation-models-pytorch.

The encoder is smp's, built as smp's DeepLab models build theirs (``get_encoder`` with an output
stride, which dilates the last stages with the encoder's own ``make_dilated``: at stride 8 a
ResNet's layer3 has dilation 2 and layer4 dilation 4, the references' geometry). The head is
DeepLab-v2's classifier (ASPP-v2): one 3x3 convolution straight to the classes per dilation rate,
their outputs summed; no image pooling, no BatchNorm, no decoder. So no layer of G sees one value
per channel, and a batch of one trains.

Both outputs (the main one and, in :class:`segadv.models.deeplab.model.DeepLabV2Aux`, the aux one)
are upsampled to the input's size with ``align_corners=True``, as every reference upsamples them
(its ``interp``), so any input size works: no layer after the encoder fuses two resolutions.

The encoder's layout (``encoder_layout``, segadv/models/deeplab/caffe_resnet.py): ``smp``, torchvision's
ResNet (the stride in a Bottleneck's 3x3 convolution), what smp's ImageNet weights fit; or
``caffe``, the references' (the stride in the 1x1, the max-pool rounding up), what their weights
fit.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from segmentation_models_pytorch.base import SegmentationModel
from segmentation_models_pytorch.encoders import get_encoder
from torch import nn

from segadv.models.deeplab.base import DeepLabGenerator
from segadv.models.deeplab.caffe_resnet import ENCODER_LAYOUTS

# The classifier's dilation rates, by name (model.generator.aspp_v2_rates).
ASPP_V2_RATES: dict[str, tuple[int, ...]] = {
    # DeepLab-v2's ASPP-L, and ADVENT's code: the four branches summed.
    "paper": (6, 12, 18, 24),
    # What AdaptSegNet's, s4GAN's and AdvSemiSeg's code computes (their master branches): their
    # Classifier_Module builds the four branches, but its loop returns after adding the second.
    "early_return": (6, 12),
}
INIT_STD = 0.01  # the references' N(0, 0.01) on every classifier weight


class ASPPV2Classifier(nn.Module):
    """DeepLab-v2's classifier: per rate, a 3x3 convolution from ``in_channels`` to the classes
    with dilation = padding = rate (the map keeps its size); the outputs summed in the order of
    ``rates``. Weights N(0, 0.01) as the references'; biases keep torch's default initialisation
    (uniform within 1/sqrt(fan_in)), which the references never overwrite."""

    def __init__(self, in_channels: int, num_classes: int, rates: Sequence[int]) -> None:
        super().__init__()
        if not rates:
            raise ValueError("the ASPP-v2 classifier needs at least one rate")
        self.branches = nn.ModuleList(
            nn.Conv2d(in_channels, num_classes, kernel_size=3, padding=rate, dilation=rate, bias=True)
            for rate in rates
        )
        for conv in self.branches:
            nn.init.normal_(conv.weight, mean=0.0, std=INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branches[0](x)
        for branch in self.branches[1:]:
            out = out + branch(x)
        return out


class LastStage(nn.Module):
    """DeepLab-v2 has no decoder: its classifier reads the encoder's last stage. Named ``decoder``
    in the model, so G keeps smp's layout (encoder, decoder, segmentation_head)."""

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return features[-1]


class DeepLabV2(DeepLabGenerator, SegmentationModel):
    """DeepLab-v2 (Chen et al., TPAMI 2017) without multi-scale inputs: an smp encoder at
    ``encoder_output_stride`` (8: the references') in ``encoder_layout`` and
    :class:`ASPPV2Classifier` on its last stage, upsampled to the input's size (bilinear,
    ``align_corners=True``: the references' ``interp``). ``segmentation_head`` holds the classifier,
    so the class-count-dependent keys are ``segmentation_head.*`` as in smp's models."""

    # The classifier reads one stage and the output is upsampled to the input's own size: any
    # size computes (the references train at 321 px and evaluate at 505 or 1024x512).
    requires_divisible_input_shape = False
    takes_output_size = True  # forward(x, output_size): the raw logits upsampled once, to that size

    def __init__(
        self,
        encoder_name: str = "resnet101",
        encoder_depth: int = 5,
        encoder_weights: str | None = None,
        encoder_output_stride: int = 8,
        classifier_rates: Sequence[int] = ASPP_V2_RATES["paper"],
        in_channels: int = 3,
        classes: int = 1,
        encoder_layout: str = "smp",
    ) -> None:
        super().__init__()
        self.encoder = get_encoder(encoder_name, in_channels=in_channels, depth=encoder_depth,
                                   weights=encoder_weights, output_stride=encoder_output_stride)
        ENCODER_LAYOUTS[encoder_layout](self.encoder)
        self.encoder_layout = encoder_layout
        self.classifier_rates = tuple(classifier_rates)
        self.decoder = LastStage()
        self.segmentation_head = nn.Sequential(
            ASPPV2Classifier(self.encoder.out_channels[-1], classes, self.classifier_rates))
        self.classification_head = None
        self.name = f"deeplabv2-{encoder_name}"

    def forward(self, x: torch.Tensor,  # type: ignore[override]
                output_size: Sequence[int] | None = None) -> torch.Tensor:
        """The main logits at ``x``'s size, or at ``output_size`` (H, W): the raw logits upsampled
        once, straight to it, as AdaptSegNet's and ADVENT's evaluation upsamples a prediction made
        at a resized input to the full-size label (``data.val_input_size``). Upsampling the output
        at ``x``'s size a second time would not give theirs."""
        return self.main_logits(self.encoder(x), x, output_size)

    def main_logits(self, features: list[torch.Tensor], x: torch.Tensor,
                    output_size: Sequence[int] | None = None) -> torch.Tensor:
        return self.upsample_logits(self.segmentation_head(self.decoder(features)), x, output_size)

    def upsample_logits(self, logits: torch.Tensor, x: torch.Tensor,
                        output_size: Sequence[int] | None = None) -> torch.Tensor:
        """A classifier's logits at ``x``'s size (or ``output_size``), as the references'
        ``nn.Upsample(size=..., mode="bilinear", align_corners=True)`` makes them (their training
        and evaluation alike)."""
        size = x.shape[-2:] if output_size is None else tuple(output_size)
        return F.interpolate(logits, size=size, mode="bilinear", align_corners=True)

    def aux_classifier(self, num_classes: int) -> nn.Module:
        """AdaptSegNet's multi-level aux classifier: the same ASPP-v2 classifier on the encoder's
        second-to-last stage (a ResNet-101's layer3, 1024 channels)."""
        return ASPPV2Classifier(self.encoder.out_channels[-2], num_classes, self.classifier_rates)
