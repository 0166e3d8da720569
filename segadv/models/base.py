"""What segadv asks of a generator, declared once: every arch's G, the class it trains and the
class evaluation and export build, subclasses :class:`Generator`, and ``build_generator``
(segadv/models/generator.py) refuses a builder's network that does not.

The readers ask the network and never probe it: evaluation and export its input divisor
(:meth:`Generator.input_divisor`), export whether an ONNX trace takes other sizes
(``onnx_dynamic_shapes``), evaluation whether it resizes its own logits (``takes_output_size``),
UniMatch's feature perturbation the channels its decoder reads (:meth:`Generator.feature_channels`),
activation checkpointing its blocks (:meth:`Generator.checkpoint_units`), the optimizer's groups its
arch row (``generator_arch``). A G that places its own blocks over devices implements
:class:`Splittable` too (segadv/parallel/pipeline.py holds the protocol's rules).

Torch-only: the arch table (``registry.py``) and the config sections stay torch-free.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import nn

from segadv.errors import UserError

# The keys of a multi-level G's aux head (AdaptSegNet's second output); training-only, so
# evaluation, export and the strict loader of an inference G leave them out.
AUX_HEAD_PREFIX = "aux_head."


class Generator(nn.Module):
    """G as segadv trains, evaluates and exports it. A subclass overrides what differs from the
    defaults: any input size, ONNX graphs at any size, logits at the input's size, no feature
    perturbation, no blocks to checkpoint. No properties and no annotations: TorchScript would
    compile the ones and read the others as attribute types."""

    # The row of the arch table that built it (a str, set by build_generator): the optimizer's
    # groups read it.
    generator_arch = ""
    # Whether an ONNX trace of its forward takes sizes other than the traced one (a ViT's position
    # embedding resampled by Python floats of the grid is a constant in the trace).
    onnx_dynamic_shapes = True
    # Whether forward(x, output_size=(H, W)) gives the logits at that size itself (DeepLab-v2
    # upsamples its raw logits once, as its references evaluate); else they come at x's size.
    takes_output_size = False

    def input_divisor(self) -> int:
        """The input's height and width must be multiples of this (1: any size)."""
        return 1

    def feature_channels(self) -> tuple[int, ...]:
        """The channels of each feature map its decoder reads, in the order the ``feature_scales``
        keyword takes them (segadv/models/features.py): UniMatch's feature perturbation."""
        raise UserError(f"{type(self).__name__} takes no feature scales: UniMatch's feature perturbation needs an "
                        "arch whose G does (model.generator.arch)")

    def checkpoint_units(self) -> list[str]:
        """The names of the submodules activation checkpointing recomputes."""
        raise UserError(f"model.generator.activation_checkpointing: {type(self).__name__} names no blocks to "
                        "checkpoint")


@runtime_checkable
class Splittable(Protocol):
    """A network that places its own blocks over pipeline stages (the device map's ``g:0/1``):
    ``split(stage_devices, boundaries)`` once on the fresh network, then ``pipeline_devices``
    names each stage's device (segadv/parallel/pipeline.py's docstring has the rules)."""

    def split(self, stage_devices: Sequence[torch.device], boundaries: Sequence[int] | None = None) -> None: ...

    @property
    def pipeline_devices(self) -> tuple[torch.device, ...]: ...


class DroppedStage(nn.Identity):
    """What an encoder stage a shallow encoder depth never runs is replaced with. Its own type, so
    loaders can tell a full-depth weight file's keys for it from keys that do not fit."""
