"""What a method is: what it declares about itself before any network exists (its name, its config
section, its streams, whether G's loss passes through a D, its config checks) and what the loop
asks of it every iteration (``__call__``, its ``schedule``, an optional image panel).

The declarations are class attributes and class methods, read from the config alone: the config,
build.py, the loaders and segadv-plan ask the method's class
(``segadv.methods.registry.method_class``) before they build anything. This module and the
built-in declarations (``segadv.methods.specs``) import no torch, so the config (which validates
every registered method's settings) loads without it; a built-in's iteration subclasses its
declaration in the method's own module, which ``from_config`` imports when a run is built.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from segadv.config.schema import Section
from segadv.errors import UserError
from segadv.methods.schedule import Schedule
from segadv.data.stream_spec import StreamSpec

if TYPE_CHECKING:
    import torch

    from segadv.config import Config
    from segadv.engine.network import Network
    from segadv.monitor.profile import PhaseTimer


@dataclass
class PanelMaps:
    """A method's own view of a few images for TensorBoard (besides the val panel)."""

    tag: str
    images: torch.Tensor  # (N,3,H,W) normalised, as the network sees them
    preds: torch.Tensor  # (N,H,W) G's argmax
    confidence: torch.Tensor  # (N,H,W) D's sigmoid output in [0, 1]
    pseudo_labels: torch.Tensor  # (N,H,W) ids, ignore where not confident


class Method(ABC):
    """One training method. A subclass sets the class attributes below and implements the abstract
    methods; ``segadv.methods.registry.register_method`` refuses one that leaves any abstract.
    ``from_config`` returns the method built on the run's networks: an instance of the class
    itself or of a subclass holding the iteration (a built-in's), whose
    ``__call__(streams, step)`` runs one iteration (``step`` completed before it) and returns
    detached losses by name, the same names every iteration (the loop averages them between log
    lines)."""

    name: ClassVar[str]  # its ``method.name``
    # Its settings, the section ``method.<name>`` of the config (None: it has none). Every
    # registered method's section is validated with the config (segadv/config/schema.py).
    config: ClassVar[Optional[type[Section]]] = None
    # The data streams it draws from; a stream whose batch size is one of its settings names that
    # setting's full key (``method.<name>.<field>``), which errors then name.
    streams: ClassVar[tuple[StreamSpec, ...]]
    panel_stream: ClassVar[Optional[str]] = None  # the stream whose first images feed panel(), or None
    discriminator_kind: ClassVar[str] = "fc"  # the D it trains: fc (scores pixels) or image (whole images)
    trains_aux_output: ClassVar[bool] = False  # whether it trains G's aux head (model.generator.aux_head)
    # Where the class running its iteration is, as "module:Class" (a subclass of this one), for a
    # declaration that keeps it in a module of its own (the built-ins: their declarations import
    # no torch, their iterations do); None: this class runs it.
    implementation: ClassVar[Optional[str]] = None

    schedule: Schedule  # when each term is on (segadv-plan runs every step where one switches on)

    # ---------------------------------------------------------------- what it declares (from the config)

    @classmethod
    @abstractmethod
    def from_config(
        cls, cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer
    ) -> Method:
        """The method every network of the run trains under: G, the main D and, where the run
        has one (``has_aux_discriminator``), the aux D; ``phases`` is the timer its iteration
        marks its phases on."""

    @classmethod
    @abstractmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        """Whether G's loss has a term backpropagated through a D under ``cfg``: a float16 D then
        needs G's loss scaled (build.py), else that term's gradient underflows in D's backward."""

    @classmethod
    def has_aux_discriminator(cls, cfg: Config) -> bool:
        """Whether the run trains a second D, on G's aux output (multi-level adaptation)."""
        return False

    @classmethod
    def iteration_class(cls) -> type[Method]:
        """The class that runs its iteration (``implementation``), imported now."""
        if cls.implementation is None:
            return cls
        module, _, name = cls.implementation.partition(":")
        return getattr(importlib.import_module(module), name)

    @classmethod
    def settings(cls, cfg: Config) -> Any:
        """Its section of ``cfg`` (``method.<name>``)."""
        if cls.config is None:
            raise TypeError(f"the {cls.name} method has no config section")
        return getattr(cfg.method, cls.name)

    @classmethod
    def stream_batch_sizes(cls, cfg: Config) -> dict[str, int]:
        """Each stream's batch size by stream name: the setting its ``batch_size_key`` names, or
        ``data.batch_size`` where that setting is None."""
        sizes = {}
        for spec in cls.streams:
            value: Any = cfg
            for part in spec.batch_size_key.split("."):
                value = getattr(value, part)
            sizes[spec.name] = cfg.data.batch_size if value is None else value
        return sizes

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        """What the schema cannot check alone: the method's fit with the model and the data.
        A subclass adding checks calls this one too."""
        if cfg.model.generator.aux_head and not cls.trains_aux_output:
            raise UserError(f"model.generator.aux_head: the {cls.name} method trains the main output only; the aux "
                            "head is for multi-level domain adaptation (docs/methods.md \"Domain adaptation\")")
        for key in ("discriminator", "discriminator_aux"):
            section = getattr(cfg.model, key)
            if section is not None and section.kind == "image" and cls.discriminator_kind != "image":
                raise UserError(f"model.{key}.kind: image is s4gan's image-level D; the {cls.name} method's D scores "
                                f"pixels (kind: {cls.discriminator_kind})")
        if cfg.target_data is None and any(spec.pool == "target" for spec in cls.streams):
            raise UserError(f"target_data: method {cls.name} adapts to a target domain; give target_data "
                            "(docs/methods.md \"Domain adaptation\")")

    # ---------------------------------------------------------------- what the loop asks besides __call__

    def panel(self, images: torch.Tensor) -> Optional[PanelMaps]:
        """Its view of ``images`` (from ``panel_stream``) for TensorBoard; None: it has none."""
        return None
