"""What a DeepLab G on an smp encoder offers segadv (:class:`~segadv.models.base.Generator`), and the
two things its builder does to the encoder smp gives it: the stages a shallow depth never runs
dropped, and the blocks activation checkpointing recomputes named."""

from __future__ import annotations

import re

import torch
from torch import nn

from segadv.errors import UserError
from segadv.models.base import DroppedStage, Generator


class DeepLabGenerator(Generator):
    """Every DeepLab class segadv builds (smp's DeepLabV3 / V3+, DeepLab-v2; trained, with the aux
    head, or plain for evaluation and export) mixes this in before smp's class, so smp's own
    attributes (``encoder``, ``requires_divisible_input_shape``) answer. No annotations of them
    here: TorchScript would read them as the attributes' types."""

    def input_divisor(self) -> int:
        """smp's DeepLabV3 and V3+ check their input's sides against the encoder's output stride
        (their forward's ``check_input_shape``); DeepLab-v2 takes any size."""
        return int(self.encoder.output_stride) if self.requires_divisible_input_shape else 1

    def feature_channels(self) -> tuple[int, ...]:
        """Each feature map's channels, in the order ``feature_scales`` takes them (smp's encoders
        hand the decoder every stage's output, the input itself first)."""
        return tuple(int(c) for c in self.encoder.out_channels)

    def checkpoint_units(self) -> list[str]:
        return encoder_stages_and_decoder(self)


def encoder_stages_and_decoder(generator: nn.Module) -> list[str]:
    """A DeepLab G's blocks for activation checkpointing: the encoder's stages that hold
    weights (a ResNet's ``layer1``-``layer4``; a MobileNet's or other ``features`` encoder's blocks)
    and the decoder where it has weights (DeepLab-v2's classifier, a few convolutions to the
    classes, keeps no more than its input)."""
    encoder = generator.encoder
    names = [name for name, _ in encoder.named_children() if re.fullmatch(r"layer\d", name)]
    if not names and isinstance(getattr(encoder, "features", None), nn.Sequential):
        names = [f"features.{name}" for name, _ in encoder.features.named_children()]
    if not names:
        raise UserError(f"model.generator.activation_checkpointing: segadv does not know the stages of the "
                        f"{type(encoder).__name__} encoder (it checkpoints ResNet layers and `features` blocks)")

    def has_weights(name: str) -> bool:  # not a dropped stage, nor DeepLab-v2's decoder (its last stage as it is)
        return any(True for _ in generator.get_submodule(name).parameters())

    return [name for name in [f"encoder.{name}" for name in names] + ["decoder"] if has_weights(name)]


def drop_unused_stages(model: nn.Module, in_channels: int) -> list[str]:
    """Replace the encoder stages a shallow ``encoder_depth`` never uses with :class:`DroppedStage`.

    smp builds every stage of the encoder whatever its depth, and leaves the deeper ones unused
    (never run, or run with the result thrown away). Parameters that never get a gradient make DDP
    (``find_unused_parameters=False``) fail at its second step, take weight decay, and bloat the
    checkpoints. Which stages are unused is found by one probe backward, so this holds for every
    encoder. The strict loader leaves a full-depth weight file's keys for the dropped stages out, so
    such a file still fits. Returns the names of the modules dropped.
    """
    was_training = model.training
    model.eval()  # no BatchNorm statistics move during the probe
    probe = torch.zeros(1, in_channels, 64, 64)
    model(probe).sum().backward()
    model.train(was_training)
    unused = {name for name, p in model.named_parameters() if p.grad is None}
    model.zero_grad(set_to_none=True)
    dropped = []
    for name, module in list(model.named_modules()):
        params = [f"{name}.{n}" for n, _ in module.named_parameters()]
        if name and params and all(p in unused for p in params) and not any(
            name.startswith(f"{d}.") for d in dropped
        ):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, DroppedStage())
            dropped.append(name)
    return dropped
