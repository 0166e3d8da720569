"""Config keys that were renamed: one table, applied wherever a config mapping is read, before it is
validated (segadv/config/loading.py: a config file with its ``_base_`` files and its overrides, a
config stored in a checkpoint, a run dir's ``config.yaml``).

An old key still reads, with one logged note naming its new key. It lives in a method's section
(``method.adaptsegnet.lambda_adv_main``): where that method is the config's ``method.name`` the value
moves to the new key, else it is dropped (it set a method the config does not run) with the same
note. A config giving both an old key and its new one with different values is a UserError naming
both: which one is meant cannot be told.

A config segadv saved (a checkpoint's, a run dir's ``config.yaml``) holds every key, a key its
method did not read too. Saved before a rename, it holds the new key at a value its method
ignored (an AdaptSegNet run saved ``loss.lambda_adv: 0.01`` beside the
``method.adaptsegnet.lambda_adv_main: 0.001`` it trained with): read as saved (``saved=True``), such
a value is disregarded and the old key's value wins, so an old run resumes with what it trained.
Torch-free, like the rest of segadv/config.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from segadv.config.schema import MethodConfig
from segadv.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RenamedKey:
    """An old dotted key, the key it is now, and the method whose section held it (the value moves
    only where that method runs; None: always)."""

    old: str
    new: str
    method: Optional[str]
    why: str  # the note's reason for the rename


ONE_ADVERSARIAL_WEIGHT = "one name for G's adversarial weight in every method, issue 50"

RENAMED_KEYS: tuple[RenamedKey, ...] = (
    RenamedKey("method.adaptsegnet.lambda_adv_main", "loss.lambda_adv", "adaptsegnet", ONE_ADVERSARIAL_WEIGHT),
    RenamedKey("method.advent.lambda_adv_main", "loss.lambda_adv", "advent", ONE_ADVERSARIAL_WEIGHT),
    RenamedKey("method.minent.lambda_adv_main", "loss.lambda_adv", "minent", ONE_ADVERSARIAL_WEIGHT),
    RenamedKey("method.mean_teacher.lambda_adv", "loss.lambda_adv", "mean_teacher", ONE_ADVERSARIAL_WEIGHT),
)

# Before the rename these methods did not read the new key, which a config saved then holds anyway
# (segadv saves every key): read as saved, its value there is disregarded (the old key's wins, or
# the schema default where the method had none: s4GAN).
UNREAD_BEFORE_THE_RENAME: dict[str, tuple[str, ...]] = {
    "loss.lambda_adv": ("adaptsegnet", "advent", "minent", "mean_teacher", "s4gan"),
}

_MISSING = object()


def _get(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _pop(data: dict, key: str) -> Any:
    *parents, last = key.split(".")
    node: Any = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        return _MISSING
    return node.pop(last)


def _set(data: dict, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = data
    for part in parents:
        if not isinstance(node.get(part), dict):  # missing or null (an optional section): a mapping now
            node[part] = {}
        node = node[part]
    node[last] = value


def _method_name(data: Mapping[str, Any]) -> Optional[str]:
    name = _get(data, "method.name")
    return name if isinstance(name, str) else None


def apply_renamed_keys(data: Mapping[str, Any], *, saved: bool = False, source: str = "the config",
                       method: Optional[str] = None, log_notes: bool = True) -> dict:
    """A copy of ``data`` (one layer of a config, not yet validated: a file, the command line, a
    saved config) with every old key of ``RENAMED_KEYS`` moved to its new key or dropped, each with
    a note in the log (a warning; for a ``saved`` config, which is read again at each resume, a
    debug line; none without ``log_notes``). ``method``: the config's ``method.name`` once every
    layer is merged (default: ``data``'s, else the schema's).

    ``saved``: ``data`` is a config segadv saved, every key in it (module docstring): where it holds
    an old key, the new keys its method did not read before the rename are disregarded. Otherwise
    an old key and its new one both given in ``data`` with values that differ are a UserError
    naming both (a null new key is not given: it means the default); between layers the later one
    wins, as for any key."""
    found = [entry for entry in RENAMED_KEYS if _get(data, entry.old) is not _MISSING]
    if not found:
        return dict(data)
    out = copy.deepcopy(dict(data))
    if method is None:
        method = _method_name(out) or MethodConfig.model_fields["name"].default
    note = (log.debug if saved else log.warning) if log_notes else (lambda *args: None)
    if saved:
        for key, methods in UNREAD_BEFORE_THE_RENAME.items():
            if method in methods and _get(out, key) is not _MISSING:
                _set(out, key, None)
    for entry in found:
        value = _pop(out, entry.old)
        if entry.method is not None and entry.method != method:
            note("%s: %s is now %s (%s); dropped: it sets method %s, and this config's method is %s",
                 source, entry.old, entry.new, entry.why, entry.method, method)
            continue
        given = _get(out, entry.new)
        if given is not _MISSING and given is not None and given != value:
            raise UserError(f"{source}: {entry.old} ({value!r}) and {entry.new} ({given!r}) are one setting, "
                            f"{entry.old} its old name ({entry.why}): give {entry.new} alone")
        _set(out, entry.new, value)
        note("%s: %s is now %s (%s): read as %s: %r", source, entry.old, entry.new, entry.why, entry.new, value)
    return out
