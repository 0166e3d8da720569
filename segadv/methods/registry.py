"""``method.name`` -> the method's class. Adding a built-in method adds its folder (its
``declaration.py`` and ``iteration.py``), a line here and its package in pyproject.toml.

Everything about a method (its config section, streams, checks, whether G's loss passes through a
D, what its iteration reads from the config and which class that is) is on its class
(``segadv.methods.base.Method``); callers ask the class. A method outside the package (a plugin)
registers itself with ``register_method`` before the config naming it is loaded; the config's
method section then validates its settings like a built-in's (docs/methods.md "Adding a method").
Like the declarations, this module imports no torch.
"""

from __future__ import annotations

import inspect

from segadv.methods.base import Method
from segadv.methods.advsemiseg.declaration import AdvSemiSegSpec
from segadv.methods.domain_adaptation.declaration import AdaptSegNetSpec, AdventSpec, MinEntSpec
from segadv.methods.mean_teacher.declaration import MeanTeacherSpec
from segadv.methods.s4gan.declaration import S4GanSpec
from segadv.methods.supervised.declaration import SupervisedSpec
from segadv.methods.unimatch.declaration import UniMatchSpec

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (
    SupervisedSpec,
    AdvSemiSegSpec,
    S4GanSpec,
    AdaptSegNetSpec,
    AdventSpec,
    MinEntSpec,
    MeanTeacherSpec,
    UniMatchSpec,
)}


def method_class(name: str) -> type[Method]:
    """The class registered as ``name``."""
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; methods: {', '.join(METHODS)}") from None


def register_method(cls: type[Method]) -> type[Method]:
    """Add ``cls`` to the registry (usable as a class decorator); it must declare everything a
    method declares, and its name must be new."""
    check_declaration(cls)
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise ValueError(f"method {cls.name!r} is already registered ({METHODS[cls.name].__qualname__})")
    METHODS[cls.name] = cls
    return cls


def check_declaration(cls: type[Method]) -> None:
    """A method class as the registry needs it: concrete, named, its iteration link written as
    "dotted.module:Class" (followed only when a run is built: the declaration imports no torch),
    its streams' batch-size keys its own settings' (or ``data.batch_size``)."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"{cls!r} is not a Method subclass (segadv.methods.base.Method)")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise TypeError(f"method class {cls.__qualname__} leaves abstract: {missing}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"method class {cls.__qualname__}: name must be an identifier (its method.name), got {name!r}")
    link = cls.iteration_path
    if link is not None:
        module_name, colon, class_name = link.partition(":") if isinstance(link, str) else ("", "", "")
        if not (colon and class_name.isidentifier() and all(p.isidentifier() for p in module_name.split("."))):
            raise TypeError(f"method {name}: iteration_path must name its class as 'dotted.module:Class' "
                            f"(or be None: the class runs its own), got {link!r}")
    default = cls.lambda_adv_default
    if default is not None and (isinstance(default, bool) or not isinstance(default, (int, float)) or default < 0):
        raise TypeError(f"method {name}: lambda_adv_default (what a null loss.lambda_adv means) must be a weight "
                        f">= 0 or None, got {default!r}")
    fields = cls.config.model_fields if cls.config is not None else {}
    for spec in cls.streams:
        prefix, _, field = spec.batch_size_key.rpartition(".")
        if spec.batch_size_key != "data.batch_size" and (prefix != f"method.{name}" or field not in fields):
            raise TypeError(f"method {name}: stream {spec.name!r} takes its batch size from {spec.batch_size_key!r}, "
                            f"which is neither data.batch_size nor a setting of method.{name}")


for _cls in METHODS.values():
    check_declaration(_cls)
