"""The schema describes itself: every field of every section carries a one-line description (what
``--help-config`` lists), and the sections reach one another only through fields."""

from __future__ import annotations

import types
import typing
from typing import Any, Iterator

from pydantic import BaseModel

from segadv.config.schema import Config


def _models(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models anywhere inside an annotation (Optional, list, Annotated, unions)."""
    if typing.get_origin(annotation) is None and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation.schema_model()  # the method section: with each registered method's settings
        return
    for arg in typing.get_args(annotation):
        yield from _models(arg)


def every_section() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    todo = [Config]
    while todo:
        model = todo.pop()
        if model in found:
            continue
        found.append(model)
        for info in model.model_fields.values():
            todo.extend(_models(info.annotation))
    return found


def test_every_schema_field_has_a_one_line_description():
    sections = every_section()
    assert len(sections) > 20
    missing = [f"{model.__name__}.{name}" for model in sections for name, info in model.model_fields.items()
               if not (info.description and info.description.strip())]
    assert not missing, f"schema fields without a description: {', '.join(missing)}"
    multiline = [f"{model.__name__}.{name}" for model in sections for name, info in model.model_fields.items()
                 if "\n" in (info.description or "")]
    assert not multiline, f"descriptions on several lines: {', '.join(multiline)}"


def test_the_schema_module_stays_small():
    """config/schema.py holds the sections without machinery of their own; a section that grows a
    mechanism (generated per role, per arch, per method) lives in its own module."""
    from pathlib import Path

    import segadv.config.schema as schema

    assert len(Path(schema.__file__).read_text().splitlines()) <= 450
