"""ONNX export with ``torch.onnx.export`` (the TorchScript-based exporter, ``dynamo=False``).

Why not the dynamo exporter (the default since torch 2.9): it needs the ``onnxscript`` package,
which is not a segadv dependency, and for smp's DeepLab the classic exporter already gives a
graph with dynamic batch/height/width that onnxruntime matches to ~1e-7. The classic exporter is
deprecated upstream; its deprecation warnings are silenced here and recorded in the sidecar
(``onnx.exporter``).
"""

from __future__ import annotations

import inspect
import io
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from segadv.errors import UserError
from segadv.export.deps import import_extra
from segadv.export.sidecar import EMBED_KEY
from segadv.export.wrapper import INPUT_NAME
from segadv.fsutil import write_new

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17
# Every generator upsamples its logits bilinearly (F.interpolate), which ONNX writes as Resize;
# before opset 11 Resize has no coordinate_transformation_mode, so the exporter cannot write it.
MODEL_MIN_OPSET = 11
EXPORTER = "torch.onnx.export(dynamo=False)"


def supported_opsets() -> range:
    """The opsets the TorchScript-based exporter of this torch can write."""
    constants = getattr(torch.onnx, "_constants", None)
    low = getattr(constants, "ONNX_MIN_OPSET", 7)
    high = getattr(constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", getattr(constants, "ONNX_MAX_OPSET", 20))
    return range(low, high + 1)


def check_opset(opset: int) -> None:
    """Refuse, in one line and before anything is traced, an opset this torch cannot write or
    one below what segadv's generators need."""
    opsets = supported_opsets()
    if opset not in opsets:
        raise UserError(f"--opset {opset}: this torch exports opsets {opsets.start}..{opsets.stop - 1}")
    if opset < MODEL_MIN_OPSET:
        raise UserError(f"--opset {opset}: segadv's generators need opset {MODEL_MIN_OPSET} or newer (their "
                        f"bilinear upsampling is ONNX Resize-{MODEL_MIN_OPSET}); the default is {DEFAULT_OPSET}")


def dynamic_axes(output_name: str, argmax: bool) -> dict[str, dict[int, str]]:
    spatial = {0: "batch", 1: "height", 2: "width"} if argmax else {0: "batch", 2: "height", 3: "width"}
    return {INPUT_NAME: {0: "batch", 2: "height", 3: "width"}, output_name: spatial}


def export_onnx(
    model: nn.Module,
    example: torch.Tensor,
    path: Path,
    *,
    output_name: str,
    argmax: bool,
    opset: int,
    dynamic: bool,
    embed: str,
) -> dict[str, Any]:
    """Export ``model`` to ``path``, embed ``embed`` as metadata, run onnx's checker. ``opset`` is
    one ``check_opset`` passed."""
    onnx = import_extra("onnx", "ONNX export")

    kwargs: dict[str, Any] = dict(
        input_names=[INPUT_NAME],
        output_names=[output_name],
        dynamic_axes=dynamic_axes(output_name, argmax) if dynamic else None,
        opset_version=opset,
        do_constant_folding=True,
    )
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        try:
            with torch.inference_mode(False), torch.no_grad():
                torch.onnx.export(model, (example,), buffer, **kwargs)
        except (ValueError, torch.onnx.errors.OnnxExporterError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            if "[Caused by" in first:
                first = first[: first.index("[Caused by")].rstrip()
            raise UserError(
                f"ONNX export failed at opset {opset}: {type(err).__name__}: {first} "
                f"(a newer opset may support it; default {DEFAULT_OPSET})"
            ) from None
    proto = onnx.load_from_string(buffer.getvalue())
    entry = proto.metadata_props.add()
    entry.key = EMBED_KEY
    entry.value = embed
    write_new(path, proto.SerializeToString())
    try:
        onnx.checker.check_model(str(path), full_check=True)  # the file as written
    except onnx.checker.ValidationError as err:
        raise RuntimeError(f"onnx.checker rejected the exported graph: {err}") from err
    log.info("onnx: opset %d, %d nodes, checker passed", opset, len(proto.graph.node))
    return {"opset": opset, "exporter": EXPORTER, "checker": "passed", "ir_version": int(proto.ir_version)}
