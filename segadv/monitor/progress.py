"""Console progress: a tqdm bar on a terminal, periodic log lines elsewhere (CI, files)."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Iterable, Sized, TypeVar

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

log = logging.getLogger("segadv.training.loop")

T = TypeVar("T")

# An evaluation of at least this many batches gets a bar of its own (below the training bar);
# a shorter one is over before a bar would say anything.
LONG_EVALUATION = 50


def evaluation_progress(loader: Iterable[T], bar: bool | None = None) -> Iterable[T]:
    """``loader`` with a transient tqdm bar ("evaluating") when it is long and bars are on
    (``bar``; None: on a terminal), else ``loader`` itself."""
    use_bar = sys.stderr.isatty() if bar is None else bar
    total = len(loader) if isinstance(loader, Sized) else 0
    if not use_bar or total < LONG_EVALUATION:
        return loader
    return tqdm(loader, total=total, desc="evaluating", unit="batch", leave=False, dynamic_ncols=True)


class Progress:
    """The training loop's progress. With a bar, every log line of the run goes through tqdm
    (``logging_redirect_tqdm``) so lines and bar never break each other."""

    def __init__(self, total: int, start: int, bar: bool | None = None) -> None:
        self.total = total
        self.start = start
        self._t0 = time.perf_counter()
        self.use_bar = sys.stderr.isatty() if bar is None else bar
        self._redirect = contextlib.ExitStack()
        self._bar = None
        if self.use_bar:
            self._redirect.enter_context(logging_redirect_tqdm())
            self._bar = tqdm(total=total, initial=start, dynamic_ncols=True, unit="step")

    def evaluation(self, loader: Iterable[T]) -> Iterable[T]:
        """``loader`` with a bar of its own when the run shows one and the val set is long."""
        return evaluation_progress(loader, self.use_bar)

    def advance(self, step: int) -> None:
        """Every step: the bar's counter moves to ``step`` (a host counter; tqdm redraws at most
        every ``mininterval``), the losses it shows stay those of the last log step."""
        if self._bar is not None and step > self._bar.n:
            self._bar.update(step - self._bar.n)

    def update(self, step: int, losses: dict[str, float]) -> None:
        """Called at log time only, with values already read from the device."""
        if self._bar is not None:
            self.advance(step)
            self._bar.set_postfix({k: f"{v:.4f}" for k, v in losses.items()}, refresh=True)
            return
        done = step - self.start
        elapsed = time.perf_counter() - self._t0
        eta = elapsed / done * (self.total - step) if done else float("nan")
        text = " ".join(f"{k}={v:.4f}" for k, v in losses.items())
        log.info("step %d/%d %s eta %s", step, self.total, text, _format_seconds(eta))

    def write(self, message: str) -> None:
        """Log a message (above the bar, when there is one)."""
        log.info(message)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._redirect.close()


def _format_seconds(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"
