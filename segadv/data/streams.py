"""Data streams: endless, resumable sequences of batches, one per role a method draws from.

A method declares the streams it draws from as ``StreamSpec``s (supervised: ``labeled``;
AdvSemiSeg: ``labeled``, ``unlabeled`` and ``gt``, the labeled batch D sees as real); the data
package builds a loader per declaration and knows no stream by name. Each stream has its own
seeded order and augmentation (``ResumableSampler``), cycles on its own epoch and counts the
batches drawn from it; that count is its checkpoint state, so a resumed run continues every
stream at its own position, even one drawn from only on some iterations.
"""

from __future__ import annotations

import logging
import time
from itertools import count
from typing import Any, Iterable, Iterator, Mapping

from torch.utils.data import DataLoader

from segadv.errors import UserError
from segadv.data.stream_spec import StreamSpec  # noqa: F401  (declared by the methods, built here)

log = logging.getLogger(__name__)


def iterate_epochs(loader: Iterable, start_step: int = 0) -> Iterator:
    """Batches forever, epoch after epoch, starting ``start_step`` batches in (resume).

    The sampler is told the epoch, and on resume how many of its samples to skip, so the
    resumed run sees exactly the batches the uninterrupted run would have seen.
    """
    sampler = getattr(loader, "sampler", None)
    per_epoch = len(loader)
    first_epoch, offset = divmod(start_step, per_epoch)
    for epoch in count(first_epoch):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if epoch == first_epoch and offset:
            if not hasattr(sampler, "skip_next"):
                raise RuntimeError("resuming mid-epoch needs a sampler with skip_next()")
            sampler.skip_next(offset * loader.batch_size)
        yield from loader


class Stream:
    """One loader as an endless stream that knows how many batches it has handed out."""

    def __init__(self, name: str, loader: DataLoader, batch_size_key: str = "data.batch_size") -> None:
        self.name = name
        self.loader = loader
        self.batch_size_key = batch_size_key  # the setting a changed batch size is named by
        self.drawn = 0
        self.wait_seconds = 0.0  # time spent waiting for batches, since the last pop_wait
        self._batches: Iterator | None = None

    def next(self) -> Any:
        if self._batches is None:  # started lazily: a restored position must be known first
            self._batches = iterate_epochs(self.loader, start_step=self.drawn)
        start = time.perf_counter()
        batch = next(self._batches)
        self.wait_seconds += time.perf_counter() - start
        self.drawn += 1
        return batch

    def pop_wait(self) -> float:
        seconds, self.wait_seconds = self.wait_seconds, 0.0
        return seconds

    def close(self) -> None:
        """End the loader's iteration and its workers (a restored position restarts it)."""
        if self._batches is not None:
            self._batches.close()  # frees the loader's iterator, whose workers then shut down
            self._batches = None
        close_loader(self.loader)

    @property
    def order(self) -> dict[str, int]:
        """What the position means: the batch size, the shuffle seed and the pool's size."""
        sampler = getattr(self.loader, "sampler", None)
        found = {"batch_size": getattr(self.loader, "batch_size", None), "seed": getattr(sampler, "seed", None),
                 "samples": getattr(sampler, "length", None)}
        return {key: value for key, value in found.items() if value is not None}

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.drawn, **self.order}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The position is a count of this rank's batches in an epoch order drawn from the seed:
        at another batch size or seed it would point elsewhere in the data (samples seen twice or
        skipped), so those are refused; a pool that grew or shrank is a warning (the current
        epoch's order changes with it)."""
        now = self.order
        for key, setting in (("batch_size", self.batch_size_key), ("seed", "train.seed")):
            if key in state and key in now and state[key] != now[key]:
                same = (f"{setting}={state[key]}" if key == "batch_size" else
                        f"the {setting} the run started with (segadv-ckpt inspect shows the checkpoint's config)")
                raise UserError(
                    f"{setting} differs from the checkpoint's ({state[key]} then, {now[key]} now): the {self.name} "
                    f"stream's position ({state['batches']} batches) holds only at the saved value; resume with "
                    f"{same}, or start a new run from its weights (init.generator.path, init.discriminator.path)")
        if "samples" in state and "samples" in now and state["samples"] != now["samples"]:
            log.warning("the %s stream has %d samples now and had %d when the checkpoint was saved: its epoch order "
                        "changes, so within this epoch some samples may be seen twice and others skipped",
                        self.name, now["samples"], state["samples"])
        self.drawn = int(state["batches"])
        if self._batches is not None:  # restored mid-run (a checkpoint read back): the old iteration ends
            self._batches.close()
        self._batches = None


class Streams(dict[str, Stream]):
    """A method's streams by name, checkpointed together."""

    def state_dict(self) -> dict[str, dict[str, int]]:
        return {name: stream.state_dict() for name, stream in self.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A stream the checkpoint does not know (the method changed at resume) starts at its
        beginning."""
        for name, stream in self.items():
            stream.load_state_dict(state.get(name, {"batches": 0}))

    def pop_wait(self) -> dict[str, float]:
        return {name: stream.pop_wait() for name, stream in self.items()}

    def close(self) -> None:
        for stream in self.values():
            stream.close()


def close_loader(loader: Iterable) -> None:
    """Shut a loader's workers down now, if it has a ``close()`` (segadv's loaders do)."""
    close = getattr(loader, "close", None)
    if close is not None:
        close()
