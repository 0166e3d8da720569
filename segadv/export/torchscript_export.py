"""TorchScript export: ``torch.jit.script`` (shape-generic), falling back to ``torch.jit.trace``.

A scripted module keeps the model's control flow, so it accepts any batch size and any height
and width the network accepts; ``--dynamic`` changes nothing for it. Tracing records the ops run
for one example input and is used only when scripting fails (some third-party encoders); the
verification at several sizes then shows whether the trace generalises.

TorchScript is deprecated upstream (torch >= 2.10 warns); it still works, and its warnings are
silenced here.
"""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from segadv.export.sidecar import EMBED_FILE
from segadv.fsutil import write_new

log = logging.getLogger(__name__)


def export_torchscript(model: nn.Module, example: torch.Tensor, path: Path, *, embed: str) -> dict[str, str]:
    """Write ``model`` to ``path`` with ``embed`` as the extra file ``segadv.json``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        try:
            compiled = torch.jit.script(model)
            method = "script"
        except Exception as err:  # noqa: BLE001 - any scripting failure falls back to tracing
            log.warning(
                "torch.jit.script failed (%s: %s); tracing instead, which records the ops of one "
                "input shape (the verification at several sizes checks that it generalises)",
                type(err).__name__, str(err).splitlines()[0] if str(err) else "",
            )
            with torch.no_grad():
                compiled = torch.jit.trace(model, (example,), check_trace=False)
            method = "trace"
        buffer = io.BytesIO()  # then a plain write: a failing disk is an OSError naming the file
        torch.jit.save(compiled, buffer, _extra_files={EMBED_FILE: embed})
    write_new(path, buffer.getvalue())
    log.info("torchscript: %s, written", method)
    return {"method": method}


def load_torchscript(
    path: Path, device: str | torch.device = "cpu", extra_files: dict[str, str] | None = None
) -> torch.jit.ScriptModule:
    """``torch.jit.load``; ``extra_files`` (name -> "") is filled with the files' contents."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        loaded: dict = {} if extra_files is None else extra_files
        module = torch.jit.load(str(path), map_location=device, _extra_files=loaded)
    for name, value in loaded.items():
        if isinstance(value, bytes):
            loaded[name] = value.decode("utf-8")
    return module.eval()
