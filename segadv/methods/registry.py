"""Method name -> builder. Adding a method adds a module and a line here, nothing else."""

from __future__ import annotations

from typing import Callable

from segadv.config import Config
from segadv.engine.step import AdversarialStep
from segadv.methods.advsemiseg import AdvSemiSeg
from segadv.methods.base import Method
from segadv.methods.supervised import Supervised


def _supervised(cfg: Config, step: AdversarialStep) -> Method:
    return Supervised(step)


def _advsemiseg(cfg: Config, step: AdversarialStep) -> Method:
    return AdvSemiSeg(step, cfg.method.advsemiseg)


METHODS: dict[str, Callable[..., Method]] = {"supervised": _supervised, "advsemiseg": _advsemiseg}


def build_method(cfg: Config, step: AdversarialStep) -> Method:
    """``step``: the supervised step; its (wrapped) networks, optimizers and device map are the
    ones every method trains."""
    name = cfg.method.name
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}; methods: {', '.join(sorted(METHODS))}")
    return METHODS[name](cfg, step)


def passes_generator_loss_through_discriminator(cfg: Config) -> bool:
    """Whether G's loss has a term backpropagated through D (then a float16 D needs G's loss
    scaled, see build.py)."""
    if cfg.loss.lambda_adv > 0:
        return True
    return cfg.method.name == "advsemiseg" and cfg.method.advsemiseg.lambda_semi_adv > 0


def stream_batch_sizes(cfg: Config) -> dict[str, int]:
    """Per-stream batch sizes a method asks for (others: data.batch_size)."""
    if cfg.method.name == "advsemiseg" and cfg.method.advsemiseg.unlabeled_batch_size is not None:
        return {"unlabeled": cfg.method.advsemiseg.unlabeled_batch_size}
    return {}
