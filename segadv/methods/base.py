"""What the training loop needs from a method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Protocol

import torch

from segadv.data.streams import Stream, StreamSpec
from segadv.methods.schedule import Schedule


@dataclass
class PanelMaps:
    """A method's own view of a few images for TensorBoard (besides the val panel)."""

    tag: str
    images: torch.Tensor  # (N,3,H,W) normalised, as the network sees them
    preds: torch.Tensor  # (N,H,W) G's argmax
    confidence: torch.Tensor  # (N,H,W) D's sigmoid output in [0, 1]
    pseudo_labels: torch.Tensor  # (N,H,W) ids, ignore where not confident


class Method(Protocol):
    streams: tuple[StreamSpec, ...]  # the data streams it draws from (segadv/data/streams.py)
    panel_stream: Optional[str]  # the stream whose first images feed panel(), or None
    schedule: Schedule  # when each term is on (segadv-plan runs every step where one switches on)

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        """One iteration (``step`` completed before it); returns detached losses by name, the
        same names every iteration (the loop averages them between log lines)."""
        ...

    def panel(self, images: torch.Tensor) -> Optional[PanelMaps]:
        ...
