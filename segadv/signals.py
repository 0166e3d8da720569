"""Graceful stop: SIGTERM (preemption) or SIGINT (Ctrl-C) ends the run at the next step boundary."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)


class StopRequests:
    """While active, the first SIGTERM/SIGINT sets ``requested``; a second SIGINT interrupts."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():  # signal() only works there
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = name
        log.warning("%s received: stopping after the current step and saving a checkpoint", name)
