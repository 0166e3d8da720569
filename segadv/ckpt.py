"""segadv-ckpt: look inside a checkpoint, or turn it into a clean generator-only weights file.

    segadv-ckpt inspect FILE [--trust-checkpoint]
    segadv-ckpt convert FILE --output OUT [--safetensors] [--config FILE] [key=value ...]
"""

from __future__ import annotations

import argparse
import io
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

import torch
import yaml

from segadv.cli_args import parse_args
from segadv.checkpoint.io import read_checkpoint
from segadv.checkpoint.loader import WRAPPER_SEGMENTS, describe_weights, find_state_dict, load_weights
from segadv.checkpoint.state import is_segadv_checkpoint
from segadv.config import config_from_dict, load_config
from segadv.errors import UserError, cli_entry
from segadv.fsutil import atomic_write_bytes
from segadv.models import build_generator_for_weights
from segadv.runtime import setup_logging


def detect_format(obj: Mapping[str, Any]) -> str:
    if is_segadv_checkpoint(obj):
        return f"segadv training checkpoint (format version {obj.get('format_version')})"
    if all(isinstance(v, torch.Tensor) for v in obj.values()):
        return "raw state dict"
    if "pytorch-lightning_version" in obj:
        return f"Lightning checkpoint (pytorch-lightning {obj['pytorch-lightning_version']})"
    if "meta" in obj and "state_dict" in obj:
        return "mmengine checkpoint"
    return f"dict of {sorted(map(str, obj))[:6]}"


def wrapper_prefixes(keys: list[str]) -> Counter[str]:
    """Leading wrapper/network segments of the keys, e.g. {'module.': 120, 'generator.module.': 8}."""
    found: Counter[str] = Counter()
    for key in keys:
        parts = key.split(".")
        lead = []
        for part in parts[:-1]:
            if part in WRAPPER_SEGMENTS or part in ("generator", "discriminator", "G", "D", "model"):
                lead.append(part)
            else:
                break
        found[".".join(lead) + "." if lead else "(none)"] += 1
    return found


def inspect(path: str, trusted: bool) -> str:
    obj = read_checkpoint(path, trusted=trusted)
    lines = [f"file:      {path}", f"format:    {detect_format(obj)}"]
    if is_segadv_checkpoint(obj):
        lines.append(f"step:      {obj.get('step')}")
        lines.append(f"segadv:    {obj.get('segadv_version')}")
    for role in ("generator", "discriminator"):
        try:
            location, flat = find_state_dict(obj, role)
        except UserError:
            continue
        params = sum(v.numel() for v in flat.values())
        prefixes = ", ".join(f"{p} x{n}" for p, n in wrapper_prefixes(list(flat)).most_common())
        lines.append(f"{role + ':':<10} {location}: {len(flat)} tensors, {params:,} values; prefixes: {prefixes}")
        lines.append(f"{'':<10} looks like {describe_weights(flat)}")
        if location == "top level":
            break  # a bare state dict holds one network
    if isinstance(obj.get("config"), dict):
        lines.append("config:")
        lines.append(yaml.safe_dump(obj["config"], sort_keys=False).rstrip().replace("\n", "\n  ").join(["  ", ""]))
    return "\n".join(lines)


def convert(path: str, output: str, as_safetensors: bool, config: str | None, overrides: list[str], trusted: bool) -> str:
    """Load the generator strictly into a fresh model, then save its bare state dict."""
    obj = read_checkpoint(path, trusted=trusted)
    if config is not None:
        cfg = load_config(config, overrides)
    elif isinstance(obj.get("config"), dict):
        cfg = config_from_dict(obj["config"], overrides=overrides, source=f"config in {path}")
    else:
        raise UserError(f"{path} carries no config: pass --config FILE to say which generator it holds")
    generator = build_generator_for_weights(cfg.model.generator, cfg.data.num_classes)
    load_weights(obj, generator, role="generator")
    state = {k: v.contiguous() for k, v in generator.state_dict().items()}
    if as_safetensors:
        from safetensors.torch import save as safetensors_bytes

        data = safetensors_bytes(state, metadata={"source": Path(path).name, "arch": cfg.model.generator.arch,
                                                  "encoder": cfg.model.generator.encoder,
                                                  "num_classes": str(cfg.data.num_classes)})
    else:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
    atomic_write_bytes(output, data)
    return f"wrote {output}: generator only, {len(state)} tensors, no wrapper prefixes"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="segadv-ckpt", description="Inspect or convert checkpoints.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="format, wrapper prefixes, parameter counts, step, config")
    p_inspect.add_argument("file")
    p_convert = sub.add_parser("convert", help="write a clean generator-only weights file")
    p_convert.add_argument("file")
    p_convert.add_argument("--output", required=True)
    p_convert.add_argument("--safetensors", action="store_true", help="write safetensors instead of torch.save")
    p_convert.add_argument("--config", help="config saying which generator the file holds (raw state dicts)")
    p_convert.add_argument("overrides", nargs="*", metavar="key=value")
    for p in (p_inspect, p_convert):
        p.add_argument("--trust-checkpoint", action="store_true", help="allow pickled code (off: weights only)")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    setup_logging()
    if args.command == "inspect":
        print(inspect(args.file, args.trust_checkpoint))
    else:
        print(convert(args.file, args.output, args.safetensors, args.config, args.overrides, args.trust_checkpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main())
