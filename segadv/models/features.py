"""G's features between its encoder and its decoder, scaled channel by channel: the feature
perturbation of UniMatch (Yang et al., CVPR 2023) and UniMatch V2.

A trained G takes two keywords beside its input, through every wrapper (DDP, DataParallel, which
scatters them with the batch, torch.compile, autocast):

- ``feature_scales``: one (B, C) tensor per feature map its encoder hands its decoder (in the
  encoder's order, ``feature_channels()`` gives each C): the decoder reads each map times its
  image's and channel's scale. A dropout mask is such a scale (0 or 1 / (1 - p)), and so are
  UniMatch V2's complementary masks (0 or 2 on one view, 2 or 0 on the other).
- ``with_unperturbed``: the decoder reads the maps and their scaled copy in one batch, and G
  returns ``(clean, perturbed)`` logits: UniMatch's ``model(x, need_fp=True)``, which decodes
  ``cat(feature, Dropout2d(0.5)(feature))`` in one pass (its BatchNorm sees both halves).

Without either keyword G is the plain network (evaluation and export build the plain class).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch


def scale_features(features: Sequence[torch.Tensor], scales: Sequence[torch.Tensor], *,
                   with_unperturbed: bool = False) -> list[torch.Tensor]:
    """Each feature map times its (B, C) scale, on the map's device and dtype: a (B, C, H, W)
    map by channel, a (B, N, C) token map by its last axis. With ``with_unperturbed``, each map
    and its scaled copy concatenated on the batch (2B)."""
    if len(scales) != len(features):
        raise ValueError(f"feature_scales: {len(scales)} scales for {len(features)} feature maps")
    out = []
    for feature, scale in zip(features, scales):
        if scale.shape != (feature.shape[0], channels_of(feature)):
            raise ValueError(f"feature_scales: a {tuple(scale.shape)} scale for a {tuple(feature.shape)} feature map "
                             f"(expected ({feature.shape[0]}, {channels_of(feature)}))")
        scale = scale.to(feature.device, feature.dtype, non_blocking=True)
        shaped = scale[:, :, None, None] if feature.dim() == 4 else scale[:, None, :]
        scaled = feature * shaped
        out.append(torch.cat((feature, scaled)) if with_unperturbed else scaled)
    return out


def channels_of(feature: torch.Tensor) -> int:
    """A (B, C, H, W) map's C, a (B, N, C) token map's C."""
    return int(feature.shape[1] if feature.dim() == 4 else feature.shape[-1])


class FeatureScalingMixin:
    """The two keywords above for a network with ``decoder_inputs(x)`` (the maps its decoder reads,
    in a list) and ``decode_features(features, x)`` (the logits at ``x``'s size); without them
    ``forward`` is the network's own. Its ``feature_channels()`` (segadv/models/base.py) gives each
    map's C."""

    encoder: Any

    def forward(self, x: torch.Tensor, feature_scales: Optional[Sequence[torch.Tensor]] = None,
                with_unperturbed: bool = False, **kwargs: Any) -> Any:
        # The keywords are also positional: a tracer (torch.onnx's) passes every parameter in order.
        # kwargs: the network's own (DeepLab-v2's ``output_size``), passed through.
        if feature_scales is None:
            return super().forward(x, **kwargs)  # type: ignore[misc]
        features = scale_features(self.decoder_inputs(x), feature_scales, with_unperturbed=with_unperturbed)
        logits = self.decode_features(features, x)
        return logits.chunk(2) if with_unperturbed else logits

    def decoder_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """smp's models: every stage's output, the input itself first (their decoders pick theirs)."""
        return self.encoder(x)

    def decode_features(self, features: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """smp's models: the decoder, then the head, which upsamples to the input itself."""
        return self.segmentation_head(self.decoder(features))  # type: ignore[attr-defined]
