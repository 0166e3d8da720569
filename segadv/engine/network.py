"""One trained network as the training loop and the methods see it: its role, its module as
trained, its per-network optimisation and its devices (one record per role, built in build.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from segadv.engine.amp_optimizer import AmpOptimizer
from segadv.config.roles import role
from segadv.parallel.placement import unwrap


@dataclass
class Network:
    role: str  # its role's name (segadv/config/roles.py), also its checkpoint keys
    module: nn.Module  # as trained: bare, DataParallel- or DDP-wrapped
    opt: AmpOptimizer  # optimizer with its GradScaler, LR schedule and autocast
    devices: tuple[torch.device, ...]  # devices[0]: where its parameters live and its output is gathered

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
