"""One network's optimisation state: optimizer, LR schedule, autocast and its own GradScaler.

Each network gets its own (as mmengine's AmpOptimWrapper does per optimizer): an fp16 overflow in
D skips only D's step and only halves D's scale.

A network's loss is scaled whenever its backward passes through float16, its own or another
network's: G's adversarial term flows back through D, so an fp16 D needs G's loss scaled even when
G itself runs in float32 or bfloat16 (``loss_scaling``, decided in ``build.py``).

``skip_nonfinite`` (``train.on_nonfinite: skip_step``): a network without loss scaling gets a
GradScaler held at scale 1 (exact: the loss and gradients are multiplied by 1), so a step with
non-finite gradients is skipped as an fp16 overflow is; ``skipped`` counts them on the device. Like
every GradScaler step it reads a device flag on the host each step: an opt-in cost.

``accumulation_steps`` K (``train.accumulation_steps``, segadv/engine/accumulation.py): every loss
is divided by K before its backward, and only every K-th ``step()`` call steps (unscale, inf
check, optimizer, scale update, gradients cleared, LR schedule): the schedule counts optimizer
steps.
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import AbstractContextManager
from typing import Any

import torch

from segadv.config.schema import NetworkAmpConfig
from segadv.parallel import fsdp


log = logging.getLogger(__name__)

# When GradScaler skips an optimizer step on overflow the schedule still advances, as it should;
# torch warns about that order on the first step only. It is expected here, not a bug.
warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")


def uses_float16(amp: NetworkAmpConfig) -> bool:
    """Whether ``amp`` (a resolved one: ``enabled: auto`` never chooses float16) runs in float16."""
    return amp.enabled is True and amp.dtype == "float16"


# ``amp.<network>.enabled: auto``. bf16 autocast pays only where the device has bf16 arithmetic:
# on a CPU without it, oneDNN emulates bf16 through float32 conversions and G's step ran 5-8x
# slower (docs/performance.md); on CUDA, bf16 tensor cores start with Ampere (compute capability
# 8.0), and older cards emulate it.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names for native bf16 instructions


def cpu_bf16_features(cpuinfo: str | None = None) -> tuple[str, ...]:
    """This CPU's native bf16 instruction sets (of ``CPU_BF16_FLAGS``): torch's own probes
    (cpuinfo, any OS) together with the kernel's flags in ``/proc/cpuinfo`` (or ``cpuinfo``'s text)."""
    found = set()
    probes = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_bf16": "_is_amx_tile_supported"}
    for flag, probe in probes.items():  # private torch.cpu probes: absent in some versions
        check = getattr(torch.cpu, probe, None)
        try:
            if check is not None and check():
                found.add(flag)
        except RuntimeError:
            pass
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            found.update(set(line.partition(":")[2].split()) & set(CPU_BF16_FLAGS))
            break
    return tuple(flag for flag in CPU_BF16_FLAGS if flag in found)


# oneDNN's CPU ISA levels, lowest first (its ``ONEDNN_MAX_CPU_ISA`` values), and the lowest level
# that runs each native bf16 instruction set: below it oneDNN emulates bf16 whatever the CPU has.
ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
               "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "DEFAULT", "ALL")
ONEDNN_BF16_LEVEL = {"avx512_bf16": "AVX512_CORE_BF16", "amx_bf16": "AVX512_CORE_AMX"}


def onednn_isa_cap(environ: dict[str, str] | None = None) -> str | None:
    """The ISA level oneDNN is capped at by ``ONEDNN_MAX_CPU_ISA`` (or its older name
    ``DNNL_MAX_CPU_ISA``), upper-cased; None without a cap oneDNN would honour (unset, or a name it
    does not know, which it ignores)."""
    environ = os.environ if environ is None else environ
    value = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return value if value in ONEDNN_ISAS and value not in ("DEFAULT", "ALL") else None


def cuda_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def device_native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` computes bf16 natively and faster than float32, and why (for the log)."""
    if device.type == "cpu":
        features = cpu_bf16_features()
        cap = onednn_isa_cap()
        usable = tuple(f for f in features
                       if cap is None or ONEDNN_ISAS.index(cap) >= ONEDNN_ISAS.index(ONEDNN_BF16_LEVEL[f]))
        if usable:
            return True, f"CPU with {' and '.join(usable)}" + (f" (oneDNN capped at {cap})" if cap else "")
        if features:
            return False, (f"CPU with {' and '.join(features)}, but ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN's "
                           f"kernels below them: bf16 runs emulated there, 5-8x slower")
        return False, (f"CPU without native bf16 (no {' or '.join(CPU_BF16_FLAGS)}; torch's capability "
                       f"{torch.backends.cpu.get_cpu_capability()}): bf16 runs 5-8x slower there")
    if device.type == "cuda":
        major, minor = cuda_capability(device)
        if major >= 8:
            return True, f"{device}: CUDA compute capability {major}.{minor} has bf16 tensor cores"
        return False, f"{device}: CUDA compute capability {major}.{minor} < 8.0 emulates bf16"
    return False, f"{device}: no rule for {device.type} devices, so float32"


def resolve_auto(amp: NetworkAmpConfig, devices: tuple[torch.device, ...]) -> tuple[NetworkAmpConfig, str]:
    """``amp`` with ``enabled: auto`` made true (bfloat16) or false for a network on ``devices``
    (every one must compute bf16 natively: DataParallel replicas run the same autocast), and the
    reason; any other ``amp`` is returned as it is."""
    if not amp.is_auto:
        return amp, "set in the config"
    verdicts = [device_native_bf16(device) for device in dict.fromkeys(devices)]
    native = all(ok for ok, _ in verdicts)
    why = "; ".join(reason for ok, reason in verdicts if ok == native)
    return amp.model_copy(update={"enabled": native, "dtype": "bfloat16"}), why


class AmpOptimizer:
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        device: torch.device,
        amp: NetworkAmpConfig,
        loss_scaling: bool | None = None,
        name: str = "network",
        skip_nonfinite: bool = False,
        accumulation_steps: int = 1,
    ) -> None:
        self.name = name  # for log lines
        self.accumulation_steps = accumulation_steps
        self.micro_batches = 0  # step() calls since the last optimizer step
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.stepped_lr: float | None = None  # the LR the last optimizer step used (last_step_lr)
        self.device = device
        self.autocast_dtype = getattr(torch, amp.dtype)
        self.autocast_enabled = amp.enabled
        # Loss scaling only matters for float16; bfloat16 has float32's exponent range.
        if loss_scaling is None:
            loss_scaling = uses_float16(amp)
        self.scales_loss = loss_scaling
        self.scaler = torch.amp.GradScaler(device.type, init_scale=amp.init_scale if loss_scaling else 1.0,
                                           enabled=loss_scaling or skip_nonfinite)
        self.skipped = torch.zeros((), dtype=torch.int64, device=device) if skip_nonfinite else None

    def autocast(self) -> AbstractContextManager:
        """Autocast for this network's own device type and dtype."""
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_enabled)

    def backward(self, loss: torch.Tensor) -> None:
        if self.accumulation_steps > 1:
            loss = loss / self.accumulation_steps  # a micro-batch's share of the step's mean loss
        self.scaler.scale(loss).backward()

    def step(self) -> None:
        """Optimizer step (skipped on inf/nan gradients), scale update, gradients cleared, LR step;
        with accumulation, on every ``accumulation_steps``-th call only (the last micro-batch)."""
        self.micro_batches += 1
        if self.micro_batches < self.accumulation_steps:
            return
        self.micro_batches = 0
        self.scaler.step(self.optimizer)
        if self.skipped is not None:
            found = self.scaler._found_inf_per_device(self.optimizer).values()
            self.skipped += torch.stack([f.to(self.skipped.device) for f in found]).amax().long()
        self.scaler.update(None if self.scales_loss else 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        self.stepped_lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()

    @property
    def lr(self) -> float:
        """The LR (first parameter group's) the next optimizer step will use."""
        return self.optimizer.param_groups[0]["lr"]

    @property
    def last_step_lr(self) -> float:
        """The LR the last optimizer step used, what ``train/lr_<net>`` reports at the step it logs
        (the scheduler has moved on to the next step's by then); before a step, :attr:`lr`."""
        return self.lr if self.stepped_lr is None else self.stepped_lr

    def loss_scale(self) -> float:
        """The current loss scale (1.0 when scaling is off). Syncs with the device: log time only."""
        return float(self.scaler.get_scale()) if self.scales_loss else 1.0

    def state_bytes(self) -> int:
        """Bytes of this optimizer's state once it has stepped (before the first step it has none):
        Adam's two moments, SGD's momentum buffer, per parameter."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        per_param = {torch.optim.Adam: 2, torch.optim.AdamW: 2}.get(type(self.optimizer))
        if per_param is None:
            per_param = int(any(group.get("momentum", 0) for group in self.optimizer.param_groups))
        return per_param * sum(p.numel() * p.element_size() for p in params)  # full sizes: what a checkpoint holds

    def state_dict(self) -> dict[str, Any]:
        """Under FSDP the optimizer's moments are gathered to full plain tensors (every rank takes
        part) under their integer parameter ids, as a single process or DDP saves them."""
        optimizer = self.optimizer.state_dict()
        if fsdp.holds_dtensors(optimizer):
            optimizer = fsdp.full_state(optimizer)
        return {
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scales_loss else {},
        }

    def state_as_held(self) -> dict[str, Any]:
        """The state without gathering sharded moments (their DTensors have the full shapes): what
        a checkpoint of it weighs, read without a collective."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scales_loss else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The optimizer's moments, the schedule's position and the scaler from the checkpoint;
        the settings (learning rate, weight decay, betas, momentum) from this run's config, so an
        override at resume takes effect (torch would bring back the saved ones)."""
        configured = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        saved = state["optimizer"]
        if any(fsdp.holds_dtensors(p) for group in self.optimizer.param_groups for p in group["params"]):
            saved = fsdp.optimizer_state_like(saved, self.optimizer)  # full tensors as this rank's shards
        self.optimizer.load_state_dict(saved)
        for group, settings in zip(self.optimizer.param_groups, configured):
            changed = [f"{k} {group[k]} -> {v}" for k, v in settings.items()
                       if k not in ("lr", "initial_lr") and k in group and group[k] != v]
            if changed:
                log.info("%s optimizer: %s (the config's, from here on)", self.name, ", ".join(changed))
            group.update(settings)  # the schedule's load sets "lr" for the step resumed at
        self.scheduler.load_state_dict(state["scheduler"])
        saved_scaler = state["scaler"]  # {} when saved with loss scaling off
        if self.scales_loss and not saved_scaler:
            log.info("%s: loss scaling is on now but was off in the checkpoint: the GradScaler starts "
                     "fresh (scale %g)", self.name, self.scaler.get_scale())
        elif saved_scaler and not self.scales_loss:
            log.info("%s: loss scaling is off now; the checkpoint's scale (%g) is not used",
                     self.name, saved_scaler.get("scale", float("nan")))
        else:
            self.scaler.load_state_dict(saved_scaler)
