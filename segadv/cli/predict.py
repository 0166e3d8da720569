"""segadv-predict: segment images with a checkpoint or an exported model; write palette PNG masks.

    segadv-predict (--checkpoint FILE [--config FILE] [key=value ...] | --model FILE.onnx|FILE.pt)
                   --input PATH --output DIR [--batch-size N] [--device DEV] [--overlay]
                   [--mode slide|resize] [--max-size PX] [--overlap F]

``--input``: an image file, a folder (its image files, not recursive) or a quoted glob
(``'photos/**/*.jpg'``). Each image gives ``DIR/<stem>.png``: a palette PNG whose pixel values are
class ids and whose palette is the class colours; ``--overlay`` adds ``DIR/overlay/<stem>.png``
(the image blended with the mask colours).

Sizes: an image whose sides are both at most ``--max-size`` (default 1024) runs whole, padded to
the network's size multiple. A larger one is split into overlapping ``max-size`` windows whose
logits are averaged (``--mode slide``, the default: objects keep the scale the network was trained
at) or shrunk to fit ``max-size`` and the prediction scaled back (``--mode resize``: faster,
coarser). A model exported with fixed input dimensions uses those as the window.

Images are read as training reads them (segadv/data/images.py: EXIF orientation applied, 16-bit
grayscale scaled to 8 bits). Every input's header is checked before the model is loaded: an
unreadable input stops the job naming every one (``--on-error raise``, the default) or is listed
and left out while the rest are segmented (``--on-error skip``).

Nothing the user did not name is replaced: an output that would replace an input (an image, the
model, the config) is refused, and so is an output folder holding files segadv-predict did not
write (its masks carry a ``Software: segadv-predict`` PNG text chunk) unless ``--overwrite``.

With an ONNX ``--model`` this runs on onnxruntime and numpy only: torch, the networks and the
training code are never imported (the model's classes, palette and normalisation come from the
metadata segadv-export embedded in the file, or else from its sidecar ``FILE.json``).
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import glob
import logging
import os
import sys
import time
import zipfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np
from PIL import Image

from segadv.cli.args import HelpFormatter, add_config_arguments, docs_epilog, parse_args, path_argument
from segadv.errors import UserError, cli_entry
from segadv.export.deps import import_extra
from segadv.export.sidecar import EMBED_FILE, EMBED_KEY, parse_metadata, prepare_input, read_sidecar, sidecar_path
from segadv.fsutil import NAME_MAX, atomic_write_bytes, check_output, list_dir, make_dir, refuse_overwriting
from segadv.data.images import ImageProblem, open_image, read_rgb
from segadv.data.masks import PREDICT, overlay_png, palette_png, written_by

log = logging.getLogger("segadv.cli.predict")

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
MODES = ("slide", "resize")
DEFAULT_MAX_SIZE = 1024
OVERLAY_DIR = "overlay"
ON_ERROR = ("raise", "skip")
# The PNG text chunk every file segadv-predict writes carries: its own files may be replaced.
SHOWN = 10  # problems shown in one message


# ----------------------------------------------------------------------------------- backends


class Backend:
    """Runs ``N x 3 x H x W`` model inputs; returns float32 logits ``N x C x H x W`` or class ids
    ``N x H x W``. ``meta`` is the export metadata (classes, palette, normalisation, input form)."""

    meta: dict[str, Any]
    description: str
    fixed_batch: Optional[int] = None
    fixed_size: Optional[tuple[int, int]] = None

    def run(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def _cuda_index(device: str) -> Optional[int]:
    """None for cpu, the CUDA index otherwise (``cuda`` = 0); UserError on anything else."""
    text = device.strip().lower()
    if text == "cpu":
        return None
    if text == "cuda":
        return 0
    number = text.removeprefix("cuda:")
    if number.isdigit():
        return int(number)
    raise UserError(f"--device {device!r}: expected cpu, cuda, cuda:N or N")


class OnnxBackend(Backend):
    def __init__(self, path: Path, device: Optional[str]) -> None:
        ort = import_extra("onnxruntime", "running an ONNX model")

        available = ort.get_available_providers()
        index = _cuda_index(device) if device is not None else (0 if "CUDAExecutionProvider" in available else None)
        if index is None:
            providers: list[Any] = ["CPUExecutionProvider"]
        elif "CUDAExecutionProvider" not in available:
            raise UserError(
                f"--device {device}: this onnxruntime has no CUDA provider (available: {', '.join(available)}); "
                "install onnxruntime-gpu or use --device cpu"
            )
        else:
            providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as err:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise UserError(f"--model {path}: onnxruntime cannot load it: {str(err).strip().splitlines()[0]}") from None
        embedded = self.session.get_modelmeta().custom_metadata_map.get(EMBED_KEY)
        self.meta = _metadata(path, embedded)
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        dims = list(inp.shape)
        self.fixed_batch = dims[0] if isinstance(dims[0], int) else None
        if len(dims) == 4 and isinstance(dims[2], int) and isinstance(dims[3], int):
            self.fixed_size = (dims[2], dims[3])
        used = self.session.get_providers()[0]
        self.description = f"onnxruntime {ort.__version__} ({used})"

    def run(self, x: np.ndarray) -> np.ndarray:
        out = self.session.run(None, {self.input_name: x})[0]
        return out.astype(np.float32, copy=False) if out.dtype == np.float16 else out


class _TorchBackend(Backend):
    def _setup_device(self, device: Optional[str]) -> None:
        from segadv.parallel import activate, parse_device_map

        device_map = parse_device_map(None if device is None else f"g:{device}")
        activate(device_map)
        self.device = device_map.generator

    def run(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.module(torch.from_numpy(x).to(self.device))
        if out.is_floating_point():
            out = out.float()
        return out.cpu().numpy()


class TorchScriptBackend(_TorchBackend):
    def __init__(self, path: Path, device: Optional[str]) -> None:
        from segadv.export.torchscript_export import load_torchscript

        self._setup_device(device)
        extra = {EMBED_FILE: ""}
        try:
            self.module = load_torchscript(path, self.device, extra_files=extra)
        except RuntimeError as err:
            raise UserError(f"--model {path}: not a TorchScript file ({str(err).strip().splitlines()[0]})") from None
        self.meta = _metadata(path, extra[EMBED_FILE] or None)
        self.description = f"TorchScript on {self.device}"


class CheckpointBackend(_TorchBackend):
    """PyTorch eager: the generator from a checkpoint, through the strict loader."""

    def __init__(self, checkpoint: str, config: Optional[str], overrides: Sequence[str], device: Optional[str],
                 trusted: bool, network: Optional[str] = None) -> None:
        from segadv.data import class_names
        from segadv.data.palette import palette
        from segadv.checkpoint.inference import load_generator
        from segadv.export.wrapper import InferenceModel, export_metadata, size_divisor

        self._setup_device(device)
        loaded = load_generator(checkpoint, config, overrides, trusted=trusted, network=network)
        cfg = loaded.cfg
        divisor = size_divisor(loaded.model)
        self.module = InferenceModel(loaded.model, cfg.data.input_normalization).to(self.device).eval()
        self.meta = export_metadata(
            model_format="checkpoint", model_file=loaded.checkpoint.name, loaded=loaded,
            classes=class_names(cfg.data), palette=palette(cfg.data.num_classes).tolist(), preprocess=None,
            argmax=False, half=False, dynamic=True, input_size=(divisor, divisor), divisor=divisor,
        )
        self.description = f"PyTorch eager on {self.device}"


def _metadata(path: Path, embedded: Optional[str]) -> dict[str, Any]:
    """The copy embedded in the model file (it always belongs to that file), else the sidecar."""
    if embedded:
        return parse_metadata(embedded, f"metadata embedded in {path}")
    meta = read_sidecar(path)
    if meta is not None:
        return meta
    raise UserError(
        f"--model {path}: no segadv metadata (no {path.name}.json sidecar and none embedded); "
        "export the model with segadv-export"
    )


def open_model(path_text: str, device: Optional[str]) -> Backend:
    path = Path(path_text)
    if not path.is_file():
        raise UserError(f"--model {path}: file not found")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
        if any("/code/" in n or n.endswith("constants.pkl") for n in names):
            return TorchScriptBackend(path, device)
        raise UserError(
            f"--model {path} is a PyTorch checkpoint, not an exported model: use --checkpoint {path}"
        )
    return OnnxBackend(path, device)


# ----------------------------------------------------------------------------------- inputs


def find_images(spec: str) -> list[Path]:
    """The input images; broken symlinks are kept (and reported as unreadable), never left out."""
    path = Path(spec).expanduser()
    if path.is_file() or _broken_link(path):
        return [path]
    if path.is_dir():
        found = [p for p in list_dir(path, f"--input {spec}")
                 if (p.is_file() or _broken_link(p)) and p.suffix.lower() in IMAGE_SUFFIXES]
        if not found:
            raise UserError(f"--input {spec}: no image files in that folder ({', '.join(sorted(IMAGE_SUFFIXES))})")
        return found
    if glob.has_magic(spec):
        found = sorted(p for p in _glob(str(path)) if p.is_file() or _broken_link(p))
        if not found:
            _list_pattern_root(spec)  # a folder the pattern starts in that cannot be listed is named
            raise UserError(f"--input {spec}: no files match the pattern")
        return found
    raise UserError(f"--input {spec}: no such file or folder")


def _glob(pattern: str) -> list[Path]:
    """The paths ``pattern`` matches. ``**`` (any number of folders) is walked with each real
    folder entered once, so links to ``.`` or ``..`` are followed once instead of forever (Python's
    glob follows them again at every level); without ``**`` this is :func:`glob.glob`."""
    parts = Path(pattern).parts
    if "**" not in parts:
        return [Path(p) for p in glob.glob(pattern)]
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    wanted = parts[fixed:]
    found, seen = [], set()
    try:
        seen.add((root.stat().st_dev, root.stat().st_ino))
    except OSError:
        return []
    for folder, subfolders, files in os.walk(root, followlinks=True):
        entered = []
        for name in subfolders:
            try:
                info = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                entered.append(name)
        subfolders[:] = entered
        relative = Path(folder).relative_to(root).parts
        found += [Path(folder, name) for name in files if _matches(wanted, (*relative, name))]
    return found


def _matches(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Whether path ``parts`` match glob ``pattern`` parts, ``**`` standing for any number of
    parts; a wildcard never matches a hidden name (as glob)."""

    @functools.lru_cache(maxsize=None)
    def match(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(parts)
        if pattern[i] == "**":
            return match(i + 1, j) or (j < len(parts) and not parts[j].startswith(".") and match(i, j + 1))
        if j == len(parts) or (parts[j].startswith(".") and not pattern[i].startswith(".")):
            return False
        return fnmatch.fnmatchcase(parts[j], pattern[i]) and match(i + 1, j + 1)

    return match(0, 0)


def _list_pattern_root(spec: str) -> None:
    """List the folder a glob pattern starts in (its leading parts without wildcards): glob
    passes over folders it cannot read, so an empty match may hide one."""
    parts = Path(spec).expanduser().parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    if root.is_dir():
        list_dir(root, f"--input {spec}")


def _broken_link(path: Path) -> bool:
    return path.is_symlink() and not path.exists()


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


def read_image(path: Path) -> np.ndarray:
    """HxWx3 uint8 RGB as training reads it (segadv/data/images.py); UserError naming ``path``."""
    try:
        return read_rgb(path)
    except ImageProblem as err:
        raise UserError(f"cannot read image {path}: {err}") from None


def scan_inputs(images: Sequence[Path]) -> tuple[list[Path], list[str]]:
    """Open every input's header (no decoding): ``(readable, one message per unreadable one)``."""
    good, problems = [], []
    for path in images:
        try:
            with open_image(path):
                good.append(path)
        except ImageProblem as err:
            problems.append(f"cannot read image {path}: {err}")
    return good, problems


def unreadable_error(problems: Sequence[str], written: int = 0) -> UserError:
    lines = [f"  {p}" for p in problems[:SHOWN]] + ([f"  ... and {len(problems) - SHOWN} more"]
                                                    if len(problems) > SHOWN else [])
    done = f"; {written} mask(s) written before it" if written else ""
    head = problems[0] if len(problems) == 1 else f"{len(problems)} unreadable inputs:\n" + "\n".join(lines)
    return UserError(f"{head}{done} (--on-error skip segments the rest and lists them)")


# ----------------------------------------------------------------------------------- tiling


@dataclass
class TilePlan:
    """How one image becomes model inputs and how the outputs go back together."""

    height: int
    width: int
    canvas: np.ndarray  # 3 x Hc x Wc uint8: the (resized and) padded image the windows come from
    windows: list[tuple[int, int]]  # top-left corners of the windows, each ``tile`` in size
    tile: tuple[int, int]
    scaled: Optional[tuple[int, int]] = None  # resize mode: the size the image was resized to
    outputs: list[np.ndarray] = field(default_factory=list)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _pad(chw: np.ndarray, height: int, width: int) -> np.ndarray:
    ph, pw = height - chw.shape[1], width - chw.shape[2]
    if ph == 0 and pw == 0:
        return chw
    mode = "reflect" if min(chw.shape[1:]) >= 2 else "edge"
    return np.pad(chw, ((0, 0), (0, ph), (0, pw)), mode=mode)


def _starts(length: int, tile: int, stride: int) -> list[int]:
    starts = list(range(0, max(length - tile, 0) + 1, stride))
    if starts[-1] + tile < length:
        starts.append(length - tile)
    return starts


def plan_image(image: np.ndarray, *, mode: str, max_size: int, overlap: float, divisor: int,
               fixed: Optional[tuple[int, int]]) -> TilePlan:
    h, w = image.shape[:2]
    chw = np.ascontiguousarray(image.transpose(2, 0, 1))
    limit = fixed or (max(divisor, max_size // divisor * divisor),) * 2
    if h <= limit[0] and w <= limit[1]:
        size = fixed or (_round_up(h, divisor), _round_up(w, divisor))
        return TilePlan(h, w, _pad(chw, *size), [(0, 0)], size)
    if mode == "resize":
        scale = min(limit[0] / h, limit[1] / w)
        rh, rw = min(limit[0], max(1, round(h * scale))), min(limit[1], max(1, round(w * scale)))
        small = np.asarray(Image.fromarray(image).resize((rw, rh), Image.BILINEAR)).transpose(2, 0, 1)
        size = fixed or (_round_up(rh, divisor), _round_up(rw, divisor))
        return TilePlan(h, w, _pad(np.ascontiguousarray(small), *size), [(0, 0)], size, scaled=(rh, rw))
    tile = limit
    canvas = _pad(chw, max(h, tile[0]), max(w, tile[1]))
    strides = [max(divisor, int(t * (1.0 - overlap)) // divisor * divisor) for t in tile]
    ys = _starts(canvas.shape[1], tile[0], strides[0])
    xs = _starts(canvas.shape[2], tile[1], strides[1])
    return TilePlan(h, w, canvas, [(y, x) for y in ys for x in xs], tile)


def _resize_plane(plane: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    return np.asarray(Image.fromarray(plane).resize((width, height), resample))


def assemble(plan: TilePlan, class_ids: bool, num_classes: int) -> np.ndarray:
    """The ``H x W`` class-id map of one image from its window outputs."""
    th, tw = plan.tile
    hc, wc = plan.canvas.shape[1:]
    if len(plan.windows) == 1 and plan.scaled is None:
        out = plan.outputs[0]
        labels = out if class_ids else out.argmax(axis=0)
        return labels[: plan.height, : plan.width]
    if plan.scaled is not None:
        rh, rw = plan.scaled
        out = plan.outputs[0]
        if class_ids:
            small = out[:rh, :rw].astype(np.int32)
            return _resize_plane(small, plan.height, plan.width, Image.NEAREST)
        planes = [_resize_plane(np.ascontiguousarray(out[c, :rh, :rw], dtype=np.float32), plan.height, plan.width,
                                Image.BILINEAR) for c in range(out.shape[0])]
        return np.stack(planes).argmax(axis=0)
    total = np.zeros((num_classes, hc, wc), dtype=np.float32)
    count = np.zeros((hc, wc), dtype=np.float32)
    for (y, x), out in zip(plan.windows, plan.outputs):
        if class_ids:  # each window votes for its class at each pixel
            for c in range(num_classes):
                total[c, y:y + th, x:x + tw] += out == c
        else:
            total[:, y:y + th, x:x + tw] += out
            count[y:y + th, x:x + tw] += 1
    if not class_ids:
        total /= np.maximum(count, 1)[None]
    return total.argmax(axis=0)[: plan.height, : plan.width]


# ----------------------------------------------------------------------------------- running


def run_windows(backend: Backend, plans: Sequence[TilePlan], batch_size: int) -> None:
    """Run every window of ``plans``, batching windows of the same size together."""
    meta = backend.meta
    kind, dtype = meta["input"]["kind"], meta["input"]["dtype"]
    norm = meta["normalization"]
    groups: dict[tuple[int, int], list[tuple[TilePlan, int]]] = defaultdict(list)
    for plan in plans:
        plan.outputs = [None] * len(plan.windows)  # type: ignore[list-item]
        for i in range(len(plan.windows)):
            groups[plan.tile].append((plan, i))
    step = backend.fixed_batch or batch_size
    for (th, tw), items in groups.items():
        for start in range(0, len(items), step):
            chunk = items[start:start + step]
            pixels = np.stack([p.canvas[:, y:y + th, x:x + tw] for p, i in chunk for (y, x) in [p.windows[i]]])
            if backend.fixed_batch and len(chunk) < backend.fixed_batch:
                fill = np.repeat(pixels[-1:], backend.fixed_batch - len(chunk), axis=0)
                pixels = np.concatenate([pixels, fill])
            out = backend.run(prepare_input(pixels, kind, dtype, norm["mean"], norm["std"], norm.get("channels", "RGB")))
            for (plan, i), result in zip(chunk, out):
                plan.outputs[i] = result


# The mask and overlay writers are segadv/data/masks.py's (segadv-eval --show-dir writes with them too).


def chunks(items: Sequence[Path], size: int) -> Iterator[Sequence[Path]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


# ----------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="segadv-predict", formatter_class=HelpFormatter,
        description="Segment images with a checkpoint (PyTorch) or an exported model (ONNX / TorchScript).",
        epilog=docs_epilog("inference.md"),
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=path_argument, help="segadv checkpoint, a run dir (its best checkpoint), raw generator "
                        "state dict or smp save_pretrained directory (runs PyTorch eager)")
    source.add_argument("--model", type=path_argument, help="a segadv-export file: .onnx (onnxruntime, no torch) or TorchScript")
    p.add_argument("--input", required=True, help="an image, a folder of images or a quoted glob ('dir/*.png')")
    p.add_argument("--output", type=path_argument, required=True, help="folder for the masks (created if missing)")
    add_config_arguments(p, "for a raw state dict (--checkpoint only)")
    p.add_argument("--batch-size", type=int, default=4, help="images (or windows) per forward pass (default 4)")
    p.add_argument("--device", help="cpu, cuda, cuda:N or N (default: cuda:0 when available, else cpu)")
    p.add_argument("--overlay", action="store_true",
                   help=f"also write {OVERLAY_DIR}/<stem>.png: the image with the mask's class colours blended in "
                   "(background, black in the palette, left as it is)")
    p.add_argument("--alpha", type=float, default=0.5, help="mask weight in overlays (default 0.5)")
    p.add_argument("--mode", choices=MODES, default="slide",
                   help="images larger than --max-size: slide overlapping windows (default) or resize to fit")
    p.add_argument("--max-size", type=int, default=DEFAULT_MAX_SIZE,
                   help=f"largest side run in one pass, and the window size (default {DEFAULT_MAX_SIZE})")
    p.add_argument("--overlap", type=float, default=0.25, help="window overlap fraction in slide mode (default 0.25)")
    p.add_argument("--on-error", choices=ON_ERROR, default="raise",
                   help="an unreadable input: stop naming every one (raise, default) or list it and segment "
                   "the rest (skip)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an --output folder holding files segadv-predict did not write (inputs are "
                   "never replaced)")
    p.add_argument("--network", choices=("student", "teacher"),
                   help="of a mean_teacher run's checkpoint: the student (G, default: the network the run scored as "
                        "val/mIoU) or its EMA teacher")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow a checkpoint that needs arbitrary pickled code (only for a file you trust)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides (--checkpoint only; the keys: segadv-train --help-config)")
    return p


def _setup_logging() -> None:
    # segadv.training.process.setup_logging imports torch; the ONNX path must not.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def validate(args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.max_size < 1:
        raise UserError(f"--max-size must be >= 1, got {args.max_size}")
    if not 0.0 <= args.overlap < 1.0:
        raise UserError(f"--overlap must be in [0, 1), got {args.overlap}")
    if not 0.0 <= args.alpha <= 1.0:
        raise UserError(f"--alpha must be in [0, 1], got {args.alpha}")
    if args.model and (args.config or args.overrides or args.trust_checkpoint or args.network):
        raise UserError("--config, --trust-checkpoint and key=value overrides apply to --checkpoint only")


def model_inputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The files the model comes from (never to be replaced by a mask)."""
    if args.model:
        return [("--model", args.model), ("its sidecar", str(sidecar_path(args.model)))]
    from segadv.checkpoint.inference import read_files  # torch: the checkpoint path only

    return read_files(args.checkpoint, args.config)


@cli_entry
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(build_parser(), argv)
    _setup_logging()
    validate(args)
    images = find_images(args.input)
    out_dir = Path(args.output)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--output {out_dir} exists and is not a folder")
    check_outputs(images, out_dir, args.overlay, model_inputs(args), args.overwrite)
    images, problems = scan_inputs(images)
    if problems and args.on_error == "raise":
        raise unreadable_error(problems)
    if not images:
        raise UserError(f"--input {args.input}: none of the {len(problems)} inputs is readable:\n  "
                        + "\n  ".join(problems[:SHOWN]))
    if args.model:
        backend = open_model(args.model, args.device)
    else:
        backend = CheckpointBackend(args.checkpoint, args.config, args.overrides, args.device, args.trust_checkpoint,
                                    args.network)
    meta = backend.meta
    num_classes = len(meta["classes"])
    if num_classes > 256:
        raise UserError(f"{num_classes} classes do not fit a palette PNG (at most 256)")
    palette = np.asarray(meta["palette"], dtype=np.uint8).reshape(-1, 3)
    class_ids = meta["output"]["kind"] == "class_ids"
    divisor = int(meta["input"].get("size_divisor", 1))
    log.info("%d image(s) from %s; model: %s; mode %s, max size %d", len(images), args.input,
             backend.description, args.mode, args.max_size)

    make_dir(out_dir)
    if args.overlay:
        make_dir(out_dir / OVERLAY_DIR)
    counts = np.zeros(num_classes, dtype=np.int64)
    windows = written = 0
    t0 = time.perf_counter()
    for batch in chunks(images, args.batch_size):
        readable: list[tuple[Path, np.ndarray]] = []
        failed = []
        for path in batch:
            try:
                readable.append((path, read_image(path)))
            except UserError as err:  # pixel data that does not decode (a truncated file)
                failed.append(str(err))
        plans = [plan_image(img, mode=args.mode, max_size=args.max_size, overlap=args.overlap, divisor=divisor,
                            fixed=backend.fixed_size) for _, img in readable]
        run_windows(backend, plans, args.batch_size)
        for (path, picture), plan in zip(readable, plans):
            labels = assemble(plan, class_ids, num_classes).astype(np.uint8)
            windows += len(plan.windows)
            counts += np.bincount(labels.reshape(-1), minlength=num_classes)[:num_classes]
            atomic_write_bytes(out_dir / f"{path.stem}.png", palette_png(labels, palette))
            if args.overlay:
                atomic_write_bytes(out_dir / OVERLAY_DIR / f"{path.stem}.png",
                                   overlay_png(picture, labels, palette, args.alpha))
            written += 1
        if failed and args.on_error == "raise":  # the batch's readable images are written first
            raise unreadable_error(failed, written)
        problems += failed
    elapsed = time.perf_counter() - t0

    print(f"model      {backend.description}")
    print(f"wrote      {written} mask(s) to {out_dir}" + (f" (+ overlays in {out_dir / OVERLAY_DIR})" if args.overlay else ""))
    print(f"windows    {windows} forward window(s); mode {args.mode}, max size {args.max_size}; "
          f"{elapsed:.2f} s ({elapsed / max(written, 1) * 1000:.0f} ms/image)")
    total = max(int(counts.sum()), 1)
    print("classes    " + ", ".join(f"{name} {c / total:.1%}" for name, c in zip(meta["classes"], counts)))
    if problems:
        print(f"skipped    {len(problems)} unreadable input(s) (--on-error skip):")
        for problem in problems:
            print(f"  {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
