"""A run's data checked and listed once, then handed on: the first two stages of the data path.

The path runs once, front to back: **check** (``config_checks.check_config``, once per data
section), **catalog** (each split listed once, ``listing.py``; every stream's batch against its
listed pool), **scan** and **pools** (``bundle.py``: headers read, datasets with their
pipelines), **loaders** (``loaders.py``) and **streams** (``streams.py``). A start of
segadv-train opens the catalog in its checks (``segadv/training/preflight.py``), surveys the
labeled training masks (:meth:`Catalog.surveyed`, ``mask_survey.py``) and hands it to the data
builders, which log what the survey found; a builder given none opens its own, the same way,
without the survey.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from segadv.config.schema import DataConfig
from segadv.data.batch_checks import Pool, check_stream_pools
from segadv.data.config_checks import check_config, training_shape
from segadv.data.listing import Listed, list_source, list_target
from segadv.data.stream_spec import StreamSpec
from segadv.errors import UserError

if TYPE_CHECKING:
    from segadv.data.mask_survey import MaskSurvey

__all__ = ["Catalog", "ImageInputs", "image_inputs", "listed_pools"]


@dataclass(frozen=True)
class Catalog:
    """The training data (``data``) and domain adaptation's target (``target_data``, or None),
    each checked against itself and listed."""

    source: Listed
    target: Optional[Listed] = None
    survey: Optional["MaskSurvey"] = None  # the labeled training masks, where surveyed (:meth:`surveyed`)

    @classmethod
    def open(cls, data: DataConfig, target: Optional[DataConfig] = None) -> "Catalog":
        source = _source(data)
        return cls(source) if target is None else cls(source, _target(data, target))

    @staticmethod
    def problems(data: DataConfig, target: Optional[DataConfig] = None) -> list[tuple[str, str]]:
        """What :meth:`open` would refuse, each section checked and listed apart (a missing
        ``data.root`` and a missing ``target_data`` root both named): ``(section, message)``
        pairs, none when both list."""
        checks = [("data", lambda: _source(data))]
        if target is not None:
            checks.append(("target_data", lambda: _target(data, target)))
        found = []
        for section, check in checks:
            try:
                check()
            except UserError as err:
                found.append((section, str(err)))
        return found

    @classmethod
    def for_streams(cls, data: DataConfig, target: Optional[DataConfig], streams: Sequence[StreamSpec],
                    batch_sizes: Mapping[str, int], world_size: int) -> "Catalog":
        """The catalog opened, and each stream's batch (``batch_sizes``: by stream name) checked
        against its pool as listed, on ``world_size`` ranks."""
        catalog = cls.open(data, target)
        catalog.check_streams(streams, batch_sizes, world_size)
        return catalog

    def surveyed(self) -> "Catalog":
        """The catalog with its labeled training masks surveyed (``mask_survey.survey_masks``: a
        UserError naming them when none holds a labelled pixel)."""
        from segadv.data.mask_survey import survey_masks

        return replace(self, survey=survey_masks(self.source))

    def check_streams(self, streams: Sequence[StreamSpec], batch_sizes: Mapping[str, int], world_size: int) -> None:
        """Each stream's batch (``batch_sizes``: by stream name) against its pool as listed, on
        ``world_size`` ranks."""
        check_stream_pools(streams, listed_pools(self), batch_sizes, self.data.drop_last, world_size)

    @property
    def data(self) -> DataConfig:
        return self.source.cfg


def _source(data: DataConfig) -> Listed:
    check_config(data)
    return list_source(data)


def _target(data: DataConfig, target: DataConfig) -> Listed:
    check_config(target)
    if target.input_normalization != data.input_normalization:  # one G sees both domains
        raise UserError(f"target_data.normalization: the target's images reach G as the source's do; "
                        f"data has {data.normalization} ({data.input_normalization.formula}), target_data "
                        f"{target.normalization}")
    return list_target(target)


def listed_pools(catalog: Catalog) -> dict[str, Optional[Pool]]:
    """Each pool a stream may draw from, as listed (``check_stream_pools``' ``pools``)."""
    source = catalog.source
    cfg = source.cfg
    labeled = len(source.labeled_idx)
    whole_synthetic = cfg.kind == "synthetic" and not source.unlabeled_idx
    pools = {
        "labeled": (Pool(labeled, f"data.synthetic.train_size = {labeled}") if whole_synthetic
                    else Pool.counted("labeled", labeled)),
        "unlabeled": Pool.counted("unlabeled", len(source.unlabeled_idx)) if source.unlabeled_idx else None,
    }
    if catalog.target is not None:
        pools["target"] = Pool.counted("target", len(catalog.target.unlabeled_idx))
    return pools


@dataclass(frozen=True)
class ImageInputs:
    """The sizes one split's images reach G at through the split's pipeline, where the config
    leaves the images their own sizes (:func:`image_inputs`)."""

    key: str  # the section: data or target_data
    split: str  # train or val
    groups: list[tuple[tuple[int, int], tuple[int, int], list[str]]]  # (size G gets, the images' own, their ids)
    synthetic: bool = False  # the images are data.synthetic's (one size, generated)

    def source(self, groups: Sequence[tuple[tuple[int, int], tuple[int, int], list[str]]]) -> str:
        """Where ``groups`` (some of :attr:`groups`) come from, for a message: the split, how many
        images, the first with its size, and the pipeline where it changes the size."""
        size, own, ids = groups[0]
        through = f", {size[0]}x{size[1]} after {self.key}.{self.split}_transforms" if size != own else ""
        if self.synthetic:
            return f"the {self.split} split of {self.key} ({self.key}.synthetic.image_size={own[0]}{through})"
        count, total = sum(len(g[2]) for g in groups), sum(len(g[2]) for g in self.groups)
        return (f"the {self.split} split of {self.key} ({count} of its {total} image{'s' if total > 1 else ''}, "
                f"the first {ids[0]!r} of {own[0]}x{own[1]} px{through})")


def image_inputs(listed: Listed, key: str, split: str) -> Optional[ImageInputs]:
    """The sizes the images of ``listed``'s ``split`` (train or val; ``key``: the section's config
    key) reach G at through the split's pipeline, where the config leaves the images their own sizes:
    None where it fixes the size G gets (``data.val_input_size``; a training pipeline's fixed-size
    step or the synthetic image size, ``config_checks.training_shape``), where evaluation resizes
    each val image to a size G takes (``data.val_resize_to_multiple``) or a step's output depends
    on more than its settings (``augment.pipeline_size``). Reads the split's image headers, once
    (``Listing.image_sizes``)."""
    from segadv.data.augment import pipeline_size

    cfg = listed.cfg
    if split == "val" and (cfg.val_input_size is not None or cfg.val_resize_to_multiple):
        return None
    if split == "train" and training_shape(cfg, key) is not None:
        return None
    steps = cfg.train_transforms if split == "train" else cfg.val_transforms
    listing = listed.train if split == "train" else listed.val
    if listing is None:  # synthetic: generated at one size
        side = cfg.synthetic.image_size
        sizes = {(side, side): [str(i) for i in range(cfg.synthetic.val_size)]}
    else:
        sizes = listing.image_sizes
    groups = []
    for own, ids in sizes.items():
        size = pipeline_size(steps, own)
        if size is None or (listing is None and size == training_shape(cfg, key)[:2]):  # checked as the training size
            return None
        groups.append((size, own, ids))
    return ImageInputs(key, split, groups, synthetic=listing is None)
