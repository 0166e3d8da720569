"""Every config key with its type, default and meaning, read from the schema (``segadv-train
--help-config``), so the listing cannot drift from what the loader accepts.

A key's meaning is its field's ``description``; its constraints (``> 0``, ``>= 1``) come from the
field's metadata. A section that appears twice (``amp.generator``, ``amp.discriminator``) is
listed in full each time; an optional section of a class already listed
(``model.discriminator_aux``, ``target_data``) is one line naming the section it is like, its keys
listed in full where a prefix names it or a key in it (``--help-config target_data.batch_size``).
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Optional

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from segadv.config.schema import Config
from segadv.errors import UserError

_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "length >="),
           ("max_length", "length <="))


@dataclass(frozen=True)
class Key:
    """One dotted key (``train.max_steps``) as the schema declares it."""

    name: str
    type: str  # e.g. "int > 0", "deeplabv3 | deeplabv3plus", "str or null"
    default: str  # YAML, or "(required)"
    description: str  # "" where the field has none
    section: bool = False  # a section heading (its keys follow), not a settable value


def _section_class(annotation: Any) -> tuple[Optional[type[BaseModel]], bool]:
    """The section class of a field (``Optional[X]`` -> X, optional=True), or (None, False)."""
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        if len(args) != 1:
            return None, False
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Annotated:  # SerializeAsAny[X]: the section X
        annotation = typing.get_args(annotation)[0]
    # typing.get_origin first: on Python 3.10 a generic alias (list[int]) is an instance of type too
    if typing.get_origin(annotation) is None and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, optional
    return None, False


def type_text(annotation: Any) -> str:
    """A type as a user writes its values: ``a | b`` for a Literal, ``X or null`` for Optional."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:  # a constrained item type (betas: each in [0, 1)): its bounds beside it
        constraints = [m for item in args[1:] for m in getattr(item, "metadata", [item])]
        return type_text(args[0]) + _bounds_text(constraints)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        values = [type_text(a) for a in args if a is not type(None)]
        text = " or ".join(values)
        return f"{text} or null" if type(None) in args else text
    if origin in (list, tuple, set):
        inner = ", ".join(type_text(a) for a in args if a is not Ellipsis)
        if " " in inner:  # the item's own bounds apart from the list's: list of (float >= 0, < 1)
            inner = f"({inner})"
        return f"list of {inner}" if inner else "list"
    if origin is dict:
        return "mapping"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type):
        return {"str": "str", "int": "int", "float": "float", "bool": "bool"}.get(annotation.__name__,
                                                                                    annotation.__name__)
    return str(annotation).replace("typing.", "")


def _bounds(field: Any) -> str:
    return _bounds_text(field.metadata)


def _bounds_text(metadata: list[Any]) -> str:
    found = []
    for item in metadata:
        for attr, sign in _BOUNDS:
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return (" " + ", ".join(found)) if found else ""


def _default_text(field: Any, value: Any = PydanticUndefined) -> str:
    """``value`` (the enclosing section's default holds it), else the field's own default, as YAML."""
    if value is PydanticUndefined:
        if field.is_required():
            return "(required)"
        value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("...").strip()


def _description(field: Any, cls: Optional[type[BaseModel]] = None) -> str:
    text = field.description or ""
    if not text and cls is not None and cls.__doc__:  # a section's class says what it is: its first sentence
        first, stop, _ = " ".join(cls.__doc__.split()).partition(". ")
        text = first + ("." if stop else "")
    return " ".join(text.split())


def keys(model: type[BaseModel] = Config, expand: str = "") -> Iterator[Key]:
    """Every key of ``model``, depth first in schema order, each section's heading before its keys.
    A section like one listed before is one line, but listed in full (its class's defaults) where
    ``expand`` (a dotted key) is that section or lies inside it."""
    seen: dict[type[BaseModel], str] = {}

    def walk(cls: type[BaseModel], prefix: str, instance: Optional[BaseModel]) -> Iterator[Key]:
        # Defaults come from the enclosing section's default instance where there is one:
        # data.folder.train.images is "train/images" there, "images" in its class. A section
        # whose fields depend on what is registered (method) lists them as registered now.
        cls = cls.schema_model() if hasattr(cls, "schema_model") else cls
        for name, field in cls.model_fields.items():
            key = f"{prefix}{name}"
            # (a key of another arch than the default's is not on the default instance: its own default)
            value = getattr(instance, name, PydanticUndefined) if instance is not None else PydanticUndefined
            section, optional = _section_class(field.annotation)
            if section is None:
                yield Key(key, type_text(field.annotation) + _bounds(field), _default_text(field, value),
                          _description(field))
                continue
            if optional and section in seen:
                yield Key(key, f"section like {seen[section]}, or null", _default_text(field, value),
                          _description(field, section))
                if expand == key or expand.startswith(key + "."):
                    yield from walk(section, f"{key}.", value if isinstance(value, BaseModel) else None)
                continue
            seen.setdefault(section, key)
            kind = "section, or null" if optional else "section"
            default = _default_text(field, value) if optional else ""
            yield Key(key, kind, default, _description(field, section), section=True)
            yield from walk(section, f"{key}.", value if isinstance(value, BaseModel) else None)

    yield from walk(model, "", model())


def key_listing(prefix: str = "", model: type[BaseModel] = Config) -> str:
    """The listing of every key under ``prefix`` (a dotted key or section; "": all): one line
    ``key: type = default`` and its meaning indented below. An unknown prefix is a UserError
    naming the top-level sections."""
    prefix = prefix.strip().rstrip(".")
    selected = [k for k in keys(model, expand=prefix) if not prefix or k.name == prefix or k.name.startswith(prefix + ".")]
    if not selected:
        top = ", ".join(name for name in model.model_fields)
        raise UserError(f"--help-config {prefix}: no config key or section of that name; the sections and "
                        f"top-level keys: {top}")
    lines = ["# key: type = schema default (a config's own values: --config NAME --print-config)"]
    for key in selected:
        if key.section:
            head = f"{key.name}: {key.type}" + (f" = {key.default}" if key.default else "")
        else:
            head = f"{key.name}: {key.type} = {key.default}"
        lines.append(head)
        if key.description:
            lines.append(f"    {key.description}")
    return "\n".join(lines) + "\n"
