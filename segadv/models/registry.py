"""The generator architectures, one row each (``model.generator.arch``): the one table the config,
the builder, the optimizer's head split, weight files and the smp directory interop read.

Each arch is a folder of segadv/models (``deeplab/``, ``dinov2/``, ``dinov3/``): its config section (a
:class:`~segadv.config.generator_section.GeneratorConfig` subclass: the keys it takes and their
limits, torch-free), its networks (subclasses of :class:`segadv.models.base.Generator`, which say
what the network offers: input divisor, ONNX shapes, feature channels, checkpointed blocks, a
split) and its builder (a ViT arch's on segadv/models/vit, what they share). Its row here points
into the folder. torch-free: the builder and the other callables are named as
``"module:attribute"`` strings (or given as callables, a plugin's or a test's), imported when G is
built. A new arch is its folder and one :func:`register_arch` line
(below for a built-in one; in its own package for a plugin); nothing else names archs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from segadv.config.generator_section import DEFAULT_ARCH, GeneratorConfig
from segadv.models.deeplab.config import (
    SMP_CONFIG_KEYS,
    DeepLabV2Config,
    DeepLabV3Config,
    DeepLabV3PlusConfig,
    DeepLabV3PlusUniMatchConfig,
)
from segadv.models.dinov2.config import DinoV2Config
from segadv.models.dinov3.config import DinoV3Config

Ref = Union[str, Callable[..., Any]]  # "package.module:attribute", or the object itself


@dataclass(frozen=True)
class GeneratorArch:
    name: str  # model.generator.arch
    settings: type[GeneratorConfig]  # its model.generator section: its keys and their limits
    # (settings, num_classes, in_channels) -> a segadv.models.base.Generator; with the aux head where
    # settings.aux_head
    builder: Ref
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
    # (settings) -> None: what the builder would refuse that the settings alone say, checked at a
    # start before anything is built (segadv/training/checks.py); None: nothing beyond the schema
    check: Optional[Ref] = None


def resolve(ref: Ref) -> Any:
    """The object a row names: ``"module:attribute"`` imported, a callable as it is."""
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)

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


DEEPLAB = "segadv.models.deeplab.model"
register_arch(GeneratorArch("deeplabv3", DeepLabV3Config, f"{DEEPLAB}:DEEPLABV3", check=f"{DEEPLAB}:check_encoder", backbone="encoder",
                            smp_class="DeepLabV3",
                            smp_config_keys=SMP_CONFIG_KEYS, inference_builder=f"{DEEPLAB}:DEEPLABV3_INFERENCE"))
register_arch(GeneratorArch("deeplabv3plus", DeepLabV3PlusConfig, f"{DEEPLAB}:DEEPLABV3PLUS", check=f"{DEEPLAB}:check_encoder",
                            backbone="encoder",
                            smp_class="DeepLabV3Plus", smp_config_keys=SMP_CONFIG_KEYS,
                            inference_builder=f"{DEEPLAB}:DEEPLABV3PLUS_INFERENCE"))
# UniMatch's DeepLabV3+ head: not smp's class, so no smp directory (segadv/checkpoint/smp_dir.py)
register_arch(GeneratorArch("deeplabv3plus_unimatch", DeepLabV3PlusUniMatchConfig, f"{DEEPLAB}:DEEPLABV3PLUS_UNIMATCH",
                            check=f"{DEEPLAB}:check_encoder", backbone="encoder",
                            inference_builder=f"{DEEPLAB}:DEEPLABV3PLUS_UNIMATCH_INFERENCE"))
register_arch(GeneratorArch("deeplabv2", DeepLabV2Config, f"{DEEPLAB}:DEEPLABV2", check=f"{DEEPLAB}:check_encoder", backbone="encoder",
                            inference_builder=f"{DEEPLAB}:DEEPLABV2_INFERENCE"))
DINOV2 = "segadv.models.dinov2.builder"
register_arch(GeneratorArch("dinov2", DinoV2Config, f"{DINOV2}:build_dinov2", backbone="encoder",
                            encoder_weights_loader=f"{DINOV2}:load_weights", encoder_layers=f"{DINOV2}:encoder_layers"))
DINOV3 = "segadv.models.dinov3.builder"
register_arch(GeneratorArch("dinov3", DinoV3Config, f"{DINOV3}:build_dinov3", backbone="encoder",
                            encoder_weights_loader=f"{DINOV3}:load_weights", encoder_layers=f"{DINOV3}:encoder_layers"))
