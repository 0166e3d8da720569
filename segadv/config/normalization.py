"""How an image becomes G's input (``data.normalization``): one row per convention, read by every
place that normalises an image, undoes it or reproduces it (the data pipelines, the image panels,
the export's in-graph preprocessing and its sidecar, segadv-predict, the mixing jitter).

Torch-free and numpy-free (the schema names the rows; an exported model's host reads the sidecar
without segadv). Each convention is ``(pixel / 255 - mean) / std`` per channel, on the channels in
the order G sees them: the image is read as RGB and reversed for a BGR row. Its ``mean`` and
``std`` are on that 0..1 scale and in that channel order, the form albumentations' ``Normalize``
and the sidecar's formula take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

Channels = Literal["RGB", "BGR"]

# The references' Caffe mean, BGR, on the 0..255 scale, subtracted with no division by a std
# (`IMG_MEAN`: AdvSemiSeg train.py:31, s4GAN train_s4GAN.py:36, AdaptSegNet
# pytorch_0.4/train_gta2cityscapes_multi.py:24, ADVENT advent/domain_adaptation/config.py:59).
# AdaptSegNet (dataset/cityscapes_dataset.py:50-51, gta5_dataset.py:66-67) and ADVENT
# (advent/dataset/base_dataset.py:36-37) read RGB with PIL, reverse it to BGR and subtract it:
# caffe_bgr. AdvSemiSeg and s4GAN (dataset/voc_dataset.py:48-74, data/voc_dataset.py:47-73) read
# BGR with cv2, subtract it, then reverse the channels ("change to BGR", in fact to RGB): their G
# sees RGB less the same mean per colour, caffe_rgb.
CAFFE_BGR_MEAN_255 = (104.00698793, 116.66876762, 122.67891434)


@dataclass(frozen=True)
class Normalization:
    """One image convention, resolved: G sees ``(pixel / 255 - mean) / std`` per channel, the
    channels in ``channels`` order."""

    name: str
    channels: Channels
    mean: tuple[float, ...]  # 0..1 scale, in `channels` order
    std: tuple[float, ...]

    @property
    def bgr(self) -> bool:
        """Whether the RGB image's channels are reversed before normalising."""
        return self.channels == "BGR"

    @property
    def formula(self) -> str:
        order = "the RGB image's channels reversed to BGR, then " if self.bgr else ""
        return f"{order}(pixel / 255 - mean) / std per {self.channels} channel"


@dataclass(frozen=True)
class Convention:
    """A row of the table: its channel order and, when it fixes them, its mean and std (None:
    ``data.mean`` / ``data.std``'s)."""

    channels: Channels
    description: str
    mean: Optional[tuple[float, ...]] = None
    std: Optional[tuple[float, ...]] = None

    @property
    def takes_mean_std(self) -> bool:
        """Whether ``data.mean`` / ``data.std`` are its values (else it fixes its own)."""
        return self.mean is None


NORMALIZATIONS: dict[str, Convention] = {
    "imagenet": Convention(
        "RGB", "RGB, (pixel / 255 - data.mean) / data.std (ImageNet's by default): smp's ImageNet weights"),
    "caffe_bgr": Convention(
        "BGR", "BGR, the references' Caffe mean (104.0, 116.7, 122.7) subtracted on the 0..255 scale, no std: "
        "AdaptSegNet's and ADVENT's input (their Caffe weights)", mean=tuple(m / 255 for m in CAFFE_BGR_MEAN_255),
        std=(1 / 255,) * 3),
    "caffe_rgb": Convention(
        "RGB", "RGB, the same Caffe mean per colour subtracted, no std: AdvSemiSeg's and s4GAN's input as their "
        "code computes it", mean=tuple(m / 255 for m in reversed(CAFFE_BGR_MEAN_255)), std=(1 / 255,) * 3),
}


def resolve(name: str, mean: Optional[list[float]] = None, std: Optional[list[float]] = None) -> Normalization:
    """The row ``name``, with ``mean`` / ``std`` (RGB, 0..1) where the row takes them."""
    row = NORMALIZATIONS[name]
    if row.takes_mean_std:
        if mean is None or std is None:
            raise ValueError(f"normalization {name} takes data.mean and data.std")
        return Normalization(name, row.channels, tuple(mean), tuple(std))
    return Normalization(name, row.channels, row.mean, row.std)
