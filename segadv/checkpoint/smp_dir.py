"""segmentation-models-pytorch's ``save_pretrained`` directory, read into and written from G.

The directory holds ``config.json`` (the model class under ``_model_class`` and its init kwargs)
and ``model.safetensors``; ``smp.from_pretrained(DIR)`` rebuilds the model from the one and loads
the other strictly. segadv's inference G is that smp model (DeepLabV3 or DeepLabV3Plus, built with
smp's defaults for every kwarg segadv does not set) with two differences, both handled here:

- the encoder stages a shallow ``encoder_depth`` never runs are ``DroppedStage``s in G. Written,
  they hold smp's initial values (seeded, so the file is reproducible; smp never runs them);
  read, their keys are left out by the strict loader.
- the training-only aux head (``model.generator.aux_head``) is never part of an inference G, so
  it is not written (as ``segadv-export`` and ``segadv-ckpt convert`` leave it out).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from torch import nn

from segadv.checkpoint.integrity import seal_safetensors
from segadv.errors import UserError, WriteFailed
from segadv.fsutil import make_dir, staged
from segadv.models.registry import ARCHS as GENERATOR_ARCHS, GeneratorArch

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# What smp's save_pretrained writes (its model card is README.md).
SAVE_PRETRAINED_FILES = (CONFIG_FILE, WEIGHTS_FILE, "README.md")
CLASS_KEY = "_model_class"
# Says only where the encoder's pretraining came from: the weights file brings every weight.
IGNORED_KEYS = ("encoder_weights",)


def smp_archs() -> dict[str, GeneratorArch]:
    """smp's class name -> the arch row whose inference G it is (smp.from_pretrained rebuilds only
    those: the rows with an ``smp_class``, segadv/models/registry.py)."""
    return {row.smp_class: row for row in GENERATOR_ARCHS.values() if row.smp_class is not None}


def read_smp_config(directory: Path) -> dict[str, Any]:
    """``config.json`` of a ``save_pretrained`` directory holding a model segadv's G can be."""
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (directory / name).is_file()]
    if missing:
        raise UserError(f"{directory} is a directory, but not one written by smp's save_pretrained: "
                        f"no {' or '.join(missing)} in it")
    path = directory / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(config, dict) or config.get(CLASS_KEY) not in smp_archs():
        found = config.get(CLASS_KEY) if isinstance(config, dict) else None
        raise UserError(f"{path}: {CLASS_KEY} is {found!r}; segadv's generator is one of {sorted(smp_archs())}")
    return config


def config_overrides(config: Mapping[str, Any]) -> list[str]:
    """``key=value`` overrides giving a segadv config the generator ``config`` describes."""
    row = smp_archs()[config[CLASS_KEY]]
    overrides = [f"model.generator.arch={row.name}"]
    overrides += [f"{key}={json.dumps(config[name])}" for name, key in row.smp_config_keys.items() if name in config]
    return overrides


def check_smp_config(config: Mapping[str, Any], generator: nn.Module, directory: Path, config_source: str) -> None:
    """UserError unless ``generator`` (built from ``config_source``) is the model ``config``
    describes: same class, and every kwarg the file gives is the one G was built with."""
    built = _json_values({**generator.config, CLASS_KEY: type(generator).__name__})
    row = smp_archs().get(type(generator).__name__)
    config_keys = row.smp_config_keys if row is not None else {}
    differ = []
    for name, value in config.items():
        if name in IGNORED_KEYS or _json_values(value) == built.get(name):
            continue
        if name == CLASS_KEY:
            where = "model.generator.arch"
        else:
            where = config_keys.get(name, "segadv's generator cannot set it")
        differ.append(f"{name}: {value!r} in the directory, {built.get(name)!r} in the config ({where})")
    if differ:
        raise UserError(f"{directory / CONFIG_FILE} does not describe the generator of {config_source}:\n  "
                        + "\n  ".join(differ))


def foreign_files(directory: Path) -> list[Path]:
    """Files in ``directory`` that ``segadv-ckpt convert --smp`` would not have written: anything
    but save_pretrained's files beside a ``model.safetensors`` carrying segadv's seal (a folder
    convert wrote before). Hidden files and subfolders are not looked at: nothing is written there."""
    if not directory.is_dir():
        return []
    files = [p for p in sorted(directory.iterdir()) if not p.name.startswith(".") and not p.is_dir()]
    weights = directory / WEIGHTS_FILE
    if weights.is_file() and _sealed_by_segadv(weights):
        return [p for p in files if p.name not in SAVE_PRETRAINED_FILES]
    return files


def _sealed_by_segadv(path: Path) -> bool:
    from segadv.checkpoint.integrity import SAFETENSORS_KEY, CorruptCheckpoint, _safetensors_header

    try:
        _, meta = _safetensors_header(path)
    except (OSError, CorruptCheckpoint):
        return False
    return isinstance(meta, dict) and SAFETENSORS_KEY in meta


def save_smp_dir(generator: nn.Module, directory: Path) -> int:
    """Write the inference ``generator`` as a directory ``smp.from_pretrained`` opens; each file
    is replaced atomically, ``model.safetensors`` sealed with its sha256 (integrity.py). Returns
    the number of tensors written; an OSError is a :class:`WriteFailed` naming the directory."""
    archs = smp_archs()
    if type(generator).__name__ not in archs:
        raise UserError(f"--smp: smp.from_pretrained cannot build {type(generator).__name__} (model.generator.arch "
                        f"is not one of smp's models: {', '.join(sorted(row.name for row in archs.values()))}); "
                        "write a weights file with --output instead")
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--smp {directory}: exists and is not a directory")
    created = not directory.exists()
    make_dir(directory)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = type(generator)(**generator.config)  # every stage, the dropped ones too
    model.load_state_dict({**model.state_dict(), **generator.state_dict()})  # strict
    try:
        with tempfile.TemporaryDirectory(dir=directory, prefix=".staging-") as staging:
            model.save_pretrained(staging)
            weights = Path(staging) / WEIGHTS_FILE
            weights.write_bytes(seal_safetensors(weights.read_bytes()))
            for file in sorted(Path(staging).iterdir()):
                with staged(directory / file.name) as stage:
                    os.replace(file, stage.path)
                    stage.commit()
    except (OSError, SafetensorError) as err:
        if created and not any(directory.iterdir()):  # a failed write leaves no folder it made
            shutil.rmtree(directory, ignore_errors=True)
        if isinstance(err, WriteFailed):
            raise
        raise WriteFailed(directory, as_os_error(err)) from None
    return len(model.state_dict())


def as_os_error(err: BaseException) -> OSError:
    """An OSError for what failed: safetensors reports a failed write as its own error, naming the
    OS's code in its message (``IoError(Os { code: 28, kind: StorageFull, ... })``)."""
    if isinstance(err, OSError):
        return err
    code = re.search(r"code: (\d+)", str(err))
    number = int(code.group(1)) if code else errno.EIO
    return OSError(number, os.strerror(number))


def _json_values(value: Any) -> Any:
    """As JSON holds it (tuples become lists), to compare a file's values with a model's."""
    return json.loads(json.dumps(value))
