"""One network of a run as the training loop and the methods see it: its role, its module as
trained, its per-network optimisation and its devices (one record per role, built in build.py).
A role that is not trained (the mean teacher: ``RoleSpec.trained``) has no optimisation, only its
own autocast."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from segadv.config.schema import NetworkAmpConfig
from segadv.engine.amp_optimizer import AmpOptimizer
from segadv.config.roles import role
from segadv.parallel.placement import unwrap


@dataclass
class Network:
    role: str  # its role's name (segadv/config/roles.py), also its checkpoint keys
    module: nn.Module  # as trained: bare, DataParallel- or DDP-wrapped
    opt: Optional[AmpOptimizer]  # optimizer with its GradScaler, LR schedule and autocast; None: not trained
    devices: tuple[torch.device, ...]  # devices[0]: where its parameters live and its output is gathered
    amp: Optional[NetworkAmpConfig] = None  # its autocast where it has no optimizer to hold it

    @property
    def trained(self) -> bool:
        """Whether a backward and an optimizer step train it (else its method updates it: the teacher)."""
        return self.opt is not None

    def autocast(self) -> AbstractContextManager:
        """Its forward's autocast (its own device type and dtype)."""
        if self.opt is not None:
            return self.opt.autocast()
        enabled = self.amp is not None and self.amp.enabled
        dtype = getattr(torch, self.amp.dtype) if self.amp is not None else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype, enabled=enabled)

    @property
    def short(self) -> str:
        """The role's short name (g, d, d_aux): the device map's, and its scalars' (train/lr_g)."""
        return role(self.role).short

    @property
    def device(self) -> torch.device:
        return self.devices[0]

    @property
    def bare(self) -> nn.Module:
        """The network behind its wrappers (its state_dict has no ``module.`` prefixes)."""
        return unwrap(self.module)
