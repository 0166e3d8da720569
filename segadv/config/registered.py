"""The one mechanism behind the sections whose keys depend on what is registered: the per-network
sections (one entry per role of the role table, segadv/config/network_sections.py), ``model.generator``
(the section of the arch its ``arch`` names, segadv/models/registry.py) and ``method`` (a section per
registered method, segadv/config/method_section.py).

Such a section's declared class (``ModelConfig``, ``GeneratorConfig``, ``MethodConfig``) says which
class a mapping of its keys is validated as, as the registry stands (:meth:`validated_as`): a class
generated from the registry (:func:`generated`, built once per state of the registry) or a
registered one (an arch's section). Validated, built (``Cls(**keys)``) or pickled, a section is an
instance of that class, and a registry that grows (a role, an arch or a method a plugin or a test
registers) gives the next config its keys, validated and listed by ``--help-config``
(:meth:`~segadv.config.section.Section.schema_model`).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping, Optional

from pydantic import create_model, model_validator

from segadv.config.section import Section


class RegisteredSection(Section):
    """A section validated as the class its registry gives (:meth:`validated_as`)."""

    @classmethod
    def validated_as(cls, data: Mapping[str, Any]) -> Optional[type[RegisteredSection]]:
        """The class a mapping of this section's keys (``data``) is validated as; None: this class."""
        return None

    def __new__(cls, *args: Any, **data: Any) -> RegisteredSection:
        return super().__new__(cls.validated_as(data) or cls)

    @model_validator(mode="wrap")
    @classmethod
    def _as_registered(cls, data: Any, handler: Any) -> Any:
        chosen = None if isinstance(data, cls) else cls.validated_as(data if isinstance(data, Mapping) else {})
        if chosen is None or chosen is cls:
            return handler(data)  # this class's own fields, or a section validated already
        return chosen.model_validate(data)

    def __reduce__(self) -> tuple:
        # A generated class is not importable: the section is pickled as its declared class and values.
        return _revalidated, (declared(type(self)), self.model_dump())


def _revalidated(cls: type[RegisteredSection], data: dict[str, Any]) -> RegisteredSection:
    return cls.model_validate(data)


_GENERATED: dict[tuple[type, Hashable], type] = {}
_DECLARED: dict[type, type] = {}


def generated(static: type[RegisteredSection], state: Hashable,
              fields: Callable[[], tuple[dict[str, Any], dict[str, Any]]]) -> type[RegisteredSection]:
    """``static``'s subclass for the registry's ``state``: ``fields()`` gives its fields (name ->
    (type, Field)) and validators, called once per state."""
    model = _GENERATED.get((static, state))
    if model is None:
        own, validators = fields()
        model = create_model(static.__name__, __base__=static, __module__=static.__module__, __doc__=static.__doc__,
                             __validators__=validators, **own)
        _GENERATED[(static, state)] = model
        _DECLARED[model] = static
    return model


def is_generated(cls: type) -> bool:
    return cls in _DECLARED


def declared(cls: type) -> type:
    """The declared class a generated one was made from (a class not generated: itself)."""
    return _DECLARED.get(cls, cls)
