"""One strict loader for every source of network weights.

Sources: segadv checkpoints; the adversarial references' DeepLab-v2 state dicts
(segadv/checkpoint/reference_weights.py); raw state dicts saved from a plain model, ``nn.DataParallel``,
``DistributedDataParallel`` or ``torch.compile`` (or nestings of them); and dicts keeping the
weights under a key or prefix (``state_dict``, ``model``, ``generator``/``G``,
``discriminator``/``D``: mmengine, Lightning, torchvision references). The target may be wrapped.

Key normalisation is not a blind strip: the loader finds the one key prefix that maps the file
onto the model's keys, proves it by matching every key, and logs what it did. Then it loads with
``strict=True``. Partial loading happens only through explicit ``exclude`` glob patterns.
"""

from __future__ import annotations

import fnmatch
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import is_fake
from torch import nn

from segadv.checkpoint.io import read_checkpoint
from segadv.checkpoint.reference_weights import map_reference_weights, reference_format, strip_wrappers
from segadv.models.registry import generator_arch, resolve
from segadv.config.schema import GeneratorConfig
from segadv.errors import UserError
from segadv.models.base import AUX_HEAD_PREFIX, DroppedStage
from segadv.models.generator import local_encoder_weights
from segadv.parallel.fsdp import is_sharded, like_current
from segadv.parallel.placement import unwrap

log = logging.getLogger(__name__)

# Segments that wrappers add in front of a network's own keys.
WRAPPER_SEGMENTS = ("module", "_orig_mod")
# Keys (and key-prefix segments) under which files keep a network's weights, per role.
ROLE_KEYS = {
    "generator": ("generator", "G", "netG", "gen", "segmentor", "model"),
    "discriminator": ("discriminator", "D", "netD", "disc", "model_D"),
}
CONTAINER_KEYS = ("state_dict", "model", "module", "weights", "params")
SHOW = 4  # keys shown per group in error messages


class CheckpointMismatchError(UserError):
    """The file's weights do not fit the model (missing, unexpected or mis-shaped keys)."""


@dataclass
class LoadReport:
    source: str
    location: str  # where in the file the weights were found, e.g. "['generator']"
    prefix: str  # the key prefix stripped from the file's keys ("" if none)
    loaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # excluded by pattern
    other_networks: list[str] = field(default_factory=list)  # file keys of other networks, unused


def load_weights(
    source: str | Path | Mapping[str, Any],
    model: nn.Module,
    *,
    role: str = "generator",
    exclude: Sequence[str] = (),
    trusted: bool = False,
    name: str | None = None,
) -> LoadReport:
    """Load ``role``'s weights from ``source`` into ``model`` (wrapped or not), strictly.
    ``name`` labels an in-memory ``source`` in messages (e.g. the file it was read from)."""
    if name is None:
        name = str(source) if isinstance(source, (str, Path)) else "state dict"
    obj = read_checkpoint(source, trusted=trusted) if isinstance(source, (str, Path)) else dict(source)
    target = unwrap(model)
    expected = target.state_dict()
    location, flat = find_state_dict(obj, role)
    flat = map_reference_weights(flat, target, exclude=exclude, name=name)  # the references' own key names
    flat, dropped_aux = drop_training_only_head(flat, expected)
    flat, dropped_stages = drop_unused_stage_keys(flat, target)
    skipped = sorted(k for k in expected if any(fnmatch.fnmatchcase(k, p) for p in exclude))
    required = {k: v for k, v in expected.items() if k not in skipped}
    if not required:
        raise UserError(f"exclude patterns {list(exclude)} exclude every {role} key: nothing to load")
    prefix, other = match_prefix(flat, required, role, known=expected)
    if prefix is None:
        raise CheckpointMismatchError(mismatch_message(name, location, flat, required, role))
    mapped = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
    if any(tuple(mapped[k].shape) != tuple(v.shape) for k, v in required.items()):
        raise CheckpointMismatchError(mismatch_message(name, location, flat, required, role, prefix))
    check_weight_values({prefix + k: mapped[k] for k in required}, {prefix + k: v for k, v in required.items()}, name)
    state = {k: (expected[k] if k in skipped else mapped[k]) for k in expected}
    if is_sharded(target):  # the file's full tensors as this rank's shards (no communication)
        state = like_current(state, expected)
    target.load_state_dict(state)  # strict: every key present, none extra
    report = LoadReport(name, location, prefix, sorted(set(expected) - set(skipped)), skipped, other)
    _log_report(report, role)
    if dropped_aux:
        log.info("%s: the file's aux head (%d tensors, training only) is not part of this model: left out",
                 role, dropped_aux)
    if dropped_stages:
        log.info("%s: the file's %d tensors of encoder stages this encoder_depth never runs: left out",
                 role, dropped_stages)
    return report


def load_encoder_weights(generator: nn.Module, cfg: GeneratorConfig) -> None:
    """Load the local file ``cfg.encoder_weights`` names (if it names one) into G's encoder,
    strictly; ``build_generator`` fetches named smp sets ("imagenet") itself."""
    path = local_encoder_weights(cfg)
    if path is None:
        return
    own_loader = generator_arch(cfg.arch).encoder_weights_loader
    if own_loader is not None:  # the arch reads its own layouts (DINOv2: timm's and the official)
        try:
            obj = read_checkpoint(path)
            check_weight_values(obj, None, str(path))  # its own map renames keys: every tensor a weight
            resolve(own_loader)(unwrap(generator), obj, f"model.generator.encoder_weights {path}")
        except UserError as err:
            raise UserError(f"model.generator.encoder_weights: {err}") from None
        return
    encoder = unwrap(generator).encoder
    try:
        source: Any = path
        _, flat = find_state_dict(read_checkpoint(path), "encoder")
        flat, head = drop_classifier_head(flat, encoder.state_dict())
        if head:
            log.info("model.generator.encoder_weights: the classifier head of %s (%s%s) is not part of the "
                     "encoder: left out", path.name, ", ".join(head), head_classes(head))
            source = flat
        load_weights(source, encoder, role="encoder", name=str(path))
    except UserError as err:
        raise UserError(f"model.generator.encoder_weights: {err}") from None


class WeightValuesError(UserError):
    """A weights file whose values are not weights: integers where the model has floating-point
    tensors, or NaN / infinity. Refused (exit 2), naming the first such tensor and the count."""


def has_values(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds values to look at: not a meta tensor, nor segadv-plan's stand-ins
    (fake tensors: shapes and dtypes only, which its checkpoint pass loads), nor any tensor while
    segadv-plan's FakeTensorMode is on: there every read of values (``numpy``, ``tolist``) goes
    through the mode, which answers with a fake copy whose bytes are no one's (torch warns of it)."""
    return not tensor.is_meta and not is_fake(tensor) and detect_fake_mode() is None


def check_weight_values(state: Mapping[str, Any], expected: Mapping[str, torch.Tensor] | None, name: str) -> None:
    """The one check of a file's values before they reach a network (every load of weights:
    checkpoints, ``init.<role>.path``, encoder weights, the references' files, a resume, eval,
    export, predict, ckpt convert). ``state``: the file's tensors by the key named in messages;
    ``expected``: the model's tensor for each key (None: every tensor of the file is a weight).

    - dtype: where the model's tensor is floating point (parameters, float buffers), the file's
      must be too (float16, bfloat16, float64 are cast as torch casts them); an integer or bool
      tensor there would be cast without a word. Integer buffers (BatchNorm's
      ``num_batches_tracked``) are compared with nothing: they stay integers.
    - finiteness: no floating-point tensor may hold a NaN or an infinity (one would score a
      network that outputs garbage, without a word). Refused, not warned: a run never saves one
      (docs/failures.md, "Divergence")."""
    wrong_type, nonfinite = [], []
    for key, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        want = None if expected is None else expected.get(key)
        floating = want.is_floating_point() if want is not None else expected is None
        if floating and not (tensor.is_floating_point() or tensor.is_complex()) and \
                not (expected is None and key.endswith("num_batches_tracked")):
            wrong_type.append(key)
        elif (tensor.is_floating_point() or tensor.is_complex()) and tensor.numel() and has_values(tensor) and \
                not bool(torch.isfinite(tensor).all()):
            nonfinite.append(key)
    if wrong_type:
        key = wrong_type[0]
        tensor = state[key]
        model = f"the model's is {expected[key].dtype}" if expected is not None else "weights are floating point"
        more = f" ({len(wrong_type)} tensors are not floating point)" if len(wrong_type) > 1 else ""
        raise WeightValuesError(
            f"{name}: tensor {key!r} holds {str(tensor.dtype).removeprefix('torch.')} values where a "
            f"floating-point weight belongs ({model}){more}: not this network's weights (saved after a cast to "
            "integers?); refused rather than cast")
    if nonfinite:
        key = nonfinite[0]
        tensor = state[key]
        nans = int(torch.isnan(tensor).sum())
        infs = int(torch.isinf(tensor).sum())
        more = f"; {len(nonfinite)} tensors hold non-finite values" if len(nonfinite) > 1 else ""
        raise WeightValuesError(
            f"{name}: tensor {key!r} holds non-finite values ({nans} NaN, {infs} infinite of "
            f"{tensor.numel()}){more}: a network with them computes garbage; refused (a diverged run's weights? "
            "take an earlier checkpoint)")


# An ImageNet classifier's head: torchvision's and timm's ResNets (fc), torchvision's MobileNets,
# EfficientNets, VGG (classifier), timm's newer models (head.fc). An encoder has none of them.
CLASSIFIER_HEADS = ("fc.", "classifier.", "head.fc.", "last_linear.")


def drop_classifier_head(flat: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
                         ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """An ImageNet classification state dict (torchvision's ``resnet18(weights=...).state_dict()``,
    timm's) for an encoder: its head's keys left out where the encoder has no such keys. Returns
    the kept tensors and the dropped ones."""
    heads = tuple(p for p in CLASSIFIER_HEADS if not any(k.startswith(p) for k in expected))
    dropped = {k: v for k, v in sorted(flat.items()) if heads and k.startswith(heads)}
    return {k: v for k, v in flat.items() if k not in dropped}, dropped


def head_classes(head: Mapping[str, torch.Tensor]) -> str:
    """``: N classes`` from a head's last 2-D weight (its output rows), or ""."""
    weights = [v for k, v in head.items() if k.endswith("weight") and v.dim() == 2]
    return f": {weights[-1].shape[0]} classes" if weights else ""


def drop_training_only_head(
    flat: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], int]:
    """A multi-level G's aux head (``aux_head.*``, segadv/models/base.py) exists only for
    training: into a model without one (evaluation, export, predict, convert) its keys are left
    out, and every other key still loads strictly. Returns the kept keys and how many were left."""
    if any(k.startswith(AUX_HEAD_PREFIX) for k in expected):
        return dict(flat), 0
    kept = {k: v for k, v in flat.items() if "." + AUX_HEAD_PREFIX not in "." + k}
    return kept, len(flat) - len(kept)


def drop_unused_stage_keys(flat: Mapping[str, torch.Tensor], target: nn.Module) -> tuple[dict[str, torch.Tensor], int]:
    """A G built with a shallow ``encoder_depth`` has its unused encoder stages replaced by
    :class:`DroppedStage` (segadv/models/base.py); a full-depth file's keys for those stages
    (a plain smp model's, a pretrained encoder's) are left out, and every other key still loads
    strictly. Returns the kept keys and how many were left."""
    dropped = [f".{name}." for name, module in target.named_modules() if isinstance(module, DroppedStage)]
    kept = {k: v for k, v in flat.items() if not any(d in "." + k for d in dropped)}
    return kept, len(flat) - len(kept)


def find_state_dict(obj: Mapping[str, Any], role: str) -> tuple[str, dict[str, torch.Tensor]]:
    """The flat ``{key: tensor}`` mapping in ``obj`` that holds ``role``'s weights."""
    if _is_state_dict(obj):
        return "top level", dict(obj)
    for key in (*ROLE_KEYS.get(role, ()), *CONTAINER_KEYS):
        value = obj.get(key)
        if isinstance(value, Mapping) and value:
            if _is_state_dict(value):
                return f"[{key!r}]", dict(value)
            try:
                inner_location, inner = find_state_dict(value, role)
            except UserError:
                continue
            return f"[{key!r}]{inner_location.replace('top level', '')}", inner
    raise CheckpointMismatchError(
        f"no {role} weights found: the file holds keys {sorted(map(str, obj))[:8]} "
        f"(looked for a state dict at the top level or under {list(ROLE_KEYS.get(role, ()) + CONTAINER_KEYS)})"
    )


def match_prefix(
    flat: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    role: str,
    known: Mapping[str, torch.Tensor] | None = None,
) -> tuple[str | None, list[str]]:
    """The key prefix that maps ``flat`` exactly onto ``expected``, and the file keys left over.

    A prefix is proven when every expected key is found under it and every file key under it is
    a model key (``known``: all of the model's keys, excluded ones included). File keys outside
    the prefix are allowed only when the prefix names a network (``generator.``): a file holding
    several networks.
    """
    known = expected if known is None else known
    anchor = next(iter(expected))
    candidates = {k[: -len(anchor)] for k in flat if k == anchor or k.endswith("." + anchor)}
    proven = []
    for prefix in sorted(candidates, key=len):
        if all(prefix + k in flat for k in expected):
            inside_unknown = [k for k in flat if k.startswith(prefix) and k[len(prefix):] not in known]
            outside = [k for k in flat if not k.startswith(prefix)]
            if not inside_unknown and (not outside or _network_segments(prefix)):
                proven.append((prefix, outside))
    if not proven:
        return None, []
    if len(proven) > 1:
        # Several copies (e.g. generator. and ema.generator.): prefer the one naming the role.
        for prefix, extra in proven:
            if set(_network_segments(prefix)) & set(ROLE_KEYS.get(role, ())):
                return prefix, extra
        log.warning("several key prefixes fit the model: %s; using %r", [p for p, _ in proven], proven[0][0])
    return proven[0]


def _network_segments(prefix: str) -> list[str]:
    return [s for s in prefix.split(".") if s and s not in WRAPPER_SEGMENTS]


def _is_state_dict(obj: Mapping[str, Any]) -> bool:
    return bool(obj) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def _log_report(report: LoadReport, role: str) -> None:
    how = f"prefix {report.prefix!r} stripped" if report.prefix else "keys used as they are"
    log.info(
        "%s: loaded %d tensors from %s %s (%s)", role, len(report.loaded), report.source, report.location, how
    )
    if report.skipped:
        log.info("%s: kept %d model tensors (excluded): %s", role, len(report.skipped), _first(report.skipped))
    if report.other_networks:
        log.info("%s: ignored %d tensors of other networks in the file: %s",
                 role, len(report.other_networks), _first(report.other_networks))


# ------------------------------------------------------------------------------ error messages


def mismatch_message(
    source: str,
    location: str,
    flat: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    role: str,
    prefix: str | None = None,
) -> str:
    """Missing, unexpected and mis-shaped keys, grouped by module, under the best-fitting prefix."""
    if prefix is None:
        prefix = _best_prefix(flat, expected)
    mapped = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
    missing = [k for k in expected if k not in mapped]
    unexpected = [k for k in mapped if k not in expected]
    shapes = [
        f"{k}: file {tuple(mapped[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected if k in mapped and tuple(mapped[k].shape) != tuple(expected[k].shape)
    ]
    lines = [f"{source} {location} does not fit the {role} (strict loading"
             + (f", key prefix {prefix!r} stripped" if prefix else "") + "):"]
    for title, keys in (("missing in file", missing), ("unexpected in file", unexpected)):
        if keys:
            lines.append(f"  {len(keys)} {title}: {_grouped(keys)}")
    if shapes:
        lines.append(f"  {len(shapes)} with a different shape: " + "; ".join(shapes[:SHOW])
                     + (f"; ... ({len(shapes) - SHOW} more)" if len(shapes) > SHOW else ""))
    lines.append(f"  the file looks like {describe_weights(mapped or flat)}")
    lines.append(f"  ({fit_hint(role)})")
    return "\n".join(lines)


def fit_hint(role: str) -> str:
    """What to do about a file that does not fit, for the key that names it."""
    if role == "encoder":
        return ("model.generator.encoder_weights takes an encoder's weights: smp's encoder state dict, or "
                "torchvision's / timm's ImageNet classifier of the same encoder, whose fc head is left out; "
                "a whole G's checkpoint goes in init.generator.path")
    return (f"to leave some of the {role}'s own keys at their initial values on purpose, list them as glob "
            f"patterns in init.{role}.exclude: those keys are not loaded, every other key still is")


def _best_prefix(flat: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    """The prefix under which most model keys are found (for a readable report)."""
    scores: Counter[str] = Counter()
    for model_key in expected:
        for k in flat:
            if k == model_key or k.endswith("." + model_key):
                scores[k[: len(k) - len(model_key)]] += 1
    return scores.most_common(1)[0][0] if scores else ""


def _grouped(keys: Sequence[str]) -> str:
    groups: dict[str, list[str]] = defaultdict(list)
    for k in keys:
        groups[".".join(k.split(".")[:2])].append(k)
    parts = [f"{g}.* ({len(ks)}: {', '.join(ks[:SHOW])}{', ...' if len(ks) > SHOW else ''})"
             for g, ks in list(groups.items())[:6]]
    more = f" and {len(groups) - 6} more groups" if len(groups) > 6 else ""
    return "; ".join(parts) + more


def _first(keys: Sequence[str]) -> str:
    return ", ".join(keys[:SHOW]) + (f", ... ({len(keys) - SHOW} more)" if len(keys) > SHOW else "")


def describe_weights(flat: Mapping[str, torch.Tensor]) -> str:
    """A guess at which network a state dict belongs to, from its key names and shapes."""
    keys = list(flat)
    bare = [_strip_wrappers(k) for k in keys]
    params = sum(int(v.numel()) for v in flat.values() if isinstance(v, torch.Tensor))
    try:
        reference = reference_format(flat)
    except UserError as err:  # the references' kind, with classifiers none of them has
        return f"a DeepLab-v2 generator in the references' layout ({params:,} parameters), but {err}"
    if reference is not None:
        classes = next((int(v.shape[0]) for k, v in flat.items()
                        if strip_wrappers(k) == f"{reference.main}.conv2d_list.0.weight"), None)
        return (f"a DeepLab-v2 generator in the layout of {reference.name} ({params:,} parameters"
                + (f", {classes} classes" if classes is not None else "")
                + "): segadv's deeplabv2 loads it (model.generator.arch: deeplabv2)")
    if any(k.startswith(("encoder.", "decoder.", "segmentation_head.")) for k in bare):
        head = next((k for k in bare if k.startswith("segmentation_head.") and k.endswith("weight")), None)
        classes = f", {flat[keys[bare.index(head)]].shape[0]} classes" if head else ""
        stem = next((k for k in bare if k.startswith("encoder.")), "")
        return f"a segmentation generator ({params:,} parameters{classes}; encoder keys like {stem!r})"
    if any(k.startswith(("features.", "classifier.")) for k in bare) and len(keys) <= 12:
        first = next((k for k in bare if k.endswith("weight")), None)
        channels = f", {flat[keys[bare.index(first)]].shape[1]} input classes" if first else ""
        return f"a discriminator ({params:,} parameters{channels})"
    return f"an unknown network ({len(keys)} tensors, {params:,} parameters, keys like {keys[:2]})"


def _strip_wrappers(key: str) -> str:
    parts = key.split(".")
    while parts and parts[0] in WRAPPER_SEGMENTS + ("generator", "G", "netG", "discriminator", "D", "netD", "model"):
        parts = parts[1:]
    return ".".join(parts)
