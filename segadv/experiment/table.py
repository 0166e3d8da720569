"""``segadv-experiment table RUN_DIR...``: any set of run dirs side by side, grid or not: how each
ended, its steps, final and best val mIoU with their steps, wall time, and the config keys whose
values differ between them (their ``config.yaml``; ``run_dir`` left out).

A key is compared only between the runs that read it: not under a section a run sets to null
(``target_data`` of a run without a target), nor another method's settings (``method.<name>.*``
is read only by the runs of method ``name``). A section set in some runs and null in others is one
column (``target_data``), not one per key in it. Values are shown compactly (lists and mappings in
YAML's flow style, ``null``, ``true``); a column with a value wider than ``WIDTH`` characters shows
its transform lists by the steps' names and cuts its values to ``WIDTH``, as long as two different
values of the column still look different. ``--json`` gives every value whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from segadv.experiment.launcher import IGNORED_KEYS
from segadv.experiment.runs import RunSummary, summarize
from segadv.monitor.status import Score

MISSING = "-"
WIDTH = 60  # a value's cell at most this wide, where the values of its column stay told apart


@dataclass
class RunTable:
    runs: list[RunSummary]
    keys: list[str]  # the config keys that differ between the runs (a null-or-set section: its own key)

    @classmethod
    def of(cls, run_dirs: Sequence[Path]) -> "RunTable":
        runs = [summarize(Path(d)) for d in run_dirs]
        return cls(runs, differing_keys([run.config for run in runs]))

    def to_json(self) -> dict[str, Any]:
        return {"differing_keys": self.keys, "runs": [{
            "run_dir": str(run.run_dir), "outcome": run.outcome,
            "stopped_by": run.status.stopped_by if run.status else None,
            "exit_code": run.status.exit_code if run.status else None,
            "step": run.step, "max_steps": run.max_steps,
            "final": run.final.model_dump() if run.final else None,
            "best": run.best.model_dump() if run.best else None,
            "wall_s": run.wall_s,
            "config": {key: value_of(run.config, key, None) for key in self.keys},
        } for run in self.runs]}

    def markdown(self) -> str:
        head = ["run", "outcome", "steps", "final mIoU (step)", "best mIoU (step)", "wall", *self.keys]
        columns = [_cells([value_of(run.config, key) if reads(run.config, key) else MISSING for run in self.runs])
                   for key in self.keys]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for i, run in enumerate(self.runs):
            cells = [str(run.run_dir), run.outcome_text, _steps(run), _score(run.final), _score(run.best),
                     _wall(run.wall_s), *(column[i] for column in columns)]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        notes = []
        if any(run.outcome == "unknown" for run in self.runs):
            notes.append("unknown: no status.json (a run from before it, or a start that failed); its steps and "
                         "scores are read from metrics.jsonl.")
        if any(run.outcome == "killed" for run in self.runs):
            notes.append("killed: its status.json says running, but no process holds the run dir.")
        if any(MISSING in column for column in columns):
            notes.append(f"{MISSING} in a config column: the run does not read that key (it is under a section the "
                         "run sets to null, or another method's settings), or its config.yaml lacks it.")
        if not self.keys and len(self.runs) > 1:
            notes.append("The runs' configs are the same (run_dir aside).")
        return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


class _Missing:
    """A key a config lacks (a ``config.yaml`` written before the key existed)."""

    def __repr__(self) -> str:
        return MISSING


ABSENT = _Missing()


def reads(config: Mapping[str, Any], key: str) -> bool:
    """Whether a run with the flattened ``config`` reads ``key``: not where a section above it is
    null (``target_data.root`` of a run without a target), nor another method's settings
    (``method.<name>.*`` where ``method.name`` is another)."""
    parts = key.split(".")
    if any(config.get(".".join(parts[:n]), ABSENT) is None for n in range(1, len(parts))):
        return False
    method = config.get("method.name")
    return not (len(parts) > 2 and parts[0] == "method" and isinstance(method, str) and parts[1] != method)


def value_of(config: Mapping[str, Any], key: str, missing: Any = ABSENT) -> Any:
    """``key``'s value in the flattened ``config``; a section's (a key with keys under it) as its
    mapping; ``missing`` where it has neither."""
    if key in config:
        return config[key]
    below = {k[len(key) + 1:]: v for k, v in config.items() if k.startswith(key + ".")}
    if not below:
        return missing
    nested: dict[str, Any] = {}
    for name, value in below.items():
        *sections, leaf = name.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return nested


def differing_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys whose values differ between the runs that read them (:func:`reads`), in the order
    of the configs; a section null in some runs and set in others as the section's own key (its
    keys then compared between the runs that set it)."""
    # Every key and section in the configs' order (a section where its first key is), and the
    # sections some run sets (keys lie under them).
    order: dict[str, None] = {}
    parents: set[str] = set()
    for config in configs:
        for key in config:
            parts = key.split(".")
            order.update(dict.fromkeys(".".join(parts[:n]) for n in range(1, len(parts) + 1)))
            parents.update(".".join(parts[:n]) for n in range(1, len(parts)))
    sections = {key for config in configs for key, value in config.items() if value is None and key in parents}
    keys = [key for key in order if key not in IGNORED_KEYS and (key in sections or any(key in c for c in configs))]
    differing = []
    for key in keys:
        readers = [config for config in configs if reads(config, key)]
        if key in sections:  # null, set or absent
            seen = {_state(value_of(config, key)) for config in readers}
        else:
            seen = {repr(config.get(key, ABSENT)) for config in readers}
        if len(seen) > 1:
            differing.append(key)
    return differing


def _state(value: Any) -> str:
    return "null" if value is None else "absent" if value is ABSENT else "set"


def compact(value: Any, brief: bool = False) -> str:
    """A config value as one line: lists and mappings in YAML's flow style, ``null``, ``true``,
    floats as Python writes them (``0.001``, ``1e-05``). ``brief``: a mapping with a ``name`` (an
    albumentations step, ``{name: HorizontalFlip, p: 0.5}``) as its name alone."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(compact(item, brief) for item in value) + "]"
    if isinstance(value, Mapping):
        if brief and isinstance(value.get("name"), str):
            return compact(value["name"])
        return "{" + ", ".join(f"{key}: {compact(item, brief)}" for key, item in value.items()) + "}"
    return " ".join(str(value).split()) if isinstance(value, str) else repr(value)


def _cells(values: Sequence[Any]) -> list[str]:
    """A column's cells, each value :func:`compact`. Where one is wider than ``WIDTH``, the column
    is shown brief (steps by their names) and cut to ``WIDTH``, as long as the column's different
    values still look different (else less shortened, or whole)."""
    whole = [compact(value) for value in values]
    if all(len(text) <= WIDTH for text in whole):
        return whole
    brief = [compact(value, brief=True) for value in values]
    distinct = len(set(whole))
    for cells in ([_cut(text) for text in brief], brief, [_cut(text) for text in whole]):
        if len(set(cells)) == distinct:
            return cells
    return whole


def _cut(text: str) -> str:
    return text if len(text) <= WIDTH else text[:WIDTH - 1].rstrip() + "…"


def _steps(run: RunSummary) -> str:
    if run.step is None:
        return MISSING
    return f"{run.step}/{run.max_steps}" if run.max_steps is not None else str(run.step)


def _score(score: Optional[Score]) -> str:
    if score is None:
        return MISSING
    return f"{score.mIoU:.4f} ({score.step})" + (f", chosen by {score.by}" if score.by else "")


def _wall(seconds: Optional[float]) -> str:
    if seconds is None:
        return MISSING
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 60:.1f} min"
