"""The per-network sections (``model``, ``optim``, ``amp``, ``parallel``, ``compile``, ``init``),
one entry per registered role (segadv/config/roles.py), generated from the role table
(segadv/config/registered.py, the mechanism the method section and ``model.generator`` share).

Which roles a section has an entry for, and what the entry holds, is the section's row below
(``NETWORK_SECTIONS``); what a role's entry defaults to is its kind's (``KINDS``: a generator or a
discriminator). A role with a fallback has an optional entry, null by default: where it is null the
role takes its fallback's value, in one place, ``segadv.config.roles.setting``. A validated section is
an instance of a subclass with one field per role as the table stands (``registered()``), so
``cfg.optim.discriminator.lr`` reads as any other setting, and a role a plugin or a test registers
gets its own keys, validated and listed by ``--help-config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping, Optional

from pydantic import Field, SerializeAsAny, ValidationInfo, field_validator

from segadv.config.generator_section import GeneratorConfig
from segadv.config.network_settings import (
    DiscriminatorConfig,
    InitSource,
    NetworkAmpConfig,
    OptimizerConfig,
    ParallelMode,
)
from segadv.config.roles import KINDS as ROLE_KINDS, ROLES, RoleSpec, role
from segadv.config.registered import RegisteredSection, declared, generated, is_generated
from segadv.config.section import Section


@dataclass(frozen=True)
class Kind:
    """What a role built as a generator or a discriminator (``RoleSpec.kind``) has of its own."""

    model: type[Section]  # its model.<role> entry (a generator's: the arch's section)
    optimizer: Callable[[], OptimizerConfig]  # its optimizer where a config names none
    splits_head: bool  # whether optim.<role>.head_lr_mult / head_weight_decay apply (an encoder and a head)


KINDS: dict[str, Kind] = {
    # AdvSemiSeg's G and D optimisers.
    "generator": Kind(GeneratorConfig,
                      lambda: OptimizerConfig(name="sgd", lr=2.5e-4, momentum=0.9, weight_decay=5e-4), True),
    "discriminator": Kind(DiscriminatorConfig, lambda: OptimizerConfig(name="adam", lr=1e-4, betas=[0.9, 0.99]), False),
}
assert set(KINDS) == set(ROLE_KINDS), "each kind of network a role may be built as has its settings here"


@dataclass(frozen=True)
class NetworkSection:
    """One per-network section: which roles have an entry, its type and default for a role of each
    kind, and the keys it holds besides (shared by every network)."""

    name: str  # the config key: model, optim, ...
    what: str  # what an entry is, for its description: "G's <what>"
    entry: Callable[[Kind], tuple[Any, Callable[[], Any]]]  # a kind's entry type and default
    takes: Callable[[RoleSpec], bool] = lambda spec: True  # the roles it has an entry for
    shared: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)  # name -> (type, Field)
    falls_back: bool = True  # False: every entry is its role's own, null by default (init)
    check: Optional[Callable[[RoleSpec, Any], None]] = None  # an entry against its role

    def description(self, spec: RoleSpec) -> str:
        text = f"{spec.called}'s {self.what}"
        if not self.falls_back:
            return f"{text}; null: fresh"
        if spec.falls_back_to is not None:
            text += f"; null: {role(spec.falls_back_to).called}'s"
        return text


def _one_group(spec: RoleSpec, optim: Optional[OptimizerConfig]) -> None:
    """A D is one network with no encoder: no backbone and head to set apart."""
    if optim is not None and not KINDS[spec.kind].splits_head:
        for key, default in (("head_lr_mult", 1.0), ("head_weight_decay", None), ("layer_decay", 1.0)):
            if getattr(optim, key) != default:
                raise ValueError(f"{key} is G's (its encoder against its head); {spec.name} has no "
                                 f"encoder: leave it at {default}")


COMPILE_MODES = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]

NETWORK_SECTIONS: dict[str, NetworkSection] = {section.name: section for section in (
    # A copy of another role's network (the teacher) is that network: no model of its own.
    NetworkSection("model", "network", lambda kind: (SerializeAsAny[kind.model], kind.model),
                   takes=lambda spec: spec.starts_as is None),
    # Only a trained network has an optimizer.
    NetworkSection("optim", "optimizer",
                   lambda kind: (OptimizerConfig, kind.optimizer), takes=lambda spec: spec.trained, check=_one_group),
    NetworkSection("amp", "mixed precision",
                   lambda kind: (NetworkAmpConfig, NetworkAmpConfig)),
    # An untrained network has no gradients to sync: no wrapper of its own.
    NetworkSection("parallel", "wrapper: auto, none, dp, ddp or fsdp",
                   lambda kind: (ParallelMode, lambda: "auto"), takes=lambda spec: spec.trained,
                   shared={"sync_bn": (bool, Field(False, description="convert G's BatchNorm to SyncBatchNorm under DDP"))}),
    NetworkSection("compile", "torch.compile of its forward",
                   lambda kind: (bool, lambda: False), shared={
                       "mode": (Optional[COMPILE_MODES], Field(
                           None, description="torch.compile's mode; null: its default (reduce-overhead adds CUDA "
                                             "graphs on CUDA)")),
                       # inductor generates kernels (C++ on the CPU: needs a C++ compiler; Triton on CUDA).
                       # aot_eager and eager generate none, so they check a model's compilability in seconds.
                       "backend": (Literal["inductor", "aot_eager", "eager"], Field(
                           "inductor", description="torch.compile's backend: inductor (generates kernels), "
                                                   "aot_eager or eager (checks only)"))}),
    # Weights are one network's own: a role that takes its settings from another starts fresh or as
    # the copy it starts as, never from a file of its own.
    NetworkSection("init", "starting weights", lambda kind: (InitSource, lambda: None),
                   takes=lambda spec: spec.falls_back_to is None, falls_back=False),
)}


class RoleSections(RegisteredSection):
    """A per-network section as the role table stands: its subclass per table (``registered()``)
    has one field per role the section's row takes."""

    section: ClassVar[str]  # its row's name in NETWORK_SECTIONS

    @classmethod
    def validated_as(cls, data: Mapping[str, Any]) -> type[RoleSections] | None:
        return None if is_generated(cls) else cls.registered()

    @classmethod
    def schema_model(cls) -> type[RoleSections]:
        return cls.registered()

    @classmethod
    def registered(cls) -> type[RoleSections]:
        static = declared(cls)
        specs = tuple(ROLES.values())
        return generated(static, specs, lambda: _role_fields(NETWORK_SECTIONS[static.section], specs))


def _role_fields(row: NetworkSection, specs: tuple[RoleSpec, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A per-network section's fields (an entry per role its row takes, and the keys it holds
    besides) and the validator of each entry against its role."""
    fields: dict[str, Any] = {}
    for spec in specs:
        if not row.takes(spec):
            continue
        kind_type, default = row.entry(KINDS[spec.kind])
        if row.falls_back and spec.falls_back_to is None:
            fields[spec.name] = (kind_type, Field(default_factory=default, description=row.description(spec)))
        else:
            fields[spec.name] = (Optional[kind_type], Field(None, description=row.description(spec)))
    validators = {}
    if row.check is not None:
        by_name = {spec.name: spec for spec in specs if spec.name in fields}

        def check(cls: type, value: Any, info: ValidationInfo) -> Any:
            row.check(by_name[info.field_name], value)
            return value

        validators["_entry_fits_role"] = field_validator(*by_name)(check)
    return {**fields, **dict(row.shared)}, validators


class ModelConfig(RoleSections):
    """The networks."""

    section: ClassVar[str] = "model"


class OptimConfig(RoleSections):
    """Optimizers and their schedules."""

    section: ClassVar[str] = "optim"


class AmpConfig(RoleSections):
    """Mixed precision per network."""

    section: ClassVar[str] = "amp"


class ParallelConfig(RoleSections):
    """Each network is wrapped on its own (never one wrapper around both).

    auto: ddp under a multi-process launch, dp when the device map lists a replica set
    (``g:1+2``), else none.
    """

    section: ClassVar[str] = "parallel"


class CompileConfig(RoleSections):
    """``torch.compile`` per network (docs/training.md "Compiling"): each network's forward (and so its
    backward) compiled on its own device, in place, so parameter names, state dicts, checkpoints and
    the wrappers see the same module; the hand-over between devices, the losses, the GradScaler and
    the optimizer steps stay eager. Evaluation (eval mode, no_grad) and each new batch size may
    compile once more; after the first evaluation no step recompiles."""

    section: ClassVar[str] = "compile"


class InitConfig(RoleSections):
    """Weights to start from (any format the checkpoint loader accepts); strict unless excluded."""

    section: ClassVar[str] = "init"


def section_default(cls: type[RoleSections]) -> Callable[[], RoleSections]:
    """The default of a config's per-network section: its entries' defaults as the table stands."""
    return lambda: cls.model_validate({})
