"""The adversarial references' DeepLab-v2 state dicts, mapped onto segadv's DeepLab-v2.

The references save their generator's ``state_dict()`` with the key names of their own classes:
``Res_Deeplab`` (hfslyc/AdvSemiSeg model/deeplab.py, sud0301/semisup-semseg model/deeplabv2.py,
and the init files the references start from), ``DeeplabMulti`` (wasidennis/AdaptSegNet
model/deeplab_multi.py) and ADVENT's ``ResNetMulti`` (valeoai/ADVENT advent/model/deeplabv2.py,
the same names). Their ResNet keys are torchvision's (``conv1``, ``bn1``, ``layer1`` ...
``layer4``), under segadv's ``encoder.``; their classifiers (``Classifier_Module``) keep four 3x3
convolutions in ``conv2d_list``, rates 6, 12, 18, 24 in that order, which are segadv's
``ASPPV2Classifier`` branches. :data:`REFERENCE_FORMATS` says, per class, which of ``layer5`` /
``layer6`` is the main classifier and which the aux one (layer3's).

The map is strict: every key of the file finds its place, every shape is checked, and the first
key that does not fit is named. Two things are not in the file and are said in the log:
``num_batches_tracked`` (saved by PyTorch 0.4.1 on; older files, such as the published ones, have
none: 0, which no computation reads unless a BatchNorm's momentum is None) and, where the model
sums two branches (``aspp_v2_rates: early_return``), the file's last two, which AdvSemiSeg's,
AdaptSegNet's and s4GAN's classifier never adds (its loop returns after the second).

Weights computed in the references' Caffe layout compute the same only in it
(``model.generator.layout: caffe``): loading them into smp's layout is allowed (a starting point
for fine-tuning) and warned about.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch
from torch import nn

from segadv.errors import UserError
from segadv.models.base import AUX_HEAD_PREFIX

log = logging.getLogger(__name__)

# Leading key segments the references' files put in front of the network's own keys: DataParallel
# (s4GAN saves its wrapped model) and the Caffe-converted init files (``Scale.layer5...``, which
# AdaptSegNet and ADVENT strip with ``'.'.join(i_parts[1:])``).
REFERENCE_WRAPPERS = ("module", "Scale")
REFERENCE_RATES = (6, 12, 18, 24)  # Classifier_Module's dilation_series, conv2d_list's order
BACKBONE = re.compile(r"(conv1|bn1|layer[1-4])\.")
CLASSIFIER = re.compile(r"(layer\d+)\.conv2d_list\.(\d+)\.(weight|bias)$")
MAIN_HEAD = "segmentation_head.0."
AUX_HEAD = AUX_HEAD_PREFIX


class ReferenceWeightsMismatch(UserError):
    """A reference state dict that does not fit the model: the first key that does not, named."""


@dataclass(frozen=True)
class ReferenceFormat:
    """One reference class's state dict: which layer holds the main classifier (on layer4) and
    which, if any, the aux one (on layer3)."""

    name: str
    main: str
    aux: Optional[str] = None

    @property
    def heads(self) -> dict[str, str]:
        """The file's classifier layer -> segadv's module prefix."""
        return {self.main: MAIN_HEAD, **({self.aux: AUX_HEAD} if self.aux else {})}


REFERENCE_FORMATS = (
    ReferenceFormat("Res_Deeplab (AdvSemiSeg, s4GAN; the references' init files)", main="layer5"),
    ReferenceFormat("DeeplabMulti (AdaptSegNet) / ADVENT's multi-level ResNetMulti", main="layer6", aux="layer5"),
    ReferenceFormat("ADVENT's single-level ResNetMulti", main="layer6"),
)


def reference_format(flat: Mapping[str, torch.Tensor]) -> Optional[ReferenceFormat]:
    """The reference class whose state dict ``flat`` is, or None (not a reference file)."""
    bare = [strip_wrappers(k) for k in flat]
    layers = {m.group(1) for k in bare if (m := CLASSIFIER.match(k))}
    # The classifiers and a ResNet body: a file missing some backbone key (conv1.weight) is still
    # one, and the map then names what it lacks, never "an unknown network" missing every key.
    if not layers or not any(BACKBONE.match(k) for k in bare):
        return None
    for fmt in REFERENCE_FORMATS:
        if set(fmt.heads) == layers:
            return fmt
    raise ReferenceWeightsMismatch(
        f"a DeepLab-v2 state dict of the references' kind, but with classifiers {sorted(layers)}: none of "
        f"{[f.name + ' ' + str(sorted(f.heads)) for f in REFERENCE_FORMATS]}")


def strip_wrappers(key: str) -> str:
    parts = key.split(".")
    while len(parts) > 1 and parts[0] in REFERENCE_WRAPPERS:
        parts = parts[1:]
    return ".".join(parts)


def map_reference_weights(
    flat: Mapping[str, torch.Tensor], target: nn.Module, *, exclude: Sequence[str] = (), name: str = "state dict",
) -> dict[str, torch.Tensor]:
    """``flat`` unchanged if it is no reference state dict; else the same tensors under segadv's
    keys, checked against ``target`` (a bare G), ``exclude``'s keys left unchecked as the loader
    leaves them. A :class:`ReferenceWeightsMismatch` names the first key that does not fit."""
    fmt = reference_format(flat) if hasattr(target, "encoder") else None
    if fmt is None:
        return dict(flat)
    def refuse(problem: str) -> ReferenceWeightsMismatch:
        return ReferenceWeightsMismatch(f"{name}: a {fmt.name} state dict: {problem}")

    expected = target.state_dict()
    has_aux = any(k.startswith(AUX_HEAD) for k in expected)
    skipped = {k for k in expected if any(fnmatch.fnmatchcase(k, p) for p in exclude)}
    mapped: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    unused_branches: list[str] = []
    for key, tensor in flat.items():
        bare = strip_wrappers(key)
        classifier = CLASSIFIER.match(bare)
        if classifier:
            layer, branch, param = classifier.groups()
            head = fmt.heads[layer]
            rates = branch_rates(target, head)
            if rates is not None and int(branch) >= len(rates) and len(rates) < len(REFERENCE_RATES):
                unused_branches.append(key)
                continue
            new = f"{head}branches.{branch}.{param}"
        elif BACKBONE.match(bare):
            new = "encoder." + bare
        else:
            raise refuse(f"key {key!r} is no part of the references' DeepLab-v2")
        if new in mapped:
            raise refuse(f"keys {origin[new]!r} and {key!r} are the same weight ({new})")
        if new not in expected and not (new.startswith(AUX_HEAD) and not has_aux):
            hint = ("; the references' classifier is model.generator.arch deeplabv2's"
                    if not any(k.startswith(MAIN_HEAD + "branches.") for k in expected) else "")
            raise refuse(f"key {key!r} has no place in this generator (it would be {new!r}){hint}")
        if new in expected and new not in skipped and tuple(tensor.shape) != tuple(expected[new].shape):
            raise refuse(f"key {key!r} ({new}) has shape {tuple(tensor.shape)}, the model's is "
                         f"{tuple(expected[new].shape)}{shape_hint(new, expected)}")
        mapped[new], origin[new] = tensor, key
    for head in (MAIN_HEAD, AUX_HEAD):
        check_rates(target, head, refuse)
    filled, missing = [], []
    for key, value in expected.items():
        if key in mapped or key in skipped:
            continue
        if key.endswith(".num_batches_tracked") and key.rsplit(".", 1)[0] + ".running_mean" in mapped:
            mapped[key] = torch.zeros_like(value)
            filled.append(key)
            continue
        missing.append(key)
    if missing:
        more = f" (and {len(missing) - 1} more of the model's keys)" if len(missing) > 1 else \
            " (the only one missing)"
        raise refuse(f"the model's {missing[0]!r} is not in the file (it would be "
                     f"{reference_key(missing[0], fmt)!r}){more}")
    if filled:
        log.info("%s: %d BatchNorm num_batches_tracked counters not in the file (saved before PyTorch 0.4.1): 0",
                 name, len(filled))
    if unused_branches:
        log.info("%s: %d tensors of classifier branches the model does not sum left out (%s): aspp_v2_rates "
                 "early_return sums the first two, as AdvSemiSeg's, AdaptSegNet's and s4GAN's Classifier_Module "
                 "does; an ADVENT file sums all four (aspp_v2_rates: paper)", name, len(unused_branches),
                 ", ".join(unused_branches[:4]))
    if getattr(target, "encoder_layout", None) != "caffe":
        log.warning("%s: the references' weights were trained in the Caffe ResNet layout; this generator's encoder "
                    "is in smp's, so it computes something else (model.generator.layout: caffe computes what the "
                    "reference computed)", name)
    log.info("%s: %d tensors of a %s state dict mapped onto segadv's DeepLab-v2", name, len(origin), fmt.name)
    return mapped


def branch_rates(target: nn.Module, head: str) -> Optional[tuple[int, ...]]:
    """The dilation rates of the target's ASPP-v2 classifier at ``head`` (None: it has none)."""
    try:
        branches = target.get_submodule(head.rstrip(".") + ".branches")
    except AttributeError:
        return None
    return tuple(int(conv.dilation[0]) for conv in branches)


def check_rates(target: nn.Module, head: str, refuse) -> None:
    """The file's branch i has rate REFERENCE_RATES[i]: the model's rates must be their start."""
    rates = branch_rates(target, head)
    if rates is not None and rates != REFERENCE_RATES[:len(rates)]:
        raise refuse(f"its classifier's rates are {list(REFERENCE_RATES)} (or the first two), the model's "
                     f"{head.rstrip('.')} has {list(rates)}: model.generator.aspp_v2_rates paper or early_return")


def shape_hint(key: str, expected: Mapping[str, torch.Tensor]) -> str:
    if key.startswith((MAIN_HEAD, AUX_HEAD)):
        return (f" (classes: the file's classifier is for another data.num_classes; to start from its encoder "
                f"alone, init.generator.exclude: ['{MAIN_HEAD}*', '{AUX_HEAD}*'])")
    return " (another encoder: the references' is resnet101)"


def reference_key(key: str, fmt: ReferenceFormat) -> str:
    """The file key segadv's ``key`` is read from (for messages)."""
    if key.startswith("encoder."):
        return key[len("encoder."):]
    for layer, head in fmt.heads.items():
        if key.startswith(head + "branches."):
            return f"{layer}.conv2d_list.{key[len(head + 'branches.'):]}"
    if key.startswith(AUX_HEAD):
        return "an aux classifier on layer3, which only a multi-level file (DeeplabMulti, ADVENT) has"
    return "none: no reference network has it"
