"""Method name -> builder. Adding a method adds a module and a line here, nothing else."""

from __future__ import annotations

from typing import Callable, Optional

from segadv.config import Config
from segadv.config.schema import DomainAdaptationConfig
from segadv.engine.network import Network
from segadv.errors import UserError
from segadv.methods.advsemiseg import AdvSemiSeg
from segadv.methods.base import Method
from segadv.methods.domain_adaptation import DomainAdaptation, self_information
from segadv.methods.s4gan import S4Gan
from segadv.methods.supervised import Supervised
from segadv.monitor.profile import PhaseTimer

DOMAIN_ADAPTATION = ("adaptsegnet", "advent", "minent")
# What D sees, per domain adaptation method (None: no D).
DISCRIMINATOR_INPUTS = {"adaptsegnet": lambda logits: logits.softmax(dim=1), "advent": self_information,
                        "minent": None}


# A builder gets the config, the trained networks (the aux D where the run has one) and the phase
# timer the iteration marks its phases on.
def _supervised(cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer) -> Method:
    return Supervised(g, d, phases, num_classes=cfg.data.num_classes, ignore_index=cfg.data.ignore_index,
                      lambda_adv=cfg.loss.lambda_adv, adv_warmup_steps=cfg.loss.adv_warmup_steps)


def _advsemiseg(cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer) -> Method:
    return AdvSemiSeg(g, d, phases, cfg.method.advsemiseg, num_classes=cfg.data.num_classes,
                      ignore_index=cfg.data.ignore_index, lambda_adv=cfg.loss.lambda_adv,
                      adv_warmup_steps=cfg.loss.adv_warmup_steps)


def _s4gan(cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer) -> Method:
    return S4Gan(g, d, phases, cfg.method.s4gan, num_classes=cfg.data.num_classes, ignore_index=cfg.data.ignore_index)


def _domain_adaptation(cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer) -> Method:
    return DomainAdaptation(g, d, d_aux, phases, adaptation_settings(cfg), DISCRIMINATOR_INPUTS[cfg.method.name],
                            ignore_index=cfg.data.ignore_index, multi_level=cfg.model.generator.aux_head)


METHODS: dict[str, Callable[..., Method]] = {
    "supervised": _supervised, "advsemiseg": _advsemiseg, "s4gan": _s4gan,
    **{name: _domain_adaptation for name in DOMAIN_ADAPTATION},
}


def build_method(cfg: Config, g: Network, d: Network, d_aux: Optional[Network], phases: PhaseTimer) -> Method:
    """The method every network of the run trains under: G, the main D and, where the run has
    one, the aux D (multi-level adaptation)."""
    name = cfg.method.name
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}; methods: {', '.join(sorted(METHODS))}")
    return METHODS[name](cfg, g, d, d_aux, phases)


def check_method_config(cfg: Config) -> None:
    """What the schema cannot check alone: the method's fit with the model and the data."""
    name = cfg.method.name
    if cfg.model.generator.aux_head and name not in DOMAIN_ADAPTATION:
        raise UserError(f"model.generator.aux_head: the {name} method trains the main output only; the aux head "
                        f"is for {', '.join(DOMAIN_ADAPTATION)} (multi-level adaptation)")
    if name == "s4gan" and cfg.model.discriminator.kind != "image":
        raise UserError("model.discriminator.kind: s4gan's D scores whole images with their class maps; set "
                        "model.discriminator.kind: image (configs/s4gan_voc.yaml)")
    for key in ("discriminator", "discriminator_aux"):
        section = getattr(cfg.model, key)
        if name != "s4gan" and section is not None and section.kind == "image":
            raise UserError(f"model.{key}.kind: image is s4gan's image-level D; the {name} method's D scores "
                            "pixels (kind: fc)")
    if name in DOMAIN_ADAPTATION and cfg.target_data is None:
        raise UserError(f"target_data: method {name} adapts to a target domain; give target_data "
                        "(docs/methods.md \"Domain adaptation\")")


def adaptation_settings(cfg: Config) -> DomainAdaptationConfig:
    return getattr(cfg.method, cfg.method.name)


def has_aux_discriminator(cfg: Config) -> bool:
    """Whether the run trains a second D, on the aux output (multi-level adversarial adaptation)."""
    return cfg.model.generator.aux_head and DISCRIMINATOR_INPUTS.get(cfg.method.name) is not None


def passes_generator_loss_through_discriminator(cfg: Config) -> bool:
    """Whether G's loss has a term backpropagated through a D (then a float16 D needs G's loss
    scaled, see build.py)."""
    name = cfg.method.name
    if name in DOMAIN_ADAPTATION:
        settings = adaptation_settings(cfg)
        return DISCRIMINATOR_INPUTS[name] is not None and (
            settings.lambda_adv_main > 0 or (cfg.model.generator.aux_head and settings.lambda_adv_aux > 0))
    if name == "s4gan":  # feature matching is its only term through D (loss.lambda_adv is not used)
        return cfg.method.s4gan.lambda_fm > 0
    if cfg.loss.lambda_adv > 0:
        return True
    return name == "advsemiseg" and cfg.method.advsemiseg.lambda_semi_adv > 0


def stream_batch_sizes(cfg: Config) -> dict[str, int]:
    """Per-stream batch sizes a method asks for (others: data.batch_size)."""
    if cfg.method.name in ("advsemiseg", "s4gan") and getattr(cfg.method, cfg.method.name).unlabeled_batch_size:
        return {"unlabeled": getattr(cfg.method, cfg.method.name).unlabeled_batch_size}
    if cfg.method.name in DOMAIN_ADAPTATION and adaptation_settings(cfg).target_batch_size is not None:
        return {"target": adaptation_settings(cfg).target_batch_size}
    return {}
