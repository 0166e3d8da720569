"""The one inference loader: a checkpoint, a weights file or an smp directory (+ an optional
config) -> the bare generator, for segadv-eval, segadv-ckpt convert, segadv-export and
segadv-predict.

- A segadv checkpoint carries its resolved config (a config file, if named, replaces it).
- A raw state dict (``.pt``/``.pth``/``.safetensors``: plain, DataParallel, DDP or
  ``torch.compile`` prefixes, or weights under ``state_dict`` / ``model`` / ``generator`` ...)
  carries none, so the caller must name a config file.
- A run dir means its best checkpoint (``checkpoints/best.pt``; ``last.pt`` before any evaluation:
  segadv/checkpoint/run_checkpoint.py), for every command that takes a checkpoint.
- A directory written by smp's ``save_pretrained`` (segadv/checkpoint/smp_dir.py) describes G in
  its ``config.json``; the rest (data: classes, normalisation) comes from the named config file,
  whose generator must be the one described, or else from the embedded default config.

A checkpoint of a run with a mean teacher holds two segmentation networks: ``network`` picks the
student (G, ``generator``) or its EMA teacher (``teacher``); by default the student, the network
the run scored as ``val/mIoU`` (as DACS evaluates its student), said in the log.

Weights always go through :func:`segadv.checkpoint.loader.load_weights` (strict; a clear error
on any mismatch).
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

from segadv.checkpoint.io import read_checkpoint
from segadv.checkpoint.loader import CheckpointMismatchError, load_weights
from segadv.checkpoint.run_checkpoint import checkpoint_of_run
from segadv.checkpoint.smp_dir import CONFIG_FILE, WEIGHTS_FILE, check_smp_config, config_overrides, read_smp_config
from segadv.checkpoint.state import is_segadv_checkpoint
from segadv.config import Config, config_from_dict, config_to_dict, load_config
from segadv.config.loading import mapping_over_caps
from segadv.config.resume import as_the_schema_reads, flatten, listed_differences, short_value
from segadv.errors import UserError
from segadv.fsutil import file_sha256
from segadv.models import build_generator_for_weights

log = logging.getLogger(__name__)


@dataclass
class LoadedGenerator:
    model: nn.Module  # the bare generator, eval mode, on the CPU, float32
    cfg: Config
    checkpoint: Path
    sha256: str  # of the weights file (an smp directory's model.safetensors)
    kind: str  # "segadv checkpoint", "state dict" or "smp directory"
    step: Optional[int]
    config_source: str  # where the config came from
    network: str = "student"  # which of the checkpoint's networks: student (G) or teacher (NETWORKS)

    def source_info(self) -> dict[str, Any]:
        return {
            "checkpoint": str(self.checkpoint),
            "sha256": self.sha256,
            "kind": self.kind,
            "step": self.step,
            "config": self.config_source,
            "network": self.network,
        }


# ``--network`` -> the checkpoint key it names. The run scores the student (G) as val/mIoU, as
# DACS evaluates its student; the teacher is the mean teacher's EMA of it.
NETWORKS = {"student": "generator", "teacher": "teacher"}


def checkpoint_path(checkpoint: str | Path, *, say: bool = True) -> Path:
    """The file (or smp directory) ``checkpoint`` names: a run dir's best checkpoint, said in the log
    unless ``say`` is false."""
    in_run = checkpoint_of_run(checkpoint)
    if in_run is None:
        return Path(checkpoint)
    if say:
        log.info("%s", in_run.note)
    return in_run.path


def read_files(checkpoint: str | Path, config: Optional[str] = None,
               name: str = "--checkpoint") -> list[tuple[str, str]]:
    """``(what, path)`` of every file :func:`load_generator` reads: none may be an output.
    ``name``: how the command's user gave the checkpoint (an option or an argument)."""
    path = checkpoint_path(checkpoint, say=False)  # load_generator says it
    files = [(name, str(path))]
    if path.is_dir():
        files += [(f"{name}'s {file}", str(path / file)) for file in (CONFIG_FILE, WEIGHTS_FILE)]
    return files + ([("--config", str(config))] if config else [])


def load_generator(
    checkpoint: str | Path,
    config: Optional[str] = None,
    overrides: Sequence[str] = (),
    *,
    trusted: bool = False,
    network: Optional[str] = None,
) -> LoadedGenerator:
    """The bare G of ``checkpoint``; ``network``: student or teacher where the checkpoint holds a
    mean teacher (None: the student, the network the run scored as val/mIoU)."""
    if network is not None and network not in NETWORKS:
        raise UserError(f"--network {network}: choose {' or '.join(NETWORKS)}")
    in_run = checkpoint_of_run(checkpoint)
    path = Path(checkpoint) if in_run is None else in_run.path
    if path.is_dir():
        if network == "teacher":
            raise UserError(f"--network teacher: {path} is an smp directory, which holds one network (no teacher)")
        return _load_smp_dir(path, config, overrides)
    ckpt = read_checkpoint(path, trusted=trusted)
    cfg, config_source = resolve_config(ckpt, path, config, overrides)
    segadv_ckpt = is_segadv_checkpoint(ckpt)
    step = ckpt.get("step") if segadv_ckpt else None
    if in_run is not None:  # said once its step is known: best.json is checked against it
        log.info("%s", in_run.checked_note(step if isinstance(step, int) else None))
    has_teacher = segadv_ckpt and NETWORKS["teacher"] in ckpt
    if network == "teacher" and not has_teacher:
        raise UserError(f"--network teacher: {path} holds no teacher (only a run with an EMA teacher, mean_teacher "
                        "or unimatch v2, saves one); leave --network out to use its generator")
    chosen = network or "student"
    if has_teacher:
        log.info("%s: the %s (%s)%s", path, chosen, NETWORKS[chosen],
                 "; the run scored it as val/mIoU, --network teacher picks its EMA teacher" if network is None else "")
    return LoadedGenerator(
        model=_load_into(build_generator_for_weights(cfg.model.generator, cfg.data.num_classes),
                         ckpt[NETWORKS[chosen]] if has_teacher else ckpt, path, role=NETWORKS[chosen]),
        cfg=cfg,
        checkpoint=path,
        sha256=file_sha256(path),
        kind="segadv checkpoint" if segadv_ckpt else "state dict",
        step=int(step) if isinstance(step, int) else None,
        config_source=config_source,
        network=chosen,
    )


# What a checkpoint fixes for every command that runs its G (flat config keys, ``*`` matching any
# part): its classes, the input convention it was trained on, and G itself. A ``--config`` or a
# ``key=value`` of an inference command that sets one of them differently from the config stored
# in the checkpoint is refused (exit 2 naming the key and both values): scoring, exporting or
# predicting with another input than G was trained on is silently wrong. docs/inference.md lists them.
INFERENCE_FIXED = ("data.num_classes", "data.normalization", "data.mean", "data.std", "model.generator.*")
# The generator keys that do not change what an inference G computes, each with why.
INFERENCE_MAY_CHANGE: dict[str, str] = {
    "model.generator.encoder_weights": "the checkpoint brings every weight",
    "model.generator.activation_checkpointing": "training only",
    "model.generator.aux_head": "training only: inference uses the main output",
    "model.generator.norm": "training only: an inference G runs BatchNorm on its running statistics",
    "model.generator.drop_path_rate": "training only",
    "model.generator.attention": "the attention kernel, not what it computes",
}


def fixed_by_checkpoint(key: str) -> bool:
    return (any(fnmatch.fnmatchcase(key, pattern) for pattern in INFERENCE_FIXED)
            and not any(fnmatch.fnmatchcase(key, pattern) for pattern in INFERENCE_MAY_CHANGE))


def check_inference_config(saved: Mapping[str, Any], cfg: Config, path: Path, source: str) -> None:
    """``cfg`` (the checkpoint's config under the command's overrides, or ``--config``) against the
    config stored in ``path``: UserError naming every key of :data:`INFERENCE_FIXED` that differs."""
    cap = mapping_over_caps(saved)  # compared by recursion below: the YAML loader's caps first
    if cap is not None:
        raise UserError(f"the config stored in {path} is refused: it holds {cap}")
    old, new = flatten(as_the_schema_reads(saved)), flatten(config_to_dict(cfg))
    differ = [(key, old.get(key), new.get(key)) for key in sorted(set(old) | set(new))
              if fixed_by_checkpoint(key) and old.get(key) != new.get(key)]
    if not differ:
        return
    shown = listed_differences(differ, lambda key, then, now: f"{key}={short_value(now)} ({source}) differs from "
                                                              f"the checkpoint's {short_value(then)}")
    key, then, _ = differ[0]
    raise UserError(
        f"{shown}: {path}'s G was trained with its own classes, input normalisation and network, "
        f"and is scored, exported and run with them; leave {key} out (or set {key}={short_value(then)})")


def resolve_config(ckpt: dict, path: Path, config: Optional[str], overrides: Sequence[str]) -> tuple[Config, str]:
    saved = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else None
    if config is not None:
        cfg = load_config(config, overrides)
        if saved is not None:
            check_inference_config(saved, cfg, path, f"--config {config}" + (" + key=value" if overrides else ""))
        return cfg, str(config)
    if saved is not None:
        source = f"config saved in {path}"
        cfg = config_from_dict(saved, overrides=overrides, source=source)
        if overrides:
            check_inference_config(saved, cfg, path, "key=value")
        return cfg, source
    raise UserError(
        f"{path} carries no config (a raw state dict, not a segadv checkpoint): pass --config FILE "
        "(and key=value overrides) describing the generator it was trained with"
    )


def _load_smp_dir(directory: Path, config: Optional[str], overrides: Sequence[str]) -> LoadedGenerator:
    smp_config = read_smp_config(directory)
    if config is not None:
        cfg, config_source = load_config(config, overrides), str(config)
    else:
        cfg = load_config(None, [*config_overrides(smp_config), *overrides])
        config_source = f"{directory / CONFIG_FILE} over the default config"
    generator = build_generator_for_weights(cfg.model.generator, cfg.data.num_classes)
    check_smp_config(smp_config, generator, directory, config_source)
    weights = directory / WEIGHTS_FILE
    return LoadedGenerator(
        model=_load_into(generator, read_checkpoint(weights), weights),
        cfg=cfg,
        checkpoint=directory,
        sha256=file_sha256(weights),
        kind="smp directory",
        step=None,
        config_source=config_source,
    )


def _load_into(generator: nn.Module, weights: Mapping[str, torch.Tensor], path: Path,
               role: str = "generator") -> nn.Module:
    try:
        load_weights(weights, generator, role=role, name=str(path))
    except CheckpointMismatchError as err:
        raise CheckpointMismatchError(f"checkpoint {path}: {err}") from None
    return generator.float().eval()
