"""The generator architectures, one row each (``model.generator.arch``): the one table the config,
the builder, activation checkpointing, the optimizer's head split and the smp directory interop read.

A row holds the arch's config section (a :class:`~segadv.config.generator_section.GeneratorConfig`
subclass: the keys it takes and their limits), its builder and what the other readers need of it.
torch-free: the builder and the checkpointed blocks are named as ``"module:attribute"`` strings (or
given as callables, a plugin's or a test's), imported when G is built. A new arch is one
:func:`register_arch` call (a row below for a built-in one) and its module; nothing else names archs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from segadv.config.deeplab import SMP_CONFIG_KEYS, DeepLabV2Config, DeepLabV3Config, DeepLabV3PlusConfig
from segadv.config.dinov2 import DinoV2Config
from segadv.config.generator_section import DEFAULT_ARCH, GeneratorConfig

Ref = Union[str, Callable[..., Any]]  # "package.module:attribute", or the object itself

# The attribute the built G carries its arch's name in (set by segadv/models/generator.py), so
# the readers of a built network (activation checkpointing, the optimizer's groups) find its row.
ARCH_ATTRIBUTE = "generator_arch"


@dataclass(frozen=True)
class GeneratorArch:
    name: str  # model.generator.arch
    settings: type[GeneratorConfig]  # its model.generator section: its keys and their limits
    # (settings, num_classes, in_channels) -> the nn.Module; with the aux head where settings.aux_head
    builder: Ref
    # (built G) -> the names of the modules activation checkpointing recomputes; None: it has none
    checkpoint_blocks: Optional[Ref] = None
    # the submodule trained at optim.generator.lr where head_lr_mult / head_weight_decay set the
    # rest (the head) apart; None: no such split
    backbone: Optional[str] = None
    # smp's class its inference G is, and smp kwarg -> config key: what an smp save_pretrained
    # directory holds (segadv/checkpoint/smp_dir.py); None: not one of smp's models
    smp_class: Optional[str] = None
    smp_config_keys: Mapping[str, str] = field(default_factory=dict)
    # (built G, the file's tensors, a name for messages) -> None: a local encoder_weights file into
    # G, strictly; None: smp's encoder layout (segadv/checkpoint/loader.py's own)
    encoder_weights_loader: Optional[Ref] = None
    # (built G) -> ({parameter name: layer 0..L}, L): the backbone's layers for optim.generator.layer_decay
    # (0 the embedding, L the last); None: its encoder has no numbered layers
    encoder_layers: Optional[Ref] = None
    # (settings, num_classes, in_channels) -> the nn.Module evaluation, export and segadv-ckpt build,
    # where it is another class than the trained one (the DeepLab
    # rows': smp's plain one, which TorchScript can script); None: ``builder``'s
    inference_builder: Optional[Ref] = None


def resolve(ref: Ref) -> Any:
    """The object a row names: ``"module:attribute"`` imported, a callable as it is."""
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


DEEPLAB_BLOCKS = "segadv.models.generator:encoder_stages_and_decoder"

ARCHS: dict[str, GeneratorArch] = {}


def register_arch(row: GeneratorArch) -> GeneratorArch:
    """Add an arch to the table (a plugin's or a test's: the built-ins are below). Its section's
    ``arch`` defaults to its name, and the name is new."""
    if not row.name.isidentifier():
        raise ValueError(f"arch names are identifiers, got {row.name!r}")
    if row.name in ARCHS:
        raise ValueError(f"arch {row.name!r} is registered already")
    if not (isinstance(row.settings, type) and issubclass(row.settings, GeneratorConfig)):
        raise TypeError(f"arch {row.name}: its settings must be a GeneratorConfig subclass, got {row.settings!r}")
    if row.settings.model_fields["arch"].default != row.name:
        raise ValueError(f"arch {row.name}: its section's arch must default to {row.name!r} "
                         "(arch: str = arch_field(name))")
    ARCHS[row.name] = row
    return row


def unregister_arch(name: str) -> None:
    """Remove an arch added by :func:`register_arch` (a test's, when it ends)."""
    if name == DEFAULT_ARCH:
        raise ValueError(f"{name} is the default arch")
    del ARCHS[name]


def generator_arch(name: str) -> GeneratorArch:
    """The row of ``model.generator.arch`` ``name``."""
    try:
        return ARCHS[name]
    except KeyError:
        raise KeyError(f"unknown generator arch {name!r}; archs are {', '.join(ARCHS)}") from None


register_arch(GeneratorArch("deeplabv3", DeepLabV3Config, "segadv.models.generator:DEEPLABV3", DEEPLAB_BLOCKS, backbone="encoder",
                            smp_class="DeepLabV3", smp_config_keys=SMP_CONFIG_KEYS,
                            inference_builder="segadv.models.generator:DEEPLABV3_INFERENCE"))
register_arch(GeneratorArch("deeplabv3plus", DeepLabV3PlusConfig, "segadv.models.generator:DEEPLABV3PLUS",
                            DEEPLAB_BLOCKS,
                            backbone="encoder", smp_class="DeepLabV3Plus", smp_config_keys=SMP_CONFIG_KEYS,
                            inference_builder="segadv.models.generator:DEEPLABV3PLUS_INFERENCE"))
register_arch(GeneratorArch("deeplabv2", DeepLabV2Config, "segadv.models.generator:DEEPLABV2", DEEPLAB_BLOCKS,
                            backbone="encoder", inference_builder="segadv.models.generator:DEEPLABV2_INFERENCE"))
register_arch(GeneratorArch("dinov2", DinoV2Config, "segadv.models.vit.builder:build_dinov2",
                            "segadv.models.vit.builder:checkpoint_units", backbone="encoder",
                            encoder_weights_loader="segadv.models.vit.builder:load_weights",
                            encoder_layers="segadv.models.vit.builder:encoder_layers"))
