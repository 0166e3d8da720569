"""Samples dropped under ``data.on_error=skip``: counted, logged, listed in ``RUN/skipped.json``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from segadv.data.files import Problem
from segadv.fsutil import atomic_write_text

__all__ = ["SKIPPED_FILE", "SkipRecorder"]

log = logging.getLogger(__name__)

SKIPPED_FILE = "skipped.json"


class SkipRecorder:
    """Samples dropped under ``data.on_error=skip``: counted, logged, listed in the run dir.

    Start-up problems are added directly; samples that fail later, when read (possibly in a
    worker process), are picked up from the datasets' shared flags by :meth:`poll`, which the
    loaders call after every batch (a few microseconds when nothing changed).

    The file is written only where a data section's ``on_error`` is skip (:meth:`follow`): there
    it lists what was dropped, none included; under raise nothing is ever dropped, so no file
    claims otherwise.
    """

    def __init__(self, run_dir: Optional[Path] = None) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.problems: list[Problem] = []
        self.skipping = False  # a data section followed skips (its samples may be dropped)
        self._watched: list[list[Any]] = []  # [dataset, flags seen]

    def follow(self, on_error: str) -> None:
        """A data section whose samples this recorder records, by its ``on_error`` policy."""
        self.skipping = self.skipping or on_error == "skip"

    @property
    def count(self) -> int:
        return len(self.problems)

    def in_split(self, split: str) -> list[Problem]:
        """The samples of ``split`` dropped so far (at start-up and as they were read)."""
        return [p for p in self.problems if p.split == split]

    def add(self, problems: Sequence[Problem]) -> None:
        for p in problems:
            log.warning("skipping %s sample '%s': %s", p.split, p.id, p.message)
        self.problems.extend(problems)
        self.write()

    def watch(self, dataset: Any) -> None:
        if getattr(dataset, "on_error", None) == "skip" and hasattr(dataset, "bad"):
            self._watched.append([dataset, 0])

    def poll(self) -> None:
        for entry in self._watched:
            dataset, seen = entry
            flagged = int(torch.count_nonzero(dataset.bad))
            if flagged == seen:
                continue
            entry[1] = flagged
            known = {(p.split, p.id) for p in self.problems}
            new = [dataset.problem(i) for i in dataset.flagged()
                   if (dataset.split, dataset.samples[i].id) not in known]
            self.add(new)
            log.warning("%d samples skipped so far (data.on_error=skip)", self.count)

    def write(self) -> None:
        if self.run_dir is None or not (self.skipping or self.problems):
            return
        data = {"count": self.count, "samples": [p.as_dict() for p in self.problems]}
        atomic_write_text(self.run_dir / SKIPPED_FILE, json.dumps(data, indent=1) + "\n")
