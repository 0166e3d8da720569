"""What a resumed run may change from the config stored in the checkpoint it continues.

The checkpoint manager checks every resume against it, and the run-dir rule
(``segadv/training/run_dir.py``) before anything is written; it lives below both so that neither imports
the other for it.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from pathlib import Path
from typing import Any, Mapping

from segadv.errors import UserError

log = logging.getLogger(__name__)

# What a resumed run may set differently from the checkpoint it continues (flat config keys,
# ``*`` matching any part), each with why it is safe. docs/checkpoints.md lists the same.
RESUME_MAY_CHANGE: dict[str, str] = {
    "run_dir": "where the run is",
    "device_map": "where the networks run",
    "train.max_steps": "the poly schedule follows the new horizon",
    "optim.*.lr": "the optimizer's values from the step resumed at",
    "optim.*.weight_decay": "the optimizer's values from the step resumed at",
    "optim.*.betas": "the optimizer's values from the step resumed at",
    "optim.*.momentum": "the optimizer's values from the step resumed at",
    "train.lr_scaling": "the optimizer's values from the step resumed at",
    "amp.*": "a GradScaler switched on starts fresh",
    "parallel.*": "how a network is wrapped, not what it computes",
    "compile.*": "how a network is wrapped, not what it computes",
    "model.generator.activation_checkpointing": "how G's forward is run, not what it computes",
    "train.channels_last": "a memory format",
    "train.deterministic": "which kernels run",
    "train.profile": "timing only",
    "train.on_nonfinite": "what happens to a non-finite step from now on",
    "train.on_discriminator_collapse": "what happens when D leaves its band from now on",
    "train.early_stop.*": "when the run stops from now on (the count so far is in the checkpoint)",
    "train.log_every": "when the run reports",
    "train.eval_every": "when the run reports",
    "train.eval_source": "what the run reports",
    "checkpoint.*": "when and how many checkpoints are kept",
    "log.*": "what the run reports",
    "data.num_workers": "how batches are loaded (the order is the sampler's)",
    "data.pin_memory": "how batches are loaded",
    "data.persistent_workers": "how batches are loaded",
    "data.prefetch_factor": "how batches are loaded",
    "data.val_batch_size": "evaluation is scored in same-size groups: the mIoU of batch size 1",
    "init.*": "ignored at resume: the checkpoint brings every weight",
    # data and target_data alike: the test split is scored by segadv-eval --split test alone.
    "*data.test": "the test split: training never reads it",
    "*data.synthetic.test_size": "the test split: training never reads it",
    "*data.folder.test": "the test split: training never reads it",
    "*data.folder.test.*": "the test split: training never reads it",
}


def may_change_at_resume(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in RESUME_MAY_CHANGE)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim.generator.lr": 0.002, ...}``: every leaf of a (nested) config dict; lists and
    empty or null sections are leaves."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def config_differences(saved: Mapping[str, Any], now: Mapping[str, Any],
                       defaults: Mapping[str, Any] | None = None) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, value now)`` for each leaf that differs and a resume may not change. A
    key the saved config lacks (a key added to segadv after it was written) counts as its default
    in ``defaults`` (a flattened config), so a later release resumes an earlier run."""
    old, new = flatten(saved), flatten(now)
    missing = object()
    found = []
    for key in [*old, *(k for k in new if k not in old)]:
        before = old.get(key, missing if defaults is None else defaults.get(key, missing))
        after = new.get(key, missing)
        if before != after and not may_change_at_resume(key):
            found.append((key, None if before is missing else before, None if after is missing else after))
    return found


def check_resumed_config(saved: Mapping[str, Any] | None, now: Mapping[str, Any], checkpoint: Path) -> None:
    """The config a run resumes with against the one stored in ``checkpoint``: UserError naming
    every key that differs and is not in :data:`RESUME_MAY_CHANGE`. A checkpoint without a config
    (not written by segadv-train) is not compared."""
    if not saved:
        log.warning("%s holds no config: the run's config cannot be compared with the one it was saved with",
                    checkpoint)
        return
    from segadv.config.loading import mapping_over_caps

    cap = mapping_over_caps(saved)  # compared by recursion below: the YAML loader's caps first
    if cap is not None:
        raise UserError(f"the config stored in {checkpoint} is refused: it holds {cap}")
    differ = config_differences(as_the_schema_reads(saved), as_the_schema_reads(now), schema_defaults())
    if not differ:
        return
    shown = listed_differences(differ, lambda key, old, new: f"{key} differs from the checkpoint's "
                                                             f"({short_value(old)} then, {short_value(new)} now)")
    key, old, _ = differ[0]
    raise UserError(
        f"{shown}: a resume continues the run {checkpoint} was saved by and may change only what "
        f"docs/checkpoints.md lists (train.max_steps, learning rates, amp, logging, ...); resume with "
        f"{key}={short_value(old)} (without --config a resume uses the run's own config.yaml), or start a new run dir "
        f"from its weights (init.generator.path={checkpoint} init.discriminator.path={checkpoint})")


def as_the_schema_reads(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A config (the saved one, the one resumed with) as the schema reads it now: each key segadv
    added since the saved one was written at its default, inside sections too (a saved
    ``target_data`` without ``normalization``), and each key renamed since at its new name
    (segadv/config/renamed.py), so a later release resumes an earlier run; a value its method
    resolves (a null ``loss.lambda_adv``: the method's default) as it resolves it, so a run saved
    with the value and one left at the default compare equal. A config this schema refuses (a key
    since removed) is compared as it is, keys it lacks against ``schema_defaults``."""
    from segadv.config.loading import config_from_dict, config_to_dict

    try:
        cfg = config_from_dict(config, source="a resumed run's config")
    except UserError:
        return config
    return with_method_defaults(config_to_dict(cfg))


def with_method_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` (a config mapping) with each null that stands for a value as that value,
    what runs, for comparing runs: a null ``loss.lambda_adv`` as its method reads it
    (``Method.resolve_adversarial_weight``), and a null stream batch size (``method.<name>.unlabeled_batch_size``,
    ``target_batch_size``: every registered method's ``StreamSpec.batch_size_key``) as ``data.batch_size``
    (``Method.stream_batch_sizes``). A mapping whose method is not registered keeps its
    ``lambda_adv`` as it is."""
    from segadv.config.schema import MethodConfig, registered_methods

    out = dict(config)
    loss, method = out.get("loss"), out.get("method")
    name = (method if isinstance(method, Mapping) else {}).get("name", MethodConfig.model_fields["name"].default)
    if isinstance(loss, Mapping) and "lambda_adv" in loss and loss["lambda_adv"] is None \
            and isinstance(name, str) and name in registered_methods():
        out["loss"] = {**loss, "lambda_adv": registered_methods()[name].resolve_adversarial_weight(None)}
    data = out.get("data")
    batch = data.get("batch_size") if isinstance(data, Mapping) else None
    if batch is not None:
        keys = {spec.batch_size_key for cls in registered_methods().values() for spec in cls.streams}
        for key in sorted(keys - {"data.batch_size"}):
            _resolve_null(out, key.split("."), batch)
    return out


def _resolve_null(config: dict[str, Any], parts: list[str], value: Any) -> None:
    """``config`` at the dotted ``parts`` set to ``value`` where it holds null (copying each
    mapping on the way, so the caller's stays as it was)."""
    node = config
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, Mapping):
            return
        node[part] = child = dict(child)
        node = child
    if parts[-1] in node and node[parts[-1]] is None:
        node[parts[-1]] = value


def schema_defaults() -> dict[str, Any]:
    """Every key's schema default, flattened."""
    from segadv.config.loading import config_to_dict
    from segadv.config.schema import Config

    return flatten(config_to_dict(Config()))


SHOWN_DIFFERENCES = 6  # keys a refusal names; the rest counted


def listed_differences(differ: list, describe) -> str:
    """The first keys of ``differ`` ((key, then, now) triples) as ``describe`` words each, joined,
    and how many more there are."""
    shown = "; ".join(describe(key, then, now) for key, then, now in differ[:SHOWN_DIFFERENCES])
    return shown + (f" (and {len(differ) - SHOWN_DIFFERENCES} more)" if len(differ) > SHOWN_DIFFERENCES else "")


def short_value(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
