"""Run an exported file and PyTorch eager on the same random inputs and compare.

Per input shape: the max absolute difference, the max relative difference (the max absolute
difference divided by the largest eager magnitude, so near-zero logits do not blow it up) and the
argmax agreement (fraction of pixels whose class matches). A logits export passes when, at every
shape, ``max_abs <= atol + rtol * max|eager|``; a class-id export (``--with-argmax``) has no
logits to compare and passes when the agreement is at least ``min_agreement``.

The eager reference is always the float32 model: a ``--half`` export is checked against what was
trained, so the float16 tolerances below include float16's rounding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch import nn

from segadv.export.sidecar import prepare_input

# (atol, rtol, min_agreement) per export precision.
DEFAULT_TOLERANCES: dict[str, tuple[float, float, float]] = {
    "float32": (1e-4, 1e-4, 0.999),
    "float16": (1e-2, 1e-2, 0.99),
}


@dataclass
class ShapeCheck:
    shape: list[int]  # the input shape
    max_abs: Optional[float]  # None for class-id outputs and for an output of the wrong shape
    max_rel: Optional[float]
    max_ref: Optional[float]
    agreement: float
    passed: bool
    shape_error: Optional[str] = None


@dataclass
class Verification:
    runtime: str
    reference: str
    atol: float
    rtol: float
    min_agreement: float
    output_kind: str
    checks: list[ShapeCheck] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.passed for c in self.checks)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["passed"] = self.passed
        return out


def make_input(
    rng: np.random.Generator, shape: Sequence[int], kind: str, dtype: str,
    mean: Sequence[float], std: Sequence[float],
) -> np.ndarray:
    """A random RGB image batch in the form the exported model takes (``kind``, ``dtype``)."""
    pixels = rng.integers(0, 256, size=tuple(shape), dtype=np.uint8)
    return prepare_input(pixels, kind, dtype, mean, std)


def reference_tensor(x: np.ndarray) -> torch.Tensor:
    """The same values for the float32 eager model (float16 inputs are upcast exactly)."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.float() if t.dtype == torch.float16 else t


def compare(
    out: np.ndarray, ref: np.ndarray, *, class_ids: bool, atol: float, rtol: float, min_agreement: float,
    shape: Sequence[int],
) -> ShapeCheck:
    if out.shape != ref.shape:
        error = f"output shape {list(out.shape)} but eager gives {list(ref.shape)}"
        return ShapeCheck(list(shape), None, None, None, 0.0, False, error)
    if class_ids:
        agreement = float(np.mean(out == ref))
        return ShapeCheck(list(shape), None, None, None, agreement, agreement >= min_agreement)
    out32, ref32 = out.astype(np.float32), ref.astype(np.float32)
    if not np.isfinite(out32).all():
        return ShapeCheck(list(shape), float("inf"), float("inf"), float(np.abs(ref32).max()), 0.0, False)
    diff = np.abs(out32 - ref32)
    max_abs, max_ref = float(diff.max()), float(np.abs(ref32).max())
    max_rel = max_abs / max_ref if max_ref > 0 else (0.0 if max_abs == 0 else float("inf"))
    agreement = float(np.mean(out32.argmax(axis=1) == ref32.argmax(axis=1)))
    passed = max_abs <= atol + rtol * max_ref
    return ShapeCheck(list(shape), max_abs, max_rel, max_ref, agreement, passed)


def verify(
    run_exported: Callable[[np.ndarray], np.ndarray],
    reference: nn.Module,
    *,
    shapes: Sequence[Sequence[int]],
    kind: str,
    dtype: str,
    class_ids: bool,
    mean: Sequence[float],
    std: Sequence[float],
    atol: float,
    rtol: float,
    min_agreement: float,
    runtime: str,
    reference_name: str = "PyTorch eager, cpu, float32",
    seed: int = 0,
) -> Verification:
    result = Verification(runtime, reference_name, atol, rtol, min_agreement,
                          "class_ids" if class_ids else "logits")
    rng = np.random.default_rng(seed)
    reference = reference.eval()
    for shape in shapes:
        x = make_input(rng, shape, kind, dtype, mean, std)
        with torch.inference_mode():
            ref = reference(reference_tensor(x)).numpy()
        try:
            out = np.asarray(run_exported(x))
        except Exception as err:  # noqa: BLE001 - any runtime failure is a failed verification
            result.error = f"the exported model failed on shape {list(shape)}: {type(err).__name__}: {err}"
            return result
        result.checks.append(compare(out, ref, class_ids=class_ids, atol=atol, rtol=rtol,
                                     min_agreement=min_agreement, shape=shape))
    return result


def format_report(result: Verification) -> list[str]:
    lines = [
        f"verify     {result.runtime} vs {result.reference}",
        (f"           pass: max abs <= {result.atol:g} + {result.rtol:g} * max|eager|"
         if result.output_kind == "logits" else
         f"           pass: class agreement >= {result.min_agreement:.4%}"),
    ]
    for c in result.checks:
        shape = "x".join(str(s) for s in c.shape)
        verdict = "ok" if c.passed else "FAIL"
        if c.shape_error:
            lines.append(f"  {shape:<16} {c.shape_error}   {verdict}")
        elif c.max_abs is None:
            lines.append(f"  {shape:<16} argmax agreement {c.agreement:.4%}   {verdict}")
        else:
            lines.append(
                f"  {shape:<16} max abs {c.max_abs:.3e}  max rel {c.max_rel:.3e}  "
                f"(max|eager| {c.max_ref:.3g})  argmax agreement {c.agreement:.4%}   {verdict}"
            )
    if result.error:
        lines.append(f"  error: {result.error}")
    lines.append(f"result     {'PASS' if result.passed else 'FAIL'}")
    return lines
