"""What a method is: what it declares about itself before any network exists (its name, its config
section, its streams, whether G's loss passes through a D, its config checks) and what the loop
asks of it every iteration (``__call__``, its ``schedule``, optional image panels: ``panel``, ``training_views``).

The declarations are class attributes and class methods, read from the config alone: the config,
build.py, the loaders and segadv-plan ask the method's class
(``segadv.methods.registry.method_class``) before they build anything. A built-in method is one
folder, ``segadv/methods/<name>/``: ``declaration.py`` (this module's subclass, importing no torch,
so the config, which validates every registered method's settings, loads without it) and
``iteration.py`` (a subclass of the declaration that runs it). The declaration resolves what its
iteration reads from the config into one frozen ``Setup`` (``setup``) and names its iteration as
``"module:Class"`` (``iteration_path``), imported by ``iteration_class`` when a run is built;
``from_config`` is then ``iteration_class()(setup, nets, phases)`` for every method. A plugin is
one class that does both.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional

from segadv.config.schema import Section
from segadv.errors import UserError
from segadv.methods.schedule import Schedule
from segadv.data.stream_spec import StreamSpec

if TYPE_CHECKING:
    import torch

    from segadv.config import Config
    from segadv.engine.network import Network
    from segadv.monitor.profile import PhaseTimer


@dataclass(frozen=True)
class Setup:
    """What a method's iteration reads from the config, resolved once by its declaration
    (``Method.setup``) and handed to the iteration's constructor, so the iteration holds no
    keyword list of its own. These fields every method has; a method whose iteration reads more
    declares a frozen subclass beside its declaration and returns it from its ``setup``."""

    num_classes: int  # data.num_classes
    ignore_index: int  # data.ignore_index
    lambda_adv: float  # loss.lambda_adv as the method reads it (Method.adversarial_weight; 0.0 without the term)


@dataclass
class PanelMaps:
    """A method's own view of a few images for TensorBoard (besides the val panel)."""

    tag: str
    images: torch.Tensor  # (N,3,H,W) normalised, as the network sees them
    preds: torch.Tensor  # (N,H,W) G's argmax
    confidence: torch.Tensor  # (N,H,W) D's sigmoid output in [0, 1]
    pseudo_labels: torch.Tensor  # (N,H,W) ids, ignore where not confident


MIXED_BATCH_TAG = "train/mixed_batch"


@dataclass(frozen=True)
class TrainingViews:
    """A self-training method's last training batch as its iteration built it, for TensorBoard's
    ``tag`` panel (segadv/monitor/images.py ``training_views_panel``): the strongly augmented
    images G was trained on, the labels its loss read and each pixel's weight in that loss. The
    tensors are the iteration's own, detached, on whichever device computed them: the reporter
    takes the first ``log.num_images`` (:meth:`first`) and copies them to the host (:meth:`to_host`)
    only when it draws the panel, at an evaluation, so the step makes no copy and no host sync."""

    images: torch.Tensor  # (N,3,H,W) normalised, as G saw them (after the strong augmentation)
    labels: torch.Tensor  # (N,H,W) class ids the loss read, ``data.ignore_index`` where it read none
    weight: torch.Tensor  # (N,H,W) each pixel's weight in the loss, in [0, 1] (the confidence)
    tag: str = MIXED_BATCH_TAG
    titles: tuple[str, str, str] = ("mixed input", "mixed label", "confidence")  # the panel's columns

    def first(self, n: int) -> TrainingViews:
        """The first ``n`` images (views: nothing is copied)."""
        return replace(self, images=self.images[:n], labels=self.labels[:n], weight=self.weight[:n])

    def to_host(self) -> TrainingViews:
        """The same views on the CPU (blocking copies: the panel reads them at once)."""
        return replace(self, images=self.images.detach().cpu(), labels=self.labels.detach().cpu(),
                       weight=self.weight.detach().cpu())


class Method(ABC):
    """One training method. A subclass sets the class attributes below and implements the abstract
    methods; ``segadv.methods.registry.register_method`` refuses one that leaves any abstract.
    ``from_config`` returns the method built on the run's networks: an instance of the class
    ``iteration_path`` names (a built-in's subclass of its declaration) or of the class itself, whose
    ``__call__(streams, step)`` runs one iteration (``step`` completed before it) and returns
    detached losses by name, the same names every iteration (the loop averages them between log
    lines)."""

    name: ClassVar[str]  # its ``method.name``
    # The class that runs its iteration, as "dotted.module:Class" (a subclass of this one, built
    # as ``Class(setup, nets, phases)``), imported only when a run is built so that the
    # declaration stays torch-free; None: this class runs its own (a plugin's one class).
    iteration_path: ClassVar[Optional[str]] = None
    # Its settings, the section ``method.<name>`` of the config (None: it has none). Every
    # registered method's section is validated with the config (segadv/config/schema.py).
    config: ClassVar[Optional[type[Section]]] = None
    # The data streams it draws from; a stream whose batch size is one of its settings names that
    # setting's full key (``method.<name>.<field>``), which errors then name.
    streams: ClassVar[tuple[StreamSpec, ...]]
    panel_stream: ClassVar[Optional[str]] = None  # the stream whose first images feed panel(), or None
    discriminator_kind: ClassVar[str] = "fc"  # the D it trains: fc (scores pixels) or image (whole images)
    trains_aux_output: ClassVar[bool] = False  # whether it trains G's aux head (model.generator.aux_head)
    # What its ``__call__`` returns, logged as train/<name> (some only under some settings); of them,
    # D's losses (D's health check reads them; () without a D); and what a grid's table reports
    # of its runs, as logged tags (train/loss_d, diag/d_confidence_auroc).
    losses: ClassVar[tuple[str, ...]] = ()
    d_losses: ClassVar[tuple[str, ...]] = ()
    # Of its losses, those averaged over a selection of pixels that may be empty (labelled,
    # confident, mixed): each is 0 on a batch whose selection is empty, and ``__call__`` also
    # returns ``empty/<loss>`` (segadv/engine/losses.py ``empty_selection``) wherever it returns
    # the loss, logged as train/empty/<loss>.
    selection_losses: ClassVar[tuple[str, ...]] = ()
    # Its D losses against the references' loss_D, the mean of D's BCE on real and fake (chance
    # ln 2): 2 where it logs their sum (the supervised method). D's health check reads its bounds
    # times this (segadv/monitor/diagnostics.py).
    d_loss_scale: ClassVar[float] = 1.0
    diagnostics: ClassVar[tuple[str, ...]] = ()
    # G's adversarial weight is one key for every method, ``loss.lambda_adv`` (the main level's in
    # multi-level adaptation), read through ``adversarial_weight(cfg)``. Where a config leaves it
    # null it is the method's reference default, ``lambda_adv_default``. A method with no term it
    # weighs says why in ``lambda_adv_unused`` (one declaring neither has none either), and a config
    # giving it another value than its default (MinEnt: 0; s4GAN: none, so any value) is refused.
    lambda_adv_default: ClassVar[Optional[float]] = None
    lambda_adv_unused: ClassVar[Optional[str]] = None
    schedule: Schedule  # when each term is on (segadv-plan runs every step where one switches on)

    # ---------------------------------------------------------------- what it declares (from the config)

    @classmethod
    def setup(cls, cfg: Config) -> Setup:
        """What its iteration reads from ``cfg``, resolved once: the fields of ``Setup``; a method
        reading more overrides this, returning its own subclass of ``Setup``."""
        return Setup(num_classes=cfg.data.num_classes, ignore_index=cfg.data.ignore_index,
                     lambda_adv=cls.adversarial_weight(cfg))

    @classmethod
    def from_config(cls, cfg: Config, nets: Mapping[str, Network], phases: PhaseTimer) -> Method:
        """The method built on the run's networks, by role name: those ``networks(cfg)`` names;
        ``phases`` is the timer its iteration marks its phases on. Every built-in is built here:
        its iteration class from its setup."""
        return cls.iteration_class()(cls.setup(cfg), nets, phases)

    @classmethod
    def networks(cls, cfg: Config) -> tuple[str, ...]:
        """The roles of the networks it trains under ``cfg`` (segadv/config/roles.py), G first: the
        run builds, places, optimises, logs and checkpoints these and no other."""
        return ("generator", "discriminator")

    @classmethod
    @abstractmethod
    def passes_generator_loss_through_discriminator(cls, cfg: Config) -> bool:
        """Whether G's loss has a term backpropagated through a D under ``cfg``: a float16 D then
        needs G's loss scaled (build.py), else that term's gradient underflows in D's backward."""

    @classmethod
    def iteration_class(cls) -> type[Method]:
        """The class ``iteration_path`` names, imported now; the class itself where it names none. A
        link that does not lead to a subclass of this one is a TypeError naming the link."""
        if cls.iteration_path is None:
            return cls
        module_name, _, class_name = cls.iteration_path.partition(":")
        where = (f"method {cls.name}: its iteration {cls.iteration_path!r} "
                 f"({cls.__module__}.{cls.__qualname__}.iteration_path)")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is None or not (module_name == e.name or module_name.startswith(e.name + ".")):
                raise  # the module exists and one of its own imports is missing
            raise TypeError(f"{where}: no module {module_name}") from None
        found = getattr(module, class_name, None)
        if found is None:
            raise TypeError(f"{where}: {module_name} defines no {class_name}")
        if not (isinstance(found, type) and issubclass(found, cls)):
            raise TypeError(f"{where}: {class_name} is not a subclass of {cls.__qualname__}")
        return found

    @classmethod
    def settings(cls, cfg: Config) -> Any:
        """Its section of ``cfg`` (``method.<name>``)."""
        if cls.config is None:
            raise TypeError(f"the {cls.name} method has no config section")
        return getattr(cfg.method, cls.name)

    @classmethod
    def data_streams(cls, cfg: Config) -> tuple[StreamSpec, ...]:
        """The streams it draws from under ``cfg``: ``streams`` (every stream it may draw), or of
        them those its setting uses (the mean teacher: labeled and unlabeled without ``target_data``,
        source and target with it). The loaders build these and no other."""
        return cls.streams

    @classmethod
    def stream_batch_sizes(cls, cfg: Config) -> dict[str, int]:
        """Each stream's batch size by stream name: the setting its ``batch_size_key`` names, or
        ``data.batch_size`` where that setting is None."""
        sizes = {}
        for spec in cls.data_streams(cfg):
            value: Any = cfg
            for part in spec.batch_size_key.split("."):
                value = getattr(value, part)
            sizes[spec.name] = cfg.data.batch_size if value is None else value
        return sizes

    @classmethod
    def adversarial_weight(cls, cfg: Config) -> float:
        """The weight of G's adversarial term under ``cfg``: ``loss.lambda_adv``, or where it is null
        the method's reference default (0.0 for a method without the term). The one reader of the
        key: a value the method refuses is a UserError naming the key (``resolve_adversarial_weight``)."""
        return cls.resolve_adversarial_weight(cfg.loss.lambda_adv)

    @classmethod
    def resolve_adversarial_weight(cls, value: Optional[float]) -> float:
        """``loss.lambda_adv``'s ``value`` (None: null) as this method reads it (``adversarial_weight``)."""
        if value is None:
            return float(cls.lambda_adv_default or 0.0)
        unused = cls.lambda_adv_unused_because()
        if unused is not None and value != cls.lambda_adv_default:
            default = cls.lambda_adv_default
            allowed = "leave it out (null)" + ("" if default is None else f" or give {default:g}")
            raise UserError(f"loss.lambda_adv: {value:g}: the {cls.name} method {unused}; {allowed}")
        return float(value)

    @classmethod
    def lambda_adv_unused_because(cls) -> Optional[str]:
        """Why the method has no term ``loss.lambda_adv`` weighs, or None where it has one."""
        if cls.lambda_adv_unused is None and cls.lambda_adv_default is None:
            return "declares no adversarial term (a method with one sets Method.lambda_adv_default)"
        return cls.lambda_adv_unused

    @classmethod
    def lambda_adv_note(cls) -> str:
        """What a null ``loss.lambda_adv`` means for this method, in a few words (``--print-config``)."""
        unused = cls.lambda_adv_unused_because()
        if unused is not None:
            return f"null: the {cls.name} method {unused}"
        return f"null: the {cls.name} method's default, {cls.resolve_adversarial_weight(None):g}"

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        """What the schema cannot check alone: the method's fit with the model and the data.
        A subclass adding checks calls this one too."""
        cls.adversarial_weight(cfg)
        if cfg.model.generator.aux_head and not cls.trains_aux_output:
            raise UserError(f"model.generator.aux_head: the {cls.name} method trains the main output only; the aux "
                            "head is for multi-level domain adaptation (docs/methods.md \"Domain adaptation\")")
        for key in ("discriminator", "discriminator_aux"):
            section = getattr(cfg.model, key)
            if section is not None and section.kind == "image" and cls.discriminator_kind != "image":
                raise UserError(f"model.{key}.kind: image is s4gan's image-level D; the {cls.name} method's D scores "
                                f"pixels (kind: {cls.discriminator_kind})")
        by = cfg.checkpoint.best_by
        if by != "val/mIoU" and not cls.reads_unlabeled(cfg):
            raise UserError(f"checkpoint.best_by: {by} is a label-free score, logged by a run with unlabeled or target "
                            f"images; this {cls.name} run has none (val/mIoU chooses by the val labels)")
        if by == "proxy/d_confidence" and "discriminator" not in cls.networks(cfg):
            raise UserError(f"checkpoint.best_by: proxy/d_confidence is D's score; this {cls.name} run trains no D")
        if cfg.target_data is None and any(spec.pool == "target" for spec in cls.data_streams(cfg)):
            raise UserError(f"target_data: method {cls.name} adapts to a target domain; give target_data "
                            "(docs/methods.md \"Domain adaptation\")")

    @classmethod
    def reads_unlabeled(cls, cfg: Config) -> bool:
        """Whether it trains on images without labels under ``cfg`` (an unlabeled or target
        stream): its evaluations then log the label-free ``proxy/*`` scores."""
        return any(spec.pool in ("unlabeled", "target") for spec in cls.data_streams(cfg))

    # ---------------------------------------------------------------- what the loop asks besides __call__

    def discriminator_realness(self, images: torch.Tensor, logits: torch.Tensor) -> Optional[torch.Tensor]:
        """D's probability, per D output, that G's maps of ``images`` (``logits``, G's, on G's
        device) are on the side G is trained to imitate (``Labels.real``): the label-free
        ``proxy/d_confidence``. None: it trains no D (the default)."""
        return None

    def checkpoint_state(self) -> Mapping[str, Any]:
        """The method's own state to save and restore with the run, by checkpoint key: each value a
        Stateful (``state_dict`` / ``load_state_dict``; segadv/checkpoint/state.py). The mean
        teacher's mixing RNG; none by default (the networks and streams are saved by the run)."""
        return {}

    def panel(self, images: torch.Tensor) -> Optional[PanelMaps]:
        """Its view of ``images`` (from ``panel_stream``) for TensorBoard; None: it has none."""
        return None

    def training_views(self) -> Optional[TrainingViews]:
        """Its last training batch as its iteration built it (a self-training method's mixed or
        strongly augmented images, their labels and the pixels' weights), for TensorBoard's panel at
        each evaluation. The iteration keeps references to tensors it computed anyway (detached; no
        extra forward, no copy, no host read in the step); the reporter copies what it draws. None:
        it has none (the default), or no iteration ran yet in this process."""
        return None
