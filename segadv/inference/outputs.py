"""Where segadv-predict may write: one mask per input (``<stem>.png``) and, with overlays, one
in ``overlay/``; nothing the user did not name is replaced (docs/inference.md). Every check runs
before the first mask is written."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from segadv.data.masks import PREDICT, written_by
from segadv.errors import UserError
from segadv.fsutil import NAME_MAX, check_output, list_dir, refuse_overwriting

OVERLAY_DIR = "overlay"


def check_outputs(images: Sequence[Path], out_dir: Path, overlay: bool, inputs: Sequence[tuple[str, str]] = (),
                  overwrite: bool = False) -> None:
    """Refuse outputs that would replace an input (an image, the model or checkpoint, the config)
    and, without ``overwrite``, an output folder holding files segadv-predict did not write."""
    by_stem: dict[str, list[Path]] = defaultdict(list)
    for p in images:
        by_stem[p.stem].append(p)
    clashes = {stem: paths for stem, paths in by_stem.items() if len(paths) > 1}
    if clashes:
        stem, paths = next(iter(clashes.items()))
        raise UserError(
            f"{len(clashes)} output name(s) would be written twice, e.g. {stem}.png from "
            f"{', '.join(map(str, paths[:3]))}; give inputs with distinct stems"
        )
    resolved = {p.resolve() for p in images}
    targets = [t for p in images for t in [out_dir / f"{p.stem}.png"] + ([out_dir / OVERLAY_DIR / f"{p.stem}.png"]
                                                                         if overlay else [])]
    # Before any mask is written: a name the file system cannot take fails here, not halfway.
    long_name = next((t for t in targets if len(os.fsencode(t.name)) > NAME_MAX), None)
    if long_name is not None:
        raise UserError(f"the mask {long_name.name[:40]}... for an input would have a name of "
                        f"{len(os.fsencode(long_name.name))} bytes, longer than the {NAME_MAX} a file name may have: "
                        "rename that input")
    for target in targets:
        check_output(target, "mask")  # a device, FIFO or socket among them: refused before any is written
        if target.resolve() in resolved:
            raise UserError(f"writing {target} would overwrite an input image: choose another --output")
    refuse_overwriting([("--output", out_dir), *(("mask", target) for target in targets)], inputs)
    if overwrite:
        return
    foreign = not_ours(out_dir, overlay)
    if foreign:
        shown = ", ".join(str(p) for p in foreign[:3]) + (f", ... ({len(foreign)} in all)" if len(foreign) > 3 else "")
        raise UserError(f"--output {out_dir} holds files segadv-predict did not write ({shown}); masks written "
                        "there could replace them: choose an empty or new folder, or pass --overwrite")


def not_ours(out_dir: Path, overlay: bool) -> list[Path]:
    """Files in ``out_dir`` (and its overlay folder, with ``overlay``) that segadv-predict did not
    write. Hidden files and other subfolders are not looked at: nothing is ever written there."""
    foreign = []
    for folder in [out_dir] + ([out_dir / OVERLAY_DIR] if overlay else []):
        if not folder.is_dir():
            continue
        for path in list_dir(folder, "--output"):
            if not path.name.startswith(".") and not path.is_dir() and not written_by_predict(path):
                foreign.append(path)
    return foreign


def written_by_predict(path: Path) -> bool:
    """Whether ``path`` is a PNG carrying segadv-predict's text chunk (read from its header)."""
    return written_by(path, PREDICT)


def model_files(model: str | None, checkpoint: str | None, config: str | None) -> list[tuple[str, str]]:
    """The files the model comes from (never to be replaced by a mask): an exported ``model`` and
    its sidecar, or a ``checkpoint`` and its ``config``."""
    if model:
        from segadv.export.sidecar import sidecar_path

        return [("--model", model), ("its sidecar", str(sidecar_path(model)))]
    from segadv.checkpoint.inference import read_files  # torch: the checkpoint path only

    return read_files(checkpoint, config)
