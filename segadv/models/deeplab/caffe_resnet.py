"""The Caffe layout of a ResNet, as the adversarial references' DeepLab-v2 has it, made from smp's
ResNet encoder (``model.generator.layout``).

The references' ``Res_Deeplab`` / ``DeeplabMulti`` (hfslyc/AdvSemiSeg model/deeplab.py,
wasidennis/AdaptSegNet model/deeplab_multi.py, valeoai/ADVENT advent/model/deeplabv2.py,
sud0301/semisup-semseg model/deeplabv2.py) come from the Caffe DeepLab, whose ResNet differs from
torchvision's (smp's) in two places only:

- a Bottleneck strides in its first 1x1 convolution, not in its 3x3 one;
- the max-pool after the stem rounds its output size up (``ceil_mode=True``).

The parameters are the same tensors under the same names, so a reference state dict maps onto
smp's keys one to one (segadv/checkpoint/reference_weights.py); the layout changes what they
compute, and the output size at sizes such as 321 and 513 px (41x41 and 65x65 at output
stride 8, the references' ``outS``).
"""

from __future__ import annotations

from typing import Callable

from segmentation_models_pytorch.encoders.resnet import ResNetEncoder
from torch import nn
from torchvision.models.resnet import Bottleneck

from segadv.errors import UserError


def keep_smp_layout(encoder: nn.Module) -> None:
    """smp's (torchvision's) layout, what its ImageNet weights were trained in: nothing to do."""


def to_caffe_layout(encoder: nn.Module) -> None:
    """Move every Bottleneck's stride from its 3x3 into its 1x1 convolution and make the max-pool
    round up, in place. BasicBlock ResNets (resnet18/34) have no 1x1 convolution: their blocks are
    the same in both layouts, only the pool changes. Strides removed by smp's dilation (output
    stride 8 or 16) stay removed."""
    if not isinstance(encoder, ResNetEncoder):
        raise UserError(f"model.generator.layout: caffe is a layout of a ResNet encoder (resnet18 ... resnet152, "
                        f"the references' resnet101); this encoder is {type(encoder).__name__}")
    encoder.maxpool.ceil_mode = True
    for block in encoder.modules():
        if isinstance(block, Bottleneck) and block.conv2.stride != (1, 1):
            block.conv1.stride, block.conv2.stride = block.conv2.stride, (1, 1)


# model.generator.layout -> what it does to smp's encoder.
ENCODER_LAYOUTS: dict[str, Callable[[nn.Module], None]] = {
    "smp": keep_smp_layout,
    "caffe": to_caffe_layout,
}
