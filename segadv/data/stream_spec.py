"""What a data stream is, as a method declares it: torch-free, so that a method's declaration (and
the config, which validates each method's settings) loads without torch (segadv/data/streams.py
builds the streams themselves)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

# What a stream draws: the labeled split (images and masks), the unlabeled pool (images only;
# their masks are never read) or the domain adaptation target's train split (images only).
Pool = Literal["labeled", "unlabeled", "target"]


@dataclass(frozen=True)
class StreamSpec:
    """A stream as a method declares it.

    ``seed_word``: the stream's shuffle and augmentation seed is the training seed itself (None)
    or derived from it and this word; streams drawing the same pool need different words to be
    independent. ``batch_size_key``: the config key that sets the stream's batch size, named when
    it does not fit the pool.
    """

    name: str
    pool: Pool
    seed_word: Optional[int] = None
    batch_size_key: str = "data.batch_size"

    def __post_init__(self) -> None:
        if self.pool not in get_args(Pool):
            raise ValueError(f"stream {self.name!r}: unknown pool {self.pool!r}; pools: {', '.join(get_args(Pool))}")
