"""``method``: ``name`` picks the method, and each registered method with settings has its section
under its name (``method.advsemiseg``), the method class's own model (segadv/methods)."""

from __future__ import annotations

import functools
import importlib
from typing import Any

from pydantic import Field, create_model, field_validator, model_validator

from segadv.config.section import Section, registered_choice


class MethodConfig(Section):
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

    @model_validator(mode="wrap")
    @classmethod
    def _with_sections(cls, data: Any, handler: Any) -> Any:
        if cls is not MethodConfig or isinstance(data, MethodConfig):
            return handler(data)  # the registered subclass's own fields, or one already validated
        return cls.registered().model_validate(data)

    @classmethod
    def schema_model(cls) -> type[MethodConfig]:
        return cls.registered()

    @classmethod
    def registered(cls) -> type[MethodConfig]:
        """The section as the registry stands: ``name`` and each registered method's settings."""
        return _method_sections(tuple((name, method.config) for name, method in registered_methods().items()
                                      if method.config is not None))

    def __reduce__(self) -> tuple:
        # The registered subclass is built at run time, so it is pickled as its values.
        return _validated_method_config, (self.model_dump(),)


# The method registry imports this module (each method's section is a Section and its class reads
# a Config), so the schema finds the registry by its module name when it first validates a method
# section, rather than importing it here.
METHOD_REGISTRY = "segadv.methods.registry"


def registered_methods() -> dict[str, Any]:
    """``method.name`` -> the method's class (``segadv.methods.registry.METHODS``)."""
    return importlib.import_module(METHOD_REGISTRY).METHODS


@functools.lru_cache(maxsize=None)
def _method_sections(sections: tuple[tuple[str, type[Section]], ...]) -> type[MethodConfig]:
    return create_model("MethodConfig", __base__=MethodConfig, __module__=__name__,
                        **{name: (model, Field(default_factory=model, description=f"method {name}'s settings"))
                           for name, model in sections})


def _validated_method_config(data: dict[str, Any]) -> MethodConfig:
    return MethodConfig.model_validate(data)
