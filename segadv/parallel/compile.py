"""``torch.compile`` of one network (``compile.generator``, ``compile.discriminator``).

Each network is compiled on its own, on its own device, *in place* (``nn.Module.compile``): its
``__call__`` runs the compiled forward, and nothing else about the module changes. So

- parameter names, ``state_dict()``, the optimizer's parameters and every checkpoint are those of
  the plain network (no ``_orig_mod.`` prefix anywhere, strict loading unchanged);
- the wrappers (DataParallel on the host, DDP) and segadv's own views of the bare module (D's
  frozen view for G's loss, evaluation, the image panel) all call the compiled forward;
- the hand-over of G's maps to D's device, the losses, the GradScalers and the optimizer steps
  stay outside the graphs, eager, as they are in an uncompiled run.

What compiles when (docs/training.md "Compiling"): each network's training forward on its first
step; D's frozen view for G's loss (its parameters need no gradient: other guards) at the first
adversarial step; G in eval mode under no_grad at the first evaluation, and once more with a
dynamic batch dimension when the panel or a val batch brings another batch size. After the first
evaluation no step recompiles (tests/parallel/test_compile.py counts them).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from segadv.config.roles import setting
from segadv.config.schema import CompileConfig
from segadv.errors import UserError
from segadv.versions import require_torch

log = logging.getLogger(__name__)


def compile_enabled(cfg: CompileConfig, role: str) -> bool:
    """Whether ``role``'s network is compiled (a role without its own setting follows its fallback's)."""
    return bool(setting(cfg, role))


def check_compile(cfg: CompileConfig, role: str, devices: tuple[torch.device, ...], parallel_mode: str,
                  activation_checkpointing: bool = False) -> None:
    """Refuse, with the setting named, a compile that cannot run here; before anything is built."""
    key = f"compile.{role}"
    if activation_checkpointing:
        require_torch("compile.generator=true with model.generator.activation_checkpointing=true",
                      "upgrade torch, or set one of the two to false")
    if parallel_mode == "dp" and len(devices) > 1:
        # DataParallel's replicas are shallow copies whose compiled __call__ is still the
        # original's (bound to the module on the first device): every replica would run it.
        raise UserError(f"{key}=true with a DataParallel replica set ({'+'.join(map(str, devices))}): torch.compile "
                        f"does not follow DataParallel's replicas; launch one process per GPU (DDP: "
                        f"segadv-train --nproc-per-node N) or set {key}=false")
    if cfg.backend != "inductor":
        return
    device = devices[0]
    if device.type == "cpu":
        if cpp_compiler() is None:
            raise UserError(f"{key}=true: inductor compiles the {role} on the CPU into C++, and no C++ compiler was "
                            "found (g++, or the one named by $CXX); install one, set compile.backend=aot_eager (no "
                            f"code generation, no speed-up) or {key}=false")
    elif device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise UserError(f"{key}=true: inductor compiles the {role} on {device} with Triton, which is not "
                            f"installed (pip install triton), or set {key}=false")


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on the CPU (``$CXX``, else g++), or None."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # InvalidCxxCompiler, or an inductor that cannot even look
        return None


def compile_network(module: nn.Module, cfg: CompileConfig, role: str) -> None:
    """Compile ``module``'s forward in place (see the module's docstring)."""
    options = {"backend": cfg.backend}
    if cfg.mode is not None and cfg.backend == "inductor":
        options["mode"] = cfg.mode
    module.compile(**options)
    log.info("compile: the %s's forward with torch.compile (%s)", role,
             ", ".join(f"{k}={v}" for k, v in options.items()))


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process (all networks): a count that moves on
    every compile and recompile."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
