"""When each term of a method's loss is on: from its start step while its weight is nonzero.

Every method asks its ``Schedule`` whether a term is active, so the steps where a term switches on
are stated once, here, and ``segadv-plan`` runs the iteration at each of them (a branch taken only
from ``semi_start`` on is planned at ``semi_start``): a new method cannot forget to list them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    weight: float
    start: int  # the first step (completed steps before it) at which the term is on


class Schedule:
    def __init__(self, **terms: tuple[float, int]) -> None:
        self.terms = {name: Term(float(weight), int(start)) for name, (weight, start) in terms.items()}

    def active(self, name: str, step: int) -> bool:
        term = self.terms[name]
        return term.weight > 0 and step >= term.start

    def switch_steps(self) -> tuple[int, ...]:
        """The steps after the first at which a term switches on, ascending."""
        return tuple(sorted({t.start for t in self.terms.values() if t.weight > 0 and t.start > 0}))
