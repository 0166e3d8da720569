"""One network of a run as decided before it is built: the one record of it (``Role``) that the
start's checks make (segadv/training/checks.py ``check_role``), the build completes with what its
resolved settings say (segadv/training/build.py ``network_roles``) and the rest of the package asks.
What a role is whatever the run (its name, short name, kind, fallback) stays the role table's
``RoleSpec`` (segadv/config/roles.py), which the record holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from segadv.checkpoint import load_encoder_weights
from segadv.config import Config
from segadv.config.roles import RoleSpec, built_as, setting
from segadv.config.schema import DiscriminatorConfig, GeneratorConfig, InitSource, NetworkAmpConfig, OptimizerConfig
from segadv.models import build_discriminator, build_generator


@dataclass(frozen=True)
class NetworkSettings:
    """One role's settings from the config's per-network sections."""

    model: GeneratorConfig | DiscriminatorConfig
    optim: OptimizerConfig
    amp: NetworkAmpConfig
    parallel: str
    init: InitSource | None  # weights to start from (init.<role>), or None


def network_settings(cfg: Config, role: str) -> NetworkSettings:
    """``role``'s model, optimizer, AMP and parallel settings, its own or where it has none those of
    the role it falls back to (each network still gets its own instances: optimizer, GradScaler,
    wrapper); and its ``init`` weights, its own only: a role without an ``init`` key starts from its
    own initialisation."""
    return NetworkSettings(*(setting(section, role) for section in (cfg.model, cfg.optim, cfg.amp, cfg.parallel)),
                           getattr(cfg.init, role, None))


def generator_model(cfg: GeneratorConfig, num_classes: int) -> nn.Module:
    """G, with the local encoder weights file ``model.generator.encoder_weights`` names, if any."""
    model = build_generator(cfg, num_classes)
    load_encoder_weights(model, cfg)
    return model


@dataclass(frozen=True)
class Role:
    """One network of the run and everything decided for it before it is built; where the generator
    and the discriminators differ, the record says (``generator``). The rest of the package loops
    over a run's roles and asks them."""

    spec: RoleSpec  # its role in the role table (segadv/config/roles.py)
    settings: NetworkSettings  # amp.<role>.enabled: auto resolved on its devices once built (network_roles)
    devices: tuple[torch.device, ...]  # devices[0]: where its parameters live and its output is gathered
    mode: str  # its wrapper: none, dp or ddp, or fsdp (sharded in place)
    checkpointing: bool  # activation checkpointing of its blocks
    compiled: bool  # torch.compile of its forward
    sync_bn: bool  # its BatchNorm layers synchronised across ranks
    horizon: int | None = None  # the steps its poly schedule decays over (trained only; poly_horizon)
    loss_scaling: bool | None = None  # scale its loss whatever its own AMP says (None: as its AMP says)

    @property
    def name(self) -> str:
        """Its role's name: its config key and checkpoint keys."""
        return self.spec.name

    @property
    def short(self) -> str:
        """Its role's short name: the device map's, and its scalars' (train/lr_g, amp/scale_d_aux)."""
        return self.spec.short

    @property
    def trained(self) -> bool:
        """Trained by a backward and an optimizer step; else no optimizer, no GradScaler, no
        gradient-syncing wrapper, no gradients: its method updates it (the teacher)."""
        return self.spec.trained

    @property
    def generator(self) -> bool:
        return built_as(self.name) == "generator"

    @property
    def build(self) -> Callable[[GeneratorConfig | DiscriminatorConfig, int], nn.Module]:
        """(model settings, classes) -> its network."""
        return generator_model if self.generator else build_discriminator

    @property
    def broadcast_buffers(self) -> bool:
        """Under DDP: G's BatchNorm statistics follow rank 0, so every rank evaluates (and could
        save) the same model; a D has no buffers, so there is nothing to broadcast."""
        return self.generator
