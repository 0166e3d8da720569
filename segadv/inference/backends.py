"""What runs segadv-predict's windows: an ONNX file on onnxruntime (numpy only: torch is never
imported), a torch.export program (.pt2), a TorchScript file, or a checkpoint's G in PyTorch eager;
each with the export metadata (classes, palette, normalisation, input form) the masks are made with."""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from segadv.errors import UserError
from segadv.export.deps import import_extra
from segadv.export.sidecar import EMBED_FILE, EMBED_KEY, parse_metadata, read_sidecar


class Backend:
    """Runs ``N x 3 x H x W`` model inputs; returns float32 logits ``N x C x H x W`` or class ids
    ``N x H x W``. ``meta`` is the export metadata (classes, palette, normalisation, input form);
    ``precision`` what the model computes in and ``precision_why`` where that comes from."""

    meta: dict[str, Any]
    description: str
    fixed_batch: Optional[int] = None
    fixed_size: Optional[tuple[int, int]] = None
    precision: str = "float32"
    precision_why: str = ""

    def exported_precision(self) -> None:
        """An exported model's precision: the one segadv-export wrote it in (its metadata)."""
        self.precision = str(self.meta.get("precision", "float32"))
        self.precision_why = "as exported" + (", segadv-export --half" if self.precision == "float16" else "")

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
        self.exported_precision()

    def run(self, x: np.ndarray) -> np.ndarray:
        out = self.session.run(None, {self.input_name: x})[0]
        return out.astype(np.float32, copy=False) if out.dtype == np.float16 else out


class _TorchBackend(Backend):
    def _setup_device(self, device: Optional[str]) -> None:
        from segadv.parallel import activate, parse_device_map

        device_map = parse_device_map(None if device is None else f"g:{device}")
        activate(device_map)
        self.device = device_map.generator

    def autocast(self) -> Any:
        """The context G's forward runs in (an exported model: none, it computes as exported)."""
        return contextlib.nullcontext()

    def run(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode(), self.autocast():
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
        self.exported_precision()


class ExportedProgramBackend(_TorchBackend):
    """A ``.pt2`` from segadv-export --format exported: ``torch.export.load(path).module()``. A
    static program's shape is its metadata's example shape; a dynamic one takes sides from the
    metadata's ``exported.least_size``, and a smaller window is padded to it (by reflection, as
    the windows are to the size multiple) and its output cropped back."""

    def __init__(self, path: Path, device: Optional[str]) -> None:
        from segadv.export.pt2_export import load_program

        self._setup_device(device)
        extra = {EMBED_FILE: ""}
        try:
            self.module = load_program(path, self.device, extra_files=extra)
        except (RuntimeError, ValueError, KeyError) as err:
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(f"--model {path}: torch.export.load cannot load it ({why})") from None
        self.meta = _metadata(path, extra[EMBED_FILE] or None)
        given = self.meta["input"]
        if not given.get("dynamic_axes"):
            batch, _, height, width = given["example_shape"]
            self.fixed_batch, self.fixed_size = int(batch), (int(height), int(width))
        least = (self.meta.get("exported") or {}).get("least_size")
        self.least_size = tuple(int(v) for v in least) if least else None
        self.description = f"torch.export program on {self.device}"
        self.exported_precision()

    def run(self, x: np.ndarray) -> np.ndarray:
        h, w = x.shape[-2:]
        if self.least_size is None or (h >= self.least_size[0] and w >= self.least_size[1]):
            return super().run(x)
        ph, pw = max(0, self.least_size[0] - h), max(0, self.least_size[1] - w)
        mode = "reflect" if min(h, w) >= 2 else "edge"
        out = super().run(np.pad(x, ((0, 0), (0, 0), (0, ph), (0, pw)), mode=mode))
        return out[..., :h, :w]


class CheckpointBackend(_TorchBackend):
    """PyTorch eager: the generator from a checkpoint, through the strict loader, under the autocast
    its run's evaluations ran it under (segadv/inference/precision.py, as segadv-eval scores it):
    the masks are the ones the run's evaluations predicted; ``amp.generator.enabled=false``
    predicts in float32."""

    def __init__(self, checkpoint: str, config: Optional[str], overrides: Sequence[str], device: Optional[str],
                 trusted: bool, network: Optional[str] = None) -> None:
        from segadv.data import class_names
        from segadv.data.palette import palette
        from segadv.checkpoint.inference import load_generator
        from segadv.export.wrapper import InferenceModel, export_metadata, size_divisor
        from segadv.inference.precision import evaluation_precision

        self._setup_device(device)
        loaded = load_generator(checkpoint, config, overrides, trusted=trusted, network=network)
        cfg = loaded.cfg
        self.evaluation = evaluation_precision(cfg, loaded.network, self.device)
        self.precision, self.precision_why = self.evaluation.name, self.evaluation.why
        divisor = size_divisor(loaded.model)
        self.module = InferenceModel(loaded.model, cfg.data.input_normalization).to(self.device).eval()
        self.meta = export_metadata(
            model_format="checkpoint", model_file=loaded.checkpoint.name, loaded=loaded,
            classes=class_names(cfg.data), palette=palette(cfg.data.num_classes).tolist(), preprocess=None,
            argmax=False, half=False, dynamic=True, input_size=(divisor, divisor), divisor=divisor,
        )
        self.description = f"PyTorch eager on {self.device}"

    def autocast(self) -> Any:
        return self.evaluation.autocast()


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
        # torch.export.save's archive: an archive_format entry since torch 2.6, the program's JSON
        # at the top level in torch 2.5
        if any(n == "archive_format" or n.endswith("/archive_format") for n in names) or \
                "serialized_exported_program.json" in names:
            return ExportedProgramBackend(path, device)
        raise UserError(
            f"--model {path} is a PyTorch checkpoint, not an exported model: use --checkpoint {path}"
        )
    return OnnxBackend(path, device)
