"""segadv: adversarial semantic segmentation (DeepLab generator vs a fully convolutional
discriminator), model parallel by a device map, AMP per network."""

__version__ = "0.1.0"
