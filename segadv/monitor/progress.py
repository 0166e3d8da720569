"""Console progress: a tqdm bar on a terminal, periodic log lines elsewhere (CI, files)."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger("segadv.train")


class Progress:
    def __init__(self, total: int, start: int, bar: bool | None = None) -> None:
        self.total = total
        self.start = start
        self._t0 = time.perf_counter()
        use_bar = sys.stderr.isatty() if bar is None else bar
        self._bar = tqdm(total=total, initial=start, dynamic_ncols=True, unit="step") if use_bar else None

    def update(self, step: int, losses: dict[str, float]) -> None:
        """Called at log time only, with values already read from the device."""
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix({k: f"{v:.4f}" for k, v in losses.items()}, refresh=True)
            return
        done = step - self.start
        elapsed = time.perf_counter() - self._t0
        eta = elapsed / done * (self.total - step) if done else float("nan")
        text = " ".join(f"{k}={v:.4f}" for k, v in losses.items())
        log.info("step %d/%d %s eta %s", step, self.total, text, _format_seconds(eta))

    def write(self, message: str) -> None:
        """Log a message without breaking the bar."""
        if self._bar is not None:
            self._bar.clear()
        log.info(message)
        if self._bar is not None:
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _format_seconds(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"
