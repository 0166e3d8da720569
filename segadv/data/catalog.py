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
from segadv.data.config_checks import check_config
from segadv.data.listing import Listed, list_source, list_target
from segadv.data.stream_spec import StreamSpec
from segadv.errors import UserError

if TYPE_CHECKING:
    from segadv.data.mask_survey import MaskSurvey

__all__ = ["Catalog", "listed_pools"]


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
        check_stream_pools(streams, listed_pools(catalog), batch_sizes, data.drop_last, world_size)
        return catalog

    def surveyed(self) -> "Catalog":
        """The catalog with its labeled training masks surveyed (``mask_survey.survey_masks``: a
        UserError naming them when none holds a labelled pixel)."""
        from segadv.data.mask_survey import survey_masks

        return replace(self, survey=survey_masks(self.source))

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
