"""Fully supervised adversarial training (AdvSemiSeg's supervised part): segadv/engine/step.py's
step on the labeled stream. ``loss.lambda_adv: 0`` makes it the CE-only baseline."""

from __future__ import annotations

from typing import Mapping, Optional

import torch

from segadv.data.streams import Stream, StreamSpec
from segadv.engine.step import AdversarialStep
from segadv.methods.base import PanelMaps


class Supervised:
    streams = (StreamSpec("labeled", "labeled"),)
    panel_stream = None

    def __init__(self, step: AdversarialStep) -> None:
        self.step = step

    def __call__(self, streams: Mapping[str, Stream], step: int) -> dict[str, torch.Tensor]:
        images, labels = streams["labeled"].next()
        return self.step(images, labels, step).as_dict()

    def panel(self, images: torch.Tensor) -> Optional[PanelMaps]:
        return None
