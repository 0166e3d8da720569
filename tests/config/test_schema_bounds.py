"""Every numeric and list value of the schema at its boundaries, through the real entry path.

The walk visits each schema section class once, at its first required place in ``Config`` (the
optional copies, ``model.discriminator_aux`` and the like, are the same classes), and gives every
numeric or list field the boundary values a user's typo produces: 0, -1, NaN, +-inf, a huge number,
an empty list, a one-element list, a list of -1 / NaN / huge items. Each goes through
``load_config`` with the override, as ``segadv-train key=value`` does. A refused value must be a
``UserError`` naming its key (exit 2). An accepted value that differs from the tiny config's must
then train one step (with an evaluation and a checkpoint) in process, through ``segadv.training.loop.train``,
and end in success or a ``UserError``: any other exception means a value reached torch or smp
unchecked, and the test fails (drop one constraint from segadv/config/schema.py, e.g. ``ge=0`` of
``momentum``, and it goes red).

Cost: validation is about a millisecond a case; the one-step trainings (under a second each on
one core) are run only for the values the schema accepts, which after its bounds are the zeros of
the counts and weights that allow 0: a few dozen. A method section's values are tried with that
method selected (``METHOD_CONTEXT``), an optimizer's momentum with sgd and its betas with adam:
where they act.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Iterator, Optional, Union

import pytest
import torch
from pydantic import BaseModel

from conftest import TINY_OVERRIDES
from segadv.config import load_config
from segadv.config.schema import Config
from segadv.errors import UserError

ONE_STEP = [
    "train.max_steps=1", "train.eval_every=1", "checkpoint.every=1", "log.tensorboard=false",
    "log.num_images=0", "log.diagnostic_images=0", "data.synthetic.train_size=4", "data.synthetic.val_size=2",
    "device_map=g:cpu,d:cpu",
]
_TARGET = ("target_data={kind: synthetic, synthetic: {domain: target, image_size: 64, train_size: 4, val_size: 2}, "
           "batch_size: 2, val_batch_size: 4, num_workers: 0, train_transforms: []}")
_SEMI = ["data.labeled_fraction=0.5", "data.synthetic.train_size=8"]
# What a method section's values need to act: the method, and the data or D it asks for.
METHOD_CONTEXT = {
    "advsemiseg": ["method.name=advsemiseg", *_SEMI],
    "s4gan": ["method.name=s4gan", "model.discriminator.kind=image", *_SEMI],
    "adaptsegnet": ["method.name=adaptsegnet", _TARGET],
    "advent": ["method.name=advent", _TARGET],
    "minent": ["method.name=minent", _TARGET],
}

NUMBERS = {int: ["0", "-1", str(10**30)], float: ["0", "-1", ".nan", ".inf", "-.inf", "1e30"]}


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _base(annotation: Any) -> Any:
    """``Annotated[int, ...]`` -> int; other annotations unchanged."""
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation


def _fields(model: type[BaseModel], prefix: str, seen: set[type]) -> Iterator[tuple[str, Any, Any]]:
    """(dotted key, base type, default) of every leaf field, each section class walked once at its
    first required place."""
    seen.add(model)
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = info.annotation
        optional = _strip_optional(annotation) is not annotation
        inner = _base(_strip_optional(annotation))
        if typing.get_origin(inner) is None and isinstance(inner, type) and issubclass(inner, BaseModel):
            inner = inner.schema_model()  # the method section: with each registered method's settings
            if not optional and inner not in seen:
                yield from _fields(inner, f"{key}.", seen)
            continue
        yield key, inner, info.default


def _yaml(value: Any) -> str:
    if isinstance(value, float) and math.isnan(value):
        return ".nan"
    return str(value)


def boundary_cases() -> list[tuple[str, str]]:
    cases = []
    for key, kind, default in _fields(Config, "", set()):
        if kind in NUMBERS:
            cases += [(key, v) for v in NUMBERS[kind]]
        elif typing.get_origin(kind) is list:
            item = _base(typing.get_args(kind)[0])
            cases.append((key, "[]"))
            if item in NUMBERS:
                size = max(len(default or []), 2)
                first = (default or [1])[0]
                cases += [(key, f"[{first}]")]
                cases += [(key, "[" + ", ".join([v] * size) + "]") for v in NUMBERS[item] if v != "0"]
    return cases


CASES = boundary_cases()


# An optimizer's values act only with the optimizer that reads them (the tiny config's are adamw / adam).
OPTIMIZER_CONTEXT = {"momentum": "sgd", "betas": "adam"}


def context(key: str) -> list[str]:
    parts = key.split(".")
    if parts[0] == "method":
        return METHOD_CONTEXT.get(parts[1], [])
    if parts[0] == "optim" and parts[-1] in OPTIMIZER_CONTEXT:
        return [f"{'.'.join(parts[:-1])}.name={OPTIMIZER_CONTEXT[parts[-1]]}"]
    return []


def _load(overrides: list[str]) -> Optional[Config]:
    try:
        return load_config(None, overrides)
    except UserError:
        return None


def test_the_walk_covers_the_schema():
    keys = {key for key, _ in CASES}
    for key in ("optim.generator.betas", "optim.generator.momentum", "model.generator.encoder_depth",
                "model.generator.decoder_atrous_rates", "model.discriminator.num_downsamples",
                "method.advsemiseg.unlabeled_batch_size", "method.adaptsegnet.target_batch_size",
                "data.synthetic.image_size", "train.accumulation_steps", "amp.generator.init_scale"):
        assert key in keys
    assert len(CASES) > 250


@pytest.mark.usefixtures("one_torch_thread")
def test_every_boundary_value_is_refused_naming_its_key_or_trains(tmp_path):
    from segadv.training.loop import train

    base = [*TINY_OVERRIDES, *ONE_STEP]
    accepted = []
    for key, value in CASES:
        overrides = [*base, *context(key)]
        reference = _load(overrides)
        assert reference is not None, f"the context of {key} does not load"
        override = f"{key}={value}"
        try:
            cfg = load_config(None, [*overrides, override])
        except UserError as err:
            # The message names the key (a list item as key[i]), never only a section.
            assert key in str(err), f"{override}: {err}"
            continue
        if cfg != reference:
            accepted.append((override, cfg))
    failures = []
    for i, (override, cfg) in enumerate(accepted):
        cfg.run_dir = str(tmp_path / f"run{i}")
        try:
            train(cfg)
        except UserError:
            pass
        except Exception as err:  # noqa: BLE001 - the point: any other exception is a failure
            failures.append(f"{override}: {type(err).__name__}: {err}")
    assert not failures, "values that reached torch or smp unchecked:\n" + "\n".join(failures)


def test_refusals_exit_2_from_the_cli(tmp_path, capsys):
    from segadv.cli.train import main

    for override in ("optim.discriminator.betas=[0.9]", "optim.generator.lr=1e38", "data.num_classes=1000",
                     "model.generator.encoder_depth=0", "optim.generator.poly_power=-1"):
        assert main(["--run-dir", str(tmp_path / "r"), override]) == 2
        err = capsys.readouterr().err
        assert override.split("=")[0] in err and "Traceback" not in err
