"""What every config section is, and the value ranges the sections share (torch-free)."""

from __future__ import annotations

from typing import Annotated, Any, Mapping

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)

    @classmethod
    def schema_model(cls) -> type[Section]:
        """The model whose fields a config's section has: this one, except where they depend on
        what is registered (``MethodConfig``, the per-network sections, ``model.generator``)."""
        return cls

    @classmethod
    def carried_over(cls, below: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
        """What this section's keys in lower config layers (``below``) keep under a ``layer`` that
        sets some of its keys (the loader merges layers): all of them, except where a key of the
        layer chooses another kind of section whose keys they are not."""
        return dict(below)


# Reusable ranges. Seeds feed numpy (below 2**32) after the rank is added, hence 2**31.
Seed = Annotated[int, Field(ge=0, lt=2**31)]
Count = Annotated[int, Field(gt=0, le=10**9)]  # steps, intervals: positive and far from int64's edge
Weight = Annotated[float, Field(ge=0, le=1e6)]  # a loss term's weight (0: off)
Probability = Annotated[float, Field(ge=0, le=1)]
Beta = Annotated[float, Field(ge=0, lt=1)]


def registered_choice(name: str, registered) -> str:
    """``name`` where it is one of ``registered`` (a registry's names); else the error a Literal's
    mismatch gives, listing the names it could be (reported by the loader as "expected ...")."""
    if name not in registered:
        *others, last = map(repr, registered)
        expected = f"{', '.join(others)} or {last}" if others else last
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
    return name
