"""The console: log lines go through tqdm while a bar is shown, and a long evaluation gets a bar."""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm
from tqdm.contrib.logging import _TqdmLoggingHandler

from segadv.monitor.progress import LONG_EVALUATION, Progress, evaluation_progress


def test_log_lines_go_through_tqdm_while_the_bar_is_shown_and_the_handlers_come_back(capsys):
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    root.addHandler(handler)
    try:
        progress = Progress(10, start=0, bar=True)
        assert any(isinstance(h, _TqdmLoggingHandler) for h in root.handlers) and handler not in root.handlers
        logging.getLogger("segadv.checkpoint").warning("a checkpoint line")
        progress.update(5, {"loss": 0.5})
        progress.close()
        assert handler in root.handlers and not any(isinstance(h, _TqdmLoggingHandler) for h in root.handlers)
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    # the line stands alone: the bar is cleared (\r, blanks, \r) before it and redrawn after it
    assert "\ra checkpoint line\n\r" in err


def test_without_a_bar_nothing_is_redirected():
    root = logging.getLogger()
    before = list(root.handlers)
    progress = Progress(10, start=0, bar=False)
    assert root.handlers == before
    progress.close()


def test_a_long_evaluation_gets_a_bar_and_a_short_one_or_no_bar_does_not():
    short, long = list(range(LONG_EVALUATION - 1)), list(range(LONG_EVALUATION))
    assert evaluation_progress(short, bar=True) is short
    assert evaluation_progress(long, bar=False) is long
    wrapped = evaluation_progress(long, bar=True)
    assert isinstance(wrapped, tqdm) and list(wrapped) == long
