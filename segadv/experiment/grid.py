"""An experiment grid: configs x seeds, read from YAML and validated by a pydantic model.

    name: semi                       # default output: runs/experiments/<name>
    seeds: [0, 1, 2]
    baseline: CE only                # optional: the row the others are compared with
    common_overrides: []             # appended to every run (a key here cannot be a row's too)
    rows:
      - name: CE only
        config: semi                 # a config file, or a shipped config's name
        overrides: [method.name=supervised, loss.lambda_adv=0]
      - name: CE only, all labeled (reference)
        config: semi
        overrides: [data.labeled_fraction=1.0]
        seeds: [0]                   # a row may run its own seeds (``--seeds`` overrides all)
                                     # and name its own baseline (``baseline: <row name>``)

A mistake is a :class:`segadv.errors.UserError` (exit 2) naming the grid file and the key. The
file is read as a config is (segadv/config/loading.py: its caps, duplicate keys refused); seeds are
in ``train.seed``'s range; the name is one directory's (not empty, ``.``, ``..`` or a path), as a
row's directory is; a row's override that a common override would replace, in either form
(``train.max_steps=5`` or ``train={max_steps: 5}``), is refused, and so is an override of what the
launcher sets for each run (``run_dir``). That every run's config loads is
checked before the first run (segadv/experiment/launcher.py, :func:`check_runs`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, TypeAdapter, ValidationError, model_validator

from segadv.config import resolve_config
from segadv.config.loading import override_settings, read_yaml
from segadv.config.schema import Seed
from segadv.errors import UserError


def distinct_seeds(seeds: list[int]) -> list[int]:
    """Each seed once: each has a run dir of its own."""
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"seed(s) {', '.join(map(str, repeated))} listed twice")
    return seeds


def dotted_override(text: str) -> str:
    if "=" not in text or text.startswith("-"):
        raise ValueError(f"{text!r} is not a dotted key=value override")
    return text


def override_key(text: str) -> str:
    """``a.b=1`` -> ``a.b``."""
    return text.split("=", 1)[0].strip()


def covers(key: str, setting: str) -> bool:
    """Whether setting dotted key ``key`` replaces ``setting`` or lies inside it (``train`` and
    ``train.max_steps`` either way round, or the same key)."""
    a, b = key.split("."), setting.split(".")
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def slug(name: str) -> str:
    """``name`` as one directory's name: lower case letters and digits, each other run of
    characters one ``-`` (a row's run directory)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def directory_name(name: str) -> str:
    """A grid's name, which names its output directory (``runs/experiments/<name>``): one path
    component, as a row's directory is (:func:`slug`), so that no grid writes beside or outside
    the others'."""
    if name in ("", ".", "..") or not name.strip() or any(c in name for c in "/\\\0"):
        safe = slug(name)
        fix = f"e.g. {safe!r}" if safe else "letters, digits and -"
        raise ValueError(f"{name!r} cannot name the grid's output directory (runs/experiments/<name>): a name is one "
                         f"folder's, not empty, not . or .., without / or \\; use {fix}, or leave name out (the grid "
                         "file's stem)")
    return name


# The launcher gives each run its own run dir (OUT/<row>/seed<k>, segadv/experiment/results.py)
# and passes it as --run-dir, which would replace a run_dir override.
LAUNCHER_KEYS = ("run_dir",)

Seeds = Annotated[list[Annotated[Seed, Strict()]], Field(min_length=1), AfterValidator(distinct_seeds)]
Override = Annotated[str, AfterValidator(dotted_override)]


class Row(BaseModel):
    """One line of the table: a config and its overrides, run once per seed."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    config: str = Field(min_length=1)
    overrides: list[Override] = []
    seeds: Optional[Seeds] = None  # None: the grid's (a reference row may run fewer)
    baseline: Optional[str] = None  # the row it is compared with; None: the grid's

    @property
    def slug(self) -> str:
        """The row's directory under the grid's output."""
        return slug(self.name) or "row"


class Grid(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Optional[Annotated[str, AfterValidator(directory_name)]] = None  # None: the file's stem
    seeds: Seeds = [0]
    rows: list[Row] = Field(min_length=1)
    common_overrides: list[Override] = []
    baseline: Optional[str] = None  # the row every other row is compared with

    @model_validator(mode="after")
    def _rows_agree(self) -> "Grid":
        names: list[str] = []
        for i, row in enumerate(self.rows):
            if row.name in names:
                raise ValueError(f"rows[{i}]: row name {row.name!r} is used twice")
            clash = next((r for r in self.rows[:i] if r.slug == row.slug), None)
            if clash is not None:
                raise ValueError(f"rows[{i}]: row names {clash.name!r} and {row.name!r} share the run directory "
                                 f"{row.slug}")
            names.append(row.name)
        for where, wanted in [("baseline", self.baseline),
                              *((f"rows[{i}].baseline", r.baseline) for i, r in enumerate(self.rows))]:
            if wanted is not None and wanted not in names:
                raise ValueError(f"{where}: no row is named {wanted!r}; rows: {', '.join(map(repr, names))}")
        self_compared = next((r.name for r in self.rows if r.baseline == r.name), None)
        if self_compared is not None:
            raise ValueError(f"row {self_compared!r} names itself as its baseline")
        # The common overrides come after a row's on the command line, so a key set in both would
        # silently take the common value: the row's setting would never run. A common override
        # replaces what lies under its key, and a row's mapping value sets each of its leaves.
        common = [override_key(o) for o in self.common_overrides]
        for where, overrides in [("common_overrides", self.common_overrides),
                                 *((f"rows[{i}] ({row.name!r}).overrides", row.overrides)
                                   for i, row in enumerate(self.rows))]:
            _no_launcher_keys(where, overrides)
        for i, row in enumerate(self.rows):
            try:
                settings = [key for o in row.overrides for key in override_settings(o)]
            except UserError as err:
                raise ValueError(f"rows[{i}].overrides: {err}") from None
            shadowed = sorted({s for s in settings if any(covers(key, s) for key in common)})
            if shadowed:
                raise ValueError(f"rows[{i}].overrides: {', '.join(shadowed)} also in common_overrides, which "
                                 "come after a row's and would win: set each key in one place")
        return self

    def seeds_of(self, row: Row) -> list[int]:
        return self.seeds if row.seeds is None else row.seeds

    def baseline_of(self, row: Row) -> Optional[str]:
        """The name of the row ``row`` is compared with (None: not compared; never itself)."""
        name = row.baseline or self.baseline
        return None if name == row.name else name

    def row_named(self, name: str, option: str) -> Row:
        found = next((row for row in self.rows if row.name == name), None)
        if found is None:
            raise UserError(f"{option} {name!r}: no such row; rows: {', '.join(r.name for r in self.rows)}")
        return found

    def with_seeds(self, seeds: list[int]) -> "Grid":
        """Every row on ``seeds`` (``--seeds``: rows with seeds of their own included)."""
        checked = _validated(Seeds, seeds, "--seeds")
        return self.model_copy(update={"seeds": checked,
                                       "rows": [r.model_copy(update={"seeds": None}) for r in self.rows]})

    def with_baseline(self, name: str) -> "Grid":
        """Every other row compared with the row ``name`` (``--baseline``)."""
        self.row_named(name, "--baseline")
        return self.model_copy(update={"baseline": name,
                                       "rows": [r.model_copy(update={"baseline": None}) for r in self.rows]})


def _no_launcher_keys(where: str, overrides: list[str]) -> None:
    """No override sets what the launcher decides for each run (``LAUNCHER_KEYS``)."""
    for text in overrides:
        try:
            settings = override_settings(text)
        except UserError:
            continue  # named where the row's overrides are read (below)
        taken = [key for key in LAUNCHER_KEYS if any(covers(key, setting) for setting in settings)]
        if taken:
            raise ValueError(f"{where}: {text!r} sets {', '.join(taken)}, which segadv-experiment sets for each run "
                             "(OUT/<row>/seed<k>, OUT from --out, by default runs/experiments/<grid name>): take "
                             "it out")


def _location(loc: tuple) -> str:
    """``("rows", 0, "overrides", 1)`` -> ``rows[0].overrides[1]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problem(error: dict) -> str:
    where = _location(error["loc"])
    if error["type"] in ("greater_than_equal", "less_than"):  # a grid's one bounded number: a seed
        message = f"seed {error['input']!r} is out of range: a seed is 0 .. 2**31-1 (train.seed's range)"
    elif error["type"] == "extra_forbidden":
        parent = Grid if len(error["loc"]) == 1 else Row
        message = f"unknown key(s) {error['loc'][-1]}; keys: {', '.join(sorted(parent.model_fields))}"
        where = _location(error["loc"][:-1])
    elif error["type"] == "missing":
        message = "missing required key"
    elif error["type"] == "value_error":
        message = str(error["ctx"]["error"])
    else:
        message = error["msg"]
    return f"{where}: {message}" if where else message


def _validated(schema: Any, data: object, what: str) -> Any:
    try:
        return TypeAdapter(schema).validate_python(data)
    except ValidationError as err:
        raise UserError(f"{what}: " + "; ".join(_problem(e) for e in err.errors())) from None


def load_grid(path: Path) -> Grid:
    """The grid in ``path``, validated, with every row's config found (a file, or a shipped name)."""
    try:
        data = read_yaml(path, f"grid {path}", what="a grid file")
    except FileNotFoundError:
        raise UserError(f"grid {path}: no such file") from None
    if not isinstance(data, dict):
        raise UserError(f"grid {path}: expected a mapping with name, seeds and rows")
    grid = _validated(Grid, data, f"grid {path}")
    for i, row in enumerate(grid.rows):
        try:
            exists = resolve_config(row.config).is_file()
        except UserError as err:  # an unknown name: the message lists the shipped ones
            raise UserError(f"grid {path}: rows[{i}]: {err}") from None
        if not exists:
            raise UserError(f"grid {path}: rows[{i}]: config {row.config} does not exist")
    return grid if grid.name else grid.model_copy(update={"name": path.stem})
