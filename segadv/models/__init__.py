"""Network definitions: pure ``nn.Module`` builders, no device or wrapper code."""

from segadv.models.discriminator import DISCRIMINATORS, FCDiscriminator, ImageDiscriminator, build_discriminator
from segadv.models.generator import build_generator, build_generator_for_weights

__all__ = ["DISCRIMINATORS", "FCDiscriminator", "ImageDiscriminator", "build_discriminator",
           "build_generator", "build_generator_for_weights"]
