"""Load, layer, override, validate and save experiment configs.

A config is built in layers, lowest first:

1. the schema defaults (``Config()``), so a file may set just ``optim.generator.lr`` even though
   ``OptimizerConfig`` has required fields;
2. the ``_base_`` files of the config file (paths relative to it, or shipped configs' names),
   recursively, in order;
3. the config file itself;
4. command-line overrides ``a.b.c=value``.

Mappings merge key by key; lists and scalars replace. ``_delete_: true`` inside a mapping replaces
the lower layers' mapping instead of merging into it (mmengine convention). Every problem a user can
fix becomes one :class:`~segadv.errors.UserError` naming the file or key at fault.

YAML is read with a ``SafeLoader`` that also reads ``1e-3`` as a float (PyYAML follows YAML 1.1,
which needs a dot: ``1e-3`` would be the *string* "1e-3" and fail strict validation) and rejects
duplicate keys (the second silently winning is a typo that does nothing). Every YAML file segadv
reads (a config, its ``_base_`` files, a grid, a run dir's ``config.yaml``) goes through
:func:`read_yaml`, under caps whose message names the cap hit: at most 1 MiB, at most
``MAX_YAML_VALUES`` values once aliases are expanded (an alias bomb is refused before it is
expanded), nested at most ``MAX_YAML_DEPTH`` deep (an override's dotted key too), and at most
``MAX_BASE_FILES`` ``_base_`` files read for one config.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import yaml
from pydantic import BaseModel, ValidationError

from segadv.config.renamed import apply_renamed_keys
from segadv.config.schema import Config, Section, registered_methods
from segadv.config.shipped import DEFAULT_CONFIG_PATH, resolve_config, shipped_hint
from segadv.errors import UserError
from segadv.fsutil import atomic_write_text
from segadv.readback import Unreadable, decode, read_bytes

BASE_KEY = "_base_"
DELETE_KEY = "_delete_"

PathLike = Union[str, "os.PathLike[str]"]

_OVERRIDE_FORM = (
    "expected KEY=VALUE with a dotted key, e.g. train.max_steps=100 or optim.generator.lr=1e-3"
)
_REPR_LIMIT = 60
MAX_LISTED = 20  # problems one message lists (problem_listing): the rest are counted


# --------------------------------------------------------------------------------------- YAML


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader + YAML 1.2 exponent floats + duplicate-key errors (see module docstring)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        self._reject_duplicate_keys(node)
        return super().construct_mapping(node, deep=deep)

    def _reject_duplicate_keys(self, node: yaml.MappingNode) -> None:
        """Raise on a repeated scalar key; ``<<`` merge keys may legitimately repeat keys."""
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)


# Exponent forms YAML 1.1 leaves as strings: 1e-3, 1E5, -2.5e3, .5e-2 (the dotted, signed-exponent
# forms such as 1.0e-3 are already floats). construct_yaml_float handles underscores and signs.
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


# A config holds a few hundred values. Aliases share nodes, so a few hundred bytes of nested
# aliases ("billion laughs") stand for billions of values that merging and validation would expand.
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 64
MAX_CONFIG_BYTES = 1 << 20
# The shipped configs use one or two; a chain or fan-out of thousands is a generated file gone wrong
# (and a fan-out's repeated reads grow exponentially with its depth).
MAX_BASE_FILES = 64


class YAMLCap(yaml.YAMLError):
    """A document over one of the reader's caps; its message names the cap."""


def _depth_cap() -> YAMLCap:
    return YAMLCap(f"values nested deeper than {MAX_YAML_DEPTH} levels (the cap on a config's depth)")


def _expanded_size(node: yaml.Node, sizes: dict[int, int], aliased: list[bool], depth: int = 0) -> int:
    """How many values ``node`` stands for once its aliases are expanded (each shared node counted
    once per use, computed once: ``sizes`` by node id), without expanding anything. ``aliased[0]``
    becomes True once a node is met a second time (an alias)."""
    known = sizes.get(id(node))
    if known is not None:
        if known < 0:
            raise YAMLCap("an alias refers to a node that contains it (a recursive structure)")
        aliased[0] = True
        return known
    if depth > MAX_YAML_DEPTH:
        raise _depth_cap()
    sizes[id(node)] = -1  # in progress: reaching it again is a cycle
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded_size(child, sizes, aliased, depth + 1) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded_size(k, sizes, aliased, depth + 1) + _expanded_size(v, sizes, aliased, depth + 1)
                     for k, v in node.value)
    if total > MAX_YAML_VALUES:
        cause = "its aliases expand to" if aliased[0] else "it holds"
        raise YAMLCap(f"{cause} more than {MAX_YAML_VALUES} values (the cap on a config's values; a config holds "
                      "a few hundred)")
    sizes[id(node)] = total
    return total


def _parse_yaml(text: str) -> Any:
    """Parse one YAML document with the config loader, refusing one whose aliases expand beyond
    ``MAX_YAML_VALUES`` values before anything is built from it."""
    loader = _ConfigLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # PyYAML composes nested collections recursively
            raise _depth_cap() from None
        if node is None:
            return None
        _expanded_size(node, {}, [False])
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_error_text(err: yaml.YAMLError) -> str:
    """``line L, column C: problem`` (1-based) when PyYAML knows the position, else its message."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or problem is None:
        return str(err).replace("\n", " ")
    context = getattr(err, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    return f"{where}: {problem}" + (f" ({context})" if context else "")


# --------------------------------------------------------------------------------------- files


def _display(path: Path) -> str:
    """Path as the user most likely knows it: relative to the cwd when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # different drive on Windows
        return str(path)
    return str(path) if rel.startswith("..") else rel


def read_yaml(path: PathLike, name: Optional[str] = None, what: str = "a config file") -> Any:
    """The YAML document in file ``path`` (None when empty) through the config reader: a regular
    file, UTF-8, duplicate keys refused, and the caps (size, values, aliases, depth). A missing
    file is a FileNotFoundError; anything else wrong is an :class:`~segadv.readback.Unreadable`
    naming the file (``name``, default its path) and, for a cap, the cap hit."""
    name = name or _display(Path(path))
    text = decode(read_bytes(path, MAX_CONFIG_BYTES, name, what), name)
    try:
        return _parse_yaml(text)
    except YAMLCap as err:
        raise Unreadable(name, f"is refused: {err}") from None
    except yaml.YAMLError as err:
        raise Unreadable(name, f"is not valid YAML: {_yaml_error_text(err)}") from None


def _read_yaml_file(path: Path, included_from: Optional[Path]) -> dict:
    """Read one config file into a dict; every failure is a UserError naming the file."""
    where = _display(path)
    via = f" (a {BASE_KEY} of {_display(included_from)})" if included_from else ""
    try:
        data = read_yaml(path, f"config file {where}{via}")
    except FileNotFoundError as err:
        raise UserError(f"config file not found: {where}{via}{shipped_hint(path)}") from err
    if data is None:  # empty or comments only
        return {}
    if not isinstance(data, dict):
        raise UserError(
            f"config file {where}: the top level must be a mapping of keys, got {_type_name(data)}"
        )
    _check_delete_flags(data, where, "")
    return data


def _check_delete_flags(node: Any, where: str, prefix: str) -> None:
    """Insist ``_delete_`` is a bool and drop ``_delete_: false`` (the default, merging).

    Dropping it up front means every marker left in the data means "replace", which keeps the
    merge rule simple.
    """
    if isinstance(node, list):
        for i, item in enumerate(node):
            _check_delete_flags(item, where, f"{prefix}[{i}]")
        return
    if not isinstance(node, dict):
        return
    if DELETE_KEY in node:
        flag = node[DELETE_KEY]
        if not isinstance(flag, bool):
            key = f"{prefix}.{DELETE_KEY}" if prefix else DELETE_KEY
            got = _describe_value(flag)
            raise UserError(f"config file {where}: {key} must be true or false, got {got}")
        if not flag:
            del node[DELETE_KEY]
    for key, value in node.items():
        _check_delete_flags(value, where, f"{prefix}.{key}" if prefix else str(key))


def _base_paths(value: Any, including: Path) -> list[Path]:
    """The ``_base_`` entry as absolute paths, relative ones taken from the including file's dir;
    a shipped config's name (``semi``) is that config."""
    if value is None:
        return []
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise UserError(
            f"config file {_display(including)}: {BASE_KEY} must be a file name or a list of file "
            f"names, got {_describe_value(value)}"
        )
    try:
        return [resolve_config(n, relative_to=including.parent) for n in names]
    except UserError as err:
        raise UserError(f"config file {_display(including)}: {BASE_KEY}: {err}") from None


def _file_layers(path: Path, chain: tuple[Path, ...] = (), reads: Optional[list[int]] = None) -> list[tuple[dict, Path]]:
    """One file's layers, lowest first: its ``_base_`` files' layers (recursively, in the order it
    lists them), then its own keys, each with the file it came from. Merged in that order they are
    the file with its bases underneath; kept apart, each layer can be read on its own first (its
    renamed keys: :func:`load_config`).

    ``chain`` holds the files currently being resolved (resolved paths), to report cycles; a file
    reached twice along different branches (a diamond) is fine. ``reads`` counts the files read
    for the whole config, each read of a diamond's file included, against ``MAX_BASE_FILES``.
    """
    if path in chain:
        cycle = " -> ".join(_display(p) for p in (*chain[chain.index(path):], path))
        raise UserError(f"cyclic {BASE_KEY} inheritance: {cycle}")
    reads = [0] if reads is None else reads
    reads[0] += 1
    if reads[0] > MAX_BASE_FILES + 1:
        raise UserError(f"config file {_display(chain[0])}: its {BASE_KEY} files come to more than {MAX_BASE_FILES} "
                        f"(the cap on a config's {BASE_KEY} files, each read counted), the latest "
                        f"{_display(path)}: flatten them")
    data = _read_yaml_file(path, chain[-1] if chain else None)
    layers: list[tuple[dict, Path]] = []
    for base in _base_paths(data.pop(BASE_KEY, None), path):
        layers += _file_layers(base, (*chain, path), reads)
    layers.append((data, path))
    return layers


def _merged(layers: Sequence[Mapping]) -> dict:
    """``layers`` merged over the schema defaults, lowest first."""
    data = _schema_defaults()
    for layer in layers:
        data = _deep_merge(data, layer)
    return data


# --------------------------------------------------------------------------------------- merging


def _deep_merge(base: Mapping, over: Mapping, path: tuple[str, ...] = ()) -> dict:
    """``over`` on top of ``base``, as a new dict (inputs untouched).

    Mappings merge key by key; anything else replaces. A mapping carrying ``_delete_: true``
    replaces instead, and keeps its marker so that it also replaces what lower layers (bases merged
    later, the schema defaults) hold; :func:`_strip_markers` removes the markers at the end.
    Each section keeps of the lower layers' keys what its class carries over a layer
    (``Section.carried_over``: ``model.generator`` naming another arch keeps only the keys the two
    archs' sections share).
    """
    if over.get(DELETE_KEY) is True:
        return copy.deepcopy(dict(over))
    section = _model_at(path, declared=True)
    if section is not None and issubclass(section, Section):
        base = section.carried_over(base, over)
    result = copy.deepcopy(dict(base))
    for key, value in over.items():
        old = result.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            result[key] = _deep_merge(old, value, (*path, key))
        else:
            result[key] = copy.deepcopy(value)
    return result


def _strip_markers(node: Any) -> Any:
    """Copy of ``node`` without any ``_delete_`` keys, once merging is over."""
    if isinstance(node, dict):
        return {k: _strip_markers(v) for k, v in node.items() if k != DELETE_KEY}
    if isinstance(node, list):
        return [_strip_markers(v) for v in node]
    return node


def _schema_defaults() -> dict:
    """The lowest layer: every default of the schema, as plain data.

    Without it a file setting only ``optim.generator.lr`` would fail, because pydantic validates
    that partial mapping as a whole ``OptimizerConfig`` (whose ``name``/``lr`` are required)
    instead of merging it into the field's default.
    """
    return Config().model_dump(mode="python")


# --------------------------------------------------------------------------------------- overrides


def _parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a", "b", "c"], value parsed as YAML, ``1e-3`` being a float)."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise UserError(f"invalid override {text!r}: {_OVERRIDE_FORM}")
    parts = key.strip().split(".")
    if len(parts) > MAX_YAML_DEPTH:
        shown = key if len(key) <= _REPR_LIMIT else key[:_REPR_LIMIT - 3] + "..."
        raise UserError(f"invalid override {shown!r}: a key of {len(parts)} dotted parts is nested deeper than "
                        f"{MAX_YAML_DEPTH} levels (the cap on a config's depth)")
    if not all(parts):
        raise UserError(f"invalid override {text!r}: empty key; {_OVERRIDE_FORM}")
    try:
        value = _parse_yaml(raw)
    except yaml.YAMLError as err:
        raise UserError(
            f"invalid override {text!r}: cannot parse value {raw!r} as YAML "
            f"({_yaml_error_text(err)})"
        ) from err
    return parts, value


def override_settings(text: str) -> list[str]:
    """The dotted keys whose values an override sets: ``a.b=1`` sets ``a.b``; ``a={b: 1, c: {d: 2}}``
    sets ``a.b`` and ``a.c.d`` (a mapping's leaves; an empty mapping sets its own key). A
    UserError as for a bad override."""
    parts, value = _parse_override(text)
    found: list[str] = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict) and node:
            for name, child in node.items():
                walk(child, f"{key}.{name}")
        else:
            found.append(key)

    walk(value, ".".join(parts))
    return found


def _apply_overrides(data: dict, overrides: Sequence[str], method: Optional[str] = None) -> None:
    """Each ``a.b.c=value`` of ``overrides`` set in ``data`` in place, in order. ``method``: the
    config's method once every layer is read, for its renamed keys (segadv/config/renamed.py): the
    command line is one layer, where an old key and its new one given with different values are a
    UserError and an override of an old key sets the new one (one note each); None: as written."""
    given: dict = {}
    for text in overrides:
        _apply_override(given, text)
    carried = _carried(data, given)  # the command line is a layer: each section it names keeps what it carries over
    data.clear()
    data.update(carried)
    if method is None or not overrides:
        for text in overrides:
            _apply_override(data, text)
        return
    apply_renamed_keys(given, method=method, source="the command line")  # the notes, or both names refused
    for text in overrides:
        layer: dict = {}
        _apply_override(layer, text)
        renamed = apply_renamed_keys(layer, method=method, log_notes=False)
        if renamed == layer:
            _apply_override(data, text)
        else:  # an old key: its new one, or nothing (another method's)
            merged = _deep_merge(data, renamed)
            data.clear()
            data.update(merged)


def _method_name(data: Mapping[str, Any]) -> Optional[str]:
    """``method.name`` in a merged config mapping, or None where it is not a name."""
    method = data.get("method")
    name = method.get("name") if isinstance(method, Mapping) else None
    return name if isinstance(name, str) else None


def _apply_override(data: dict, text: str) -> None:
    """Set one ``a.b.c=value`` in ``data`` in place, creating missing intermediate mappings.

    Missing keys are created rather than refused so that validation reports an unknown key with a
    suggestion, exactly as it would for the same typo in a file.
    """
    parts, value = _parse_override(text)
    node = data
    for depth, part in enumerate(parts[:-1]):
        if node.get(part) is None:  # missing, or an optional section that is null by default
            node[part] = {}
        child = node[part]
        if not isinstance(child, dict):
            here = ".".join(parts[: depth + 1])
            raise UserError(
                f"invalid override {text!r}: {here} is {_describe_value(child)}, not a mapping, "
                f"so it has no key {parts[depth + 1]!r}"
            )
        node = child
    node[parts[-1]] = value


# --------------------------------------------------------------------------------------- validation

# pydantic error type -> what the user should have written.
_EXPECTED = {
    "int_type": "int",
    "float_type": "float",
    "string_type": "str",
    "bool_type": "bool (true/false)",
    "list_type": "list",
    "dict_type": "mapping",
    "model_type": "mapping",
}


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _describe_value(value: Any) -> str:
    """``str '4x'``: the offending value's type and a short repr."""
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > _REPR_LIMIT:
        text = text[: _REPR_LIMIT - 3] + "..."
    return f"{_type_name(value)} {text}"


def _format_loc(loc: Sequence[Union[str, int]]) -> str:
    """``("data", "mean", 1)`` -> ``data.mean[1]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<top level>"


def _model_class(annotation: Any) -> Optional[type[BaseModel]]:
    """The pydantic model inside an annotation (``Model`` or ``Optional[Model]``), if any."""
    if typing.get_origin(annotation) is typing.Annotated:  # SerializeAsAny[Model]
        annotation = typing.get_args(annotation)[0]
    # get_origin first: Python 3.10 counts ``list[int]`` as a type, and issubclass refuses it.
    if typing.get_origin(annotation) is None and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_class(arg)
            if found is not None:
                return found
    return None


def _model_at(loc: Sequence[Union[str, int]], declared: bool = False) -> Optional[type[BaseModel]]:
    """The schema section at ``loc`` (``()`` is ``Config``), or None when it is not a section: the
    model of its keys, or with ``declared`` its class as the schema declares it (``GeneratorConfig``
    rather than the model listing every arch's keys)."""
    model: Optional[type[BaseModel]] = Config
    for i, part in enumerate(loc):
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = _model_class(model.model_fields[part].annotation)
        if model is not None and issubclass(model, Section) and not (declared and i == len(loc) - 1):
            model = model.schema_model()
    return model


def _carried(below: dict, layer: Mapping[str, Any], path: tuple[str, ...] = ()) -> dict:
    """``below`` (the lower layers' values) as far as ``layer`` keeps them: each section ``layer``
    names says what of its lower layers' keys survives it (``Section.carried_over``: a
    ``model.generator`` naming another arch keeps only the keys the two archs' sections share)."""
    section = _model_at(path, declared=True)
    out = section.carried_over(below, layer) if section is not None and issubclass(section, Section) else dict(below)
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _carried(out[key], value, (*path, key))
    return out


def _unknown_key_hint(loc: Sequence[Union[str, int]]) -> str:
    """``; did you mean 'train.max_steps'?`` or, without a close match, the valid keys."""
    model = _model_at(loc[:-1])
    if model is None:
        return ""
    names = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), names, n=1)
    if close and close[0] == loc[-1]:  # a key of another choice of the section (another arch's)
        return "; another model.generator.arch takes it, not this one"
    if close:
        return f"; did you mean {_format_loc((*loc[:-1], close[0]))!r}?"
    return f"; valid keys here: {', '.join(names)}"


def _union_arms(annotation: Any) -> list[Any]:
    """The members of a union of two or more non-null types (``bool | Literal['auto']``), else []."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) not in (Union, types.UnionType):
        return []
    arms = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return arms if len(arms) > 1 else []


def _user_loc(loc: Sequence[Union[str, int]]) -> tuple[tuple[Union[str, int], ...], bool]:
    """``loc`` as the user's key: the parts pydantic adds for a union's members (``bool``,
    ``literal['auto']``, a section's class name) left out, found by walking the schema; and
    whether there were any (the error is then one member's of several)."""
    out: list[Union[str, int]] = []
    model: Optional[type[BaseModel]] = Config
    annotation: Any = None
    branched = False
    for part in loc:
        arms = _union_arms(annotation)
        if arms and isinstance(part, str) and (model is None or part not in model.model_fields):
            branched = True  # a member's tag: the member named, if a section, is walked on
            model = next((_model_class(arm) for arm in arms if getattr(_model_class(arm), "__name__", None) == part),
                         None)
            annotation = None
            continue
        out.append(part)
        if model is not None and isinstance(part, str) and part in model.model_fields:
            annotation = model.model_fields[part].annotation
            model = _model_class(annotation)
            if model is not None and issubclass(model, Section):
                model = model.schema_model()
        elif isinstance(part, int) and typing.get_origin(annotation) in (list, tuple) and typing.get_args(annotation):
            annotation, model = typing.get_args(annotation)[0], None
            model = _model_class(annotation)
        else:
            model, annotation = None, None
    return tuple(out), branched


def _expected(error: Mapping[str, Any]) -> str:
    """What one pydantic error says the value should have been (``bool (true/false)``, ``'auto'``)."""
    kind = error["type"]
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    if kind == "literal_error":
        return str(error["ctx"]["expected"])
    return str(error["msg"]).replace("Input should be ", "").replace("Input should ", "")


def _describe_errors(errors: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each pydantic error as ``key.path: problem``; the errors of a union's members at one key
    (``amp.teacher.enabled``: not a bool, not 'auto') as one line naming every value it takes."""
    lines: list[str] = []
    unions: dict[tuple[Union[str, int], ...], int] = {}  # key -> its line's index
    members: dict[tuple[Union[str, int], ...], list[str]] = {}
    for error in errors:
        loc, branched = _user_loc(error["loc"])
        if not branched:
            lines.append(_describe_error({**error, "loc": loc}))
            continue
        expected = members.setdefault(loc, [])
        if _expected(error) not in expected:
            expected.append(_expected(error))
        if loc not in unions:
            unions[loc] = len(lines)
            lines.append("")
        lines[unions[loc]] = (f"{_format_loc(loc)}: expected {' or '.join(expected)}, "
                              f"got {_describe_value(error.get('input'))}")
    return lines


def problem_listing(lines: Sequence[str], cap: int = MAX_LISTED) -> str:
    """``lines`` as an indented listing, one problem a line: the first ``cap`` and ``... and N
    more``, so that a config with thousands of mistakes is still a short message."""
    shown = [f"  {line}" for line in lines[:cap]]
    if len(lines) > cap:
        shown.append(f"  ... and {len(lines) - cap} more")
    return "\n".join(shown)


def _describe_error(error: Mapping[str, Any]) -> str:
    """One pydantic error as ``key.path: problem``."""
    loc = error["loc"]
    kind = error["type"]
    value = error.get("input")
    where = _format_loc(loc)
    if kind == "extra_forbidden":
        return f"{where}: unknown key{_unknown_key_hint(loc)}"
    if kind == "missing":
        return f"{where}: missing required key"
    if kind in _EXPECTED:
        hint = ""
        if kind == "string_type" and isinstance(value, (bool, int, float)):
            hint = " (quote it to pass it as a string)"
        return f"{where}: expected {_EXPECTED[kind]}, got {_describe_value(value)}{hint}"
    if kind == "literal_error":
        return f"{where}: expected {error['ctx']['expected']}, got {_describe_value(value)}"
    if kind in ("too_short", "too_long"):
        ctx = error.get("ctx", {})
        want = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        most = "at least" if kind == "too_short" else "at most"
        return f"{where}: must have {most} {want} item{'' if want == 1 else 's'}, got {_describe_value(value)}"
    if kind == "value_error":  # a schema validator's own sentence, which names the value
        return f"{where}: {error['ctx']['error']}"
    message = str(error["msg"]).replace("Input should be", "must be")
    return f"{where}: {message}, got {_describe_value(value)}"


def _validate(data: Mapping[str, Any], source: str) -> Config:
    """``Config.model_validate`` with every problem gathered into one readable UserError; then G's
    adversarial weight as the config's method reads it (``loss.lambda_adv``: a method without the
    term refuses a value, segadv/methods/base.py ``Method.adversarial_weight``)."""
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise UserError(f"invalid config ({source}):\n{problem_listing(_describe_errors(err.errors()))}") from err
    try:
        registered_methods()[cfg.method.name].adversarial_weight(cfg)
    except UserError as err:
        raise UserError(f"invalid config ({source}):\n  {err}") from None
    return cfg


# --------------------------------------------------------------------------------------- public API


def load_config(path: Optional[PathLike], overrides: Sequence[str] = (), saved: bool = False) -> Config:
    """Build the validated config from a YAML file (None: the embedded default) and overrides.

    ``path`` may also name a shipped config (``semi``: configs/semi.yaml). Layers, lowest first:
    schema defaults, the file's ``_base_`` chain, the file, ``overrides`` (``"a.b.c=value"``
    strings, values parsed as YAML). A renamed key's old name reads as its new one, with a note
    (segadv/config/renamed.py); ``saved``: the file is a config segadv saved (a run dir's
    ``config.yaml``), read as ``apply_renamed_keys`` reads one. Raises UserError for anything a
    user can fix.
    """
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of 'key=value' strings, not one string")
    file = resolve_config(DEFAULT_CONFIG_PATH if path is None else path)
    layers = _file_layers(file)
    # The method every layer is read for (renamed keys: an old one moves where it is its method's):
    # the one the layers come to, read as written.
    probe = _merged([layer for layer, _ in layers])
    _apply_overrides(probe, overrides)
    method = _method_name(probe)
    data = _merged([apply_renamed_keys(layer, saved=saved, source=f"config file {_display(where)}", method=method)
                    for layer, where in layers])
    _apply_overrides(data, overrides, method)
    source = _display(file) + (" + overrides" if overrides else "")
    return _validate(_strip_markers(data), source)


def config_from_dict(
    data: Mapping[str, Any], overrides: Sequence[str] = (), source: str = "config dict", saved: bool = True
) -> Config:
    """Validate a plain mapping (e.g. the config a checkpoint carries) into a Config.

    Layered over the schema defaults like a file, so a partial mapping is fine; ``overrides``
    apply on top. ``source`` names where the mapping came from in error messages. ``saved``
    (default): the mapping is a config segadv saved, its renamed keys read as
    segadv/config/renamed.py reads a saved one's; False: as a config file's.
    """
    if not isinstance(data, Mapping):
        raise UserError(f"invalid config ({source}): expected a mapping, got {_type_name(data)}")
    cap = mapping_over_caps(data)
    if cap is not None:  # the caps a YAML file has (read_yaml), met before anything recurses into it
        raise UserError(f"invalid config ({source}): it holds {cap}")
    probe = _deep_merge(_schema_defaults(), data)
    _apply_overrides(probe, overrides)
    method = _method_name(probe)  # as load_config reads a file's layers
    merged = _deep_merge(_schema_defaults(), apply_renamed_keys(data, saved=saved, source=source, method=method))
    _apply_overrides(merged, overrides, method)
    source = source + (" + overrides" if overrides else "")
    return _validate(_strip_markers(merged), source)


def mapping_over_caps(data: Mapping[str, Any]) -> Optional[str]:
    """Which of a YAML file's caps (depth, values) a mapping already built passes (a config
    stored in a checkpoint, unpickled), or None. Walked with a stack, not recursion, and each
    shared object counted once per use, so nesting 3000 deep, a structure that contains itself or
    a few shared lists standing for billions of values end at the cap, never in a RecursionError."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    values = 0
    while stack:
        value, depth = stack.pop()
        values += 1
        if depth > MAX_YAML_DEPTH:
            return f"values nested deeper than {MAX_YAML_DEPTH} levels (the cap on a config's depth)"
        if values > MAX_YAML_VALUES:
            return f"more than {MAX_YAML_VALUES} values (the cap on a config's values; a config holds a few hundred)"
        if isinstance(value, Mapping):
            stack.extend((child, depth + 1) for pair in value.items() for child in pair)
        elif isinstance(value, (list, tuple)):
            stack.extend((child, depth + 1) for child in value)
    return None


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain JSON/YAML-serialisable data; ``config_from_dict`` turns it back into an equal one."""
    return cfg.model_dump(mode="json")


def flat_config(cfg: Config) -> dict[str, Any]:
    """``{"optim.generator.lr": 0.001, ...}``: every leaf setting by its dotted override key, in
    schema order (lists and free-form mappings such as transforms stay whole values)."""
    flat: dict[str, Any] = {}

    def walk(value: Any, key: str, model: Any) -> None:
        if isinstance(model, BaseModel):
            for name in type(model).model_fields:
                walk(value[name], f"{key}.{name}" if key else name, getattr(model, name))
        else:
            flat[key] = value

    walk(config_to_dict(cfg), "", cfg)
    return flat


def config_yaml(cfg: Config) -> str:
    """``cfg`` as YAML in schema order: what ``config.yaml`` holds and ``--print-config`` prints. A
    null ``loss.lambda_adv`` carries a comment saying what it is for the config's method (its
    default: ``Method.lambda_adv_note``)."""
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)
    method = registered_methods().get(cfg.method.name)
    null = "\nloss:\n  lambda_adv: null\n"
    if method is not None and null in text:
        text = text.replace(null, f"\nloss:\n  lambda_adv: null  # {method.lambda_adv_note()}\n", 1)
    return text


def dump_config(cfg: Config, path: PathLike) -> None:
    """Write ``cfg`` as YAML (schema order), atomically, so a crash never leaves half a file."""
    atomic_write_text(path, config_yaml(cfg))
