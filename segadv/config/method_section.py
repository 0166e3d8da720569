"""``method``: ``name`` picks the method, and each registered method with settings has its section
under its name (``method.advsemiseg``), the method class's own model (segadv/methods)."""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from pydantic import Field, field_validator

from segadv.config.registered import RegisteredSection, generated
from segadv.config.section import registered_choice


class MethodConfig(RegisteredSection):
    """What one training iteration does (docs/methods.md): ``name`` picks the method, and each
    registered method with settings has its section under its name (``method.advsemiseg``).

    The methods are registered in ``segadv.methods.registry`` (a plugin adds its own there), and
    each method's class holds its section's model: this section is validated against them. Every
    registered method's section is kept, not only ``name``'s, so that a run can switch methods with
    ``method.name=...`` over a config that sets another method's settings (an experiment grid's
    rows). A validated ``MethodConfig`` is an instance of a subclass with one field per section
    (``registered()``), so ``cfg.method.advsemiseg.semi_start`` reads as any other setting.
    """

    name: str = Field("supervised", description="the method: what one training iteration does (a registered "
                                                 "method's name; docs/methods.md)")

    @field_validator("name")
    @classmethod
    def _registered_name(cls, name: str) -> str:
        return registered_choice(name, registered_methods())

    @classmethod
    def validated_as(cls, data: Mapping[str, Any]) -> type[MethodConfig] | None:
        return cls.registered() if cls is MethodConfig else None

    @classmethod
    def schema_model(cls) -> type[MethodConfig]:
        return cls.registered()

    @classmethod
    def registered(cls) -> type[MethodConfig]:
        """The section as the registry stands: ``name`` and each registered method's settings."""
        sections = tuple((name, method.config) for name, method in registered_methods().items()
                         if method.config is not None)
        return generated(MethodConfig, sections, lambda: ({
            name: (model, Field(default_factory=model, description=f"method {name}'s settings"))
            for name, model in sections}, {}))


# The method registry imports this module (each method's section is a Section and its class reads
# a Config), so the schema finds the registry by its module name when it first validates a method
# section, rather than importing it here.
METHOD_REGISTRY = "segadv.methods.registry"


def registered_methods() -> dict[str, Any]:
    """``method.name`` -> the method's class (``segadv.methods.registry.METHODS``)."""
    return importlib.import_module(METHOD_REGISTRY).METHODS
