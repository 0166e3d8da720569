"""segadv-ckpt: look inside a checkpoint, or turn it into a clean generator-only weights file.

    segadv-ckpt inspect FILE|DIR|RUN_DIR [--trust-checkpoint]
    segadv-ckpt convert FILE|DIR (--output OUT [--safetensors] | --smp DIR) [--network student|teacher]
                        [--config FILE] [key=value ...]

``inspect RUN_DIR`` inspects the run's best checkpoint (segadv/checkpoint/run_checkpoint.py).
``convert`` loads G through the one inference loader (segadv/checkpoint/inference.py), so it takes
what segadv-eval and segadv-export take, ``--network`` included (a mean_teacher run's student,
the default, or its EMA teacher: the same option, segadv/cli/args.py). ``--smp DIR`` writes smp's
``save_pretrained`` format, which ``smp.from_pretrained(DIR)`` opens (segadv/checkpoint/smp_dir.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from segadv.cli.args import (ArgumentParser, HelpFormatter, add_config_arguments, add_network_argument, docs_epilog,
                             parse_args, path_argument)
from segadv.errors import UserError, cli_entry
from segadv.fsutil import (atomic_write_bytes, check_output, check_output_dir, check_parent, file_sha256, make_dir,
                           output_file, refuse_overwriting)

# segadv.checkpoint and torch are imported where a command runs: --help answers without them.

log = logging.getLogger("segadv.cli.ckpt")

TEACHER_KEY = "teacher"  # a mean_teacher run's EMA teacher in its checkpoint (docs/checkpoints.md)


def detect_format(obj: Mapping[str, Any]) -> str:
    import torch

    from segadv.checkpoint.state import is_segadv_checkpoint

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
    from segadv.checkpoint.loader import WRAPPER_SEGMENTS

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
    import torch
    import yaml

    from segadv.checkpoint.io import read_verified
    from segadv.checkpoint.loader import describe_weights, find_state_dict
    from segadv.checkpoint.run_checkpoint import checkpoint_of_run
    from segadv.checkpoint.smp_dir import CONFIG_FILE, WEIGHTS_FILE, read_smp_config
    from segadv.checkpoint.state import is_segadv_checkpoint

    in_run = checkpoint_of_run(path)
    if in_run is not None:
        path = str(in_run.path)
    if Path(path).is_dir():  # an smp save_pretrained directory: its weights, then its config
        config = read_smp_config(Path(path))
        return "\n".join([inspect(str(Path(path) / WEIGHTS_FILE), trusted), f"{CONFIG_FILE}:",
                          *(f"  {key}: {value}" for key, value in config.items())])
    obj, integrity = read_verified(path, trusted=trusted)
    if in_run is not None:  # said once its step is known: best.json is checked against it
        step = obj.get("step") if is_segadv_checkpoint(obj) else None
        log.info("%s", in_run.checked_note(step if isinstance(step, int) else None))
    # One sha256 per file wherever segadv shows one (here, segadv-export's output and sidecar):
    # the whole file's, as sha256sum prints it. The seal inside the file hashes the bytes before
    # it (integrity.py), so it is checked here, not shown as a second hash.
    lines = [f"file:      {path}", f"format:    {detect_format(obj)}",
             f"sha256:    {file_sha256(path)} (the file's, as sha256sum prints it)",
             f"integrity: {integrity.checked}"]
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
    teacher = obj.get(TEACHER_KEY) if is_segadv_checkpoint(obj) else None
    if isinstance(teacher, Mapping) and teacher:
        tensors = [v for v in teacher.values() if isinstance(v, torch.Tensor)]
        params = sum(v.numel() for v in tensors)
        lines.append(f"{'teacher:':<10} ['{TEACHER_KEY}']: {len(tensors)} tensors, {params:,} values; the mean "
                     "teacher's EMA of the generator (segadv-eval/-export/-predict/convert --network teacher)")
    if isinstance(obj.get("config"), dict):
        lines.append("config:")
        lines.append(yaml.safe_dump(obj["config"], sort_keys=False).rstrip().replace("\n", "\n  ").join(["  ", ""]))
    return "\n".join(lines)


def convert(path: str, output: str, as_safetensors: bool, config: str | None, overrides: list[str], trusted: bool,
            network: str | None = None) -> str:
    """Load the generator strictly into a fresh model, then save its bare state dict (sealed with
    its sha256, segadv/checkpoint/integrity.py). ``network``: a mean_teacher checkpoint's student
    (None: the default) or its teacher; a checkpoint without a teacher asked for one is a UserError."""
    from segadv.checkpoint.inference import load_generator, read_files
    from segadv.checkpoint.integrity import seal_safetensors
    from segadv.checkpoint.io import checkpoint_bytes

    if Path(output).is_dir():
        raise UserError(f"--output {output} is a directory; name the weights file to write")
    output = str(output_file(output, "--output"))  # a device, FIFO or socket: refused before the load
    check_parent(output)  # a folder that is a file: refused before the load (a missing one is made)
    refuse_overwriting([("--output", output)], read_files(path, config, name="the checkpoint"))
    loaded = load_generator(path, config, overrides, trusted=trusted, network=network)
    cfg = loaded.cfg
    state = {k: v.contiguous() for k, v in loaded.model.state_dict().items()}
    if as_safetensors:
        from safetensors.torch import save as safetensors_bytes

        data = seal_safetensors(safetensors_bytes(state, metadata={
            "source": Path(path).name, "arch": cfg.model.generator.arch, "encoder": cfg.model.generator.encoder,
            "num_classes": str(cfg.data.num_classes), **({"network": loaded.network} if network else {})}))
    else:
        data = checkpoint_bytes(state)
    make_dir(Path(output).parent)
    atomic_write_bytes(output, data)
    which = "generator only" if network is None else f"the {loaded.network}'s weights only"
    return f"wrote {output}: {which}, {len(state)} tensors, no wrapper prefixes"


def convert_to_smp(path: str, directory: str, config: str | None, overrides: list[str], trusted: bool,
                   overwrite: bool = False, network: str | None = None) -> str:
    """Load the generator strictly into a fresh model, then write it as an smp directory. Like
    segadv-predict's --output, a folder holding files convert did not write is refused without
    ``overwrite``; an input never is replaced."""
    from segadv.checkpoint.inference import load_generator, read_files
    from segadv.checkpoint.smp_dir import SAVE_PRETRAINED_FILES, foreign_files, save_smp_dir

    outputs = [("--smp", directory)] + [(f"--smp {name}", str(Path(directory) / name))
                                        for name in SAVE_PRETRAINED_FILES]
    check_output_dir(directory, "--smp")
    for name in SAVE_PRETRAINED_FILES:
        check_output(Path(directory) / name, f"--smp {directory}: its")
    refuse_overwriting(outputs, read_files(path, config, name="the checkpoint"))
    foreign = [] if overwrite else foreign_files(Path(directory))
    if foreign:
        shown = ", ".join(p.name for p in foreign[:3]) + (f", ... ({len(foreign)} in all)" if len(foreign) > 3 else "")
        raise UserError(f"--smp {directory} holds files segadv-ckpt convert did not write ({shown}); smp's "
                        f"save_pretrained writes {', '.join(SAVE_PRETRAINED_FILES)} there: choose an empty or new "
                        "folder, or pass --overwrite")
    loaded = load_generator(path, config, overrides, trusted=trusted, network=network)
    count = save_smp_dir(loaded.model, Path(directory))
    return f"wrote {directory}: {type(loaded.model).__name__} for smp.from_pretrained, {count} tensors"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="segadv-ckpt", formatter_class=HelpFormatter,
                            description="Inspect or convert checkpoints.",
                            epilog=docs_epilog("checkpoints.md"))
    sub = parser.add_subparsers(dest="command", required=True, help="inspect or convert (COMMAND --help: its options)")
    p_inspect = sub.add_parser("inspect", help="format, wrapper prefixes, parameter counts, step, config")
    p_inspect.add_argument("file", type=path_argument, help="a checkpoint or weights file (any format segadv reads), "
                           "an smp save_pretrained directory, or a run dir (its best checkpoint)")
    p_convert = sub.add_parser("convert", help="write a clean generator-only weights file, or an smp directory")
    p_convert.add_argument("file", type=path_argument, help="segadv checkpoint, raw state dict (needs --config) or smp directory")
    target = p_convert.add_mutually_exclusive_group(required=True)
    target.add_argument("--output", type=path_argument, help="the weights file to write")
    target.add_argument("--smp", metavar="DIR", type=path_argument,
                        help="write smp's save_pretrained format: smp.from_pretrained(DIR)")
    p_convert.add_argument("--overwrite", action="store_true",
                           help="write --smp into a folder holding files convert did not write (inputs are never "
                           "replaced)")
    p_convert.add_argument("--safetensors", action="store_true", help="write safetensors instead of torch.save")
    add_network_argument(p_convert)
    add_config_arguments(p_convert, "says which generator the file holds (raw state dicts)")
    p_convert.add_argument("overrides", nargs="*", metavar="key=value",
                           help="dotted config overrides of the generator's config")
    for p in (p_inspect, p_convert):
        p.add_argument("--trust-checkpoint", action="store_true", help="allow pickled code (off: weights only)")
    return parser


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    from segadv.training.process import setup_logging

    setup_logging()
    if args.command == "inspect":
        print(inspect(args.file, args.trust_checkpoint))
    elif args.smp is not None:
        if args.safetensors:
            raise UserError("--safetensors applies to --output; --smp always writes model.safetensors")
        print(convert_to_smp(args.file, args.smp, args.config, args.overrides, args.trust_checkpoint,
                             overwrite=args.overwrite, network=args.network))
    else:
        print(convert(args.file, args.output, args.safetensors, args.config, args.overrides, args.trust_checkpoint,
                      network=args.network))
    return 0


if __name__ == "__main__":
    sys.exit(main())
