"""Process-wide set-up: logging, seeding, and the RNGs as a checkpointable state."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch

from segadv import fsutil
from segadv.parallel import distributed
from segadv.parallel.distributed import DistEnv
from segadv.parallel.placement import device_module, is_accelerator

log = logging.getLogger(__name__)

LOG_FILE = "train.log"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: int = logging.INFO, env: DistEnv | None = None) -> None:
    """Only the main process (rank 0) tells the story; other ranks log warnings and errors. Under
    a multi-process launch (torchrun or SLURM) every line carries ``[rank N]``."""
    prefix = f"[rank {env.rank}] " if env is not None and env.distributed else ""
    main_process = env is None or env.is_main
    logging.basicConfig(
        level=level if main_process else max(level, logging.WARNING),
        format=f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


@contextmanager
def run_log(run_dir: Path, enabled: bool = True, level: int = logging.INFO) -> Iterator[Path | None]:
    """``RUN/train.log``: every log line of the run (what the console shows, progress lines and
    warnings included) appended to a file in the run dir while it runs, as mmsegmentation keeps
    ``work_dir/*.log``; each attempt (a resume appends) begins with a line that says so. Rank 0 only (``enabled``).
    An error that ends the run is written there too (the console gets it from the command's
    ``error:`` line, so it goes to the file alone). The file follows the run dir's rule
    (segadv/fsutil.py :func:`~segadv.fsutil.open_append`): a link there is replaced by a regular
    file, never followed; a device, FIFO, socket or directory there is a user error naming it
    (exit 2, raised before the run writes anything else there). A write that fails (a full disk) ends
    the file, with one warning naming it: the log is a convenience, the run goes on without it."""
    if not enabled:
        yield None
        return
    path = Path(run_dir) / LOG_FILE
    try:
        handler = RunLogHandler(path)
    except OSError as err:  # the log file is a convenience: the run goes on without it
        log.warning("cannot keep the run's log in %s: %s", path, err.strerror or err)
        yield None
        return
    root = logging.getLogger()
    level_before = root.level
    from segadv import __version__

    # From the file's opening on, whatever ends the block (a signal in its first line too) takes
    # the handler off: a start's clean-up then puts back a train.log nothing writes to any more.
    try:
        handler.setLevel(level)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
        root.addHandler(handler)
        if root.getEffectiveLevel() > level:
            root.setLevel(level)  # a caller that never configured logging (tests, a library call) still gets the file
        _to_file(handler, logging.INFO, "segadv %s: an attempt starts in %s (pid %d)", __version__, run_dir,
                 os.getpid())
        yield path
    except BaseException as err:
        _to_file(handler, logging.ERROR, "the run ended with %s: %s", type(err).__name__, err)
        raise
    finally:
        root.removeHandler(handler)
        root.setLevel(level_before)
        handler.close()


class RunLogHandler(logging.Handler):
    """Log lines appended to a run dir's ``train.log`` through segadv's one writer
    (segadv/fsutil.py): opened by the run dir's rule, each line written whole. The first write that
    fails closes the file and says so once, naming it (never logging's traceback per line)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.file = fsutil.open_append(path)

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is None:
            return
        try:
            line = self.format(record) + "\n"
            fsutil.write_all(self.file, line.encode("utf-8", errors="backslashreplace"))
        except OSError as err:
            self._give_up(err)
        except Exception:  # noqa: BLE001 - a record that cannot be formatted: logging's own answer
            self.handleError(record)

    def _give_up(self, err: OSError) -> None:
        file, self.file = self.file, None
        with contextlib.suppress(OSError):
            file.close()
        code = errno.errorcode.get(err.errno or 0, "")
        log.warning("cannot write the run's log %s: %s%s; the run goes on without it", self.path,
                    err.strerror or err, f" ({code})" if code else "")

    def close(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None
        super().close()


def _to_file(handler: logging.Handler, level: int, message: str, *args: object) -> None:
    """A line for the run's log file alone (the console has it another way, or needs it not)."""
    handler.handle(logging.LogRecord("segadv.training.process", level, __file__, 0, message, args, None))


def seed_everything(seed: int, deterministic: bool = False, devices: Iterable[torch.device] = ()) -> None:
    """Seed every RNG; ``deterministic``: bitwise-repeatable kernels where they exist.

    On CPU every kernel segadv uses has a deterministic form, so the guarantee is strict. CUDA has
    none for some backward kernels DeepLab needs (bilinear upsampling's), and strict mode would stop
    at the first backward: there torch is set to warn instead, and its warning (routed to the log)
    names each such op the first time it runs.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device lazily, without creating a context
    if deterministic:
        # cuBLAS needs this for deterministic matmuls; harmless on CPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        on_cuda = any(torch.device(d).type == "cuda" for d in devices)
        torch.use_deterministic_algorithms(True, warn_only=on_cuda)
        torch.backends.cudnn.benchmark = False
        if on_cuda:
            logging.captureWarnings(True)
            log.warning("train.deterministic on CUDA: deterministic kernels where they exist; ops without "
                        "one (e.g. upsample_bilinear2d_backward) stay non-deterministic and are named in "
                        "the warnings below as they first run")


def capture_rng_state(devices: Iterable[torch.device] = ()) -> dict:
    """Every RNG a training step may draw from, as plain data a weights-only load accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": {},
    }
    for device in devices:  # "cuda": the accelerators' generators (on segadv-plan's stand-in, its facade's)
        if is_accelerator(device):
            state["cuda"][str(device)] = device_module(device).get_rng_state(device)
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(_as_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    for name, device_state in state.get("cuda", {}).items():
        device = torch.device(name)
        module = device_module(device)
        if module.is_available() and device.index < module.device_count():
            module.set_rng_state(device_state, device)


class RankRNGs:
    """Every rank's RNGs as one Stateful: ``state_dict()`` gathers each rank's state (a list by
    rank under DDP, so call it on every rank), ``load_state_dict()`` restores this rank's."""

    def __init__(self, devices: Iterable[torch.device], env: DistEnv) -> None:
        self.devices = list(devices)
        self.env = env

    def state_dict(self) -> dict | list[dict]:
        return distributed.gather_objects(capture_rng_state(self.devices))

    def load_state_dict(self, state: dict | list[dict]) -> None:
        if isinstance(state, list):  # one state per rank; CheckpointManager refuses another world size first
            restore_rng_state(state[self.env.rank])
        elif state:
            restore_rng_state(state)


def _as_tuples(value):
    # random.getstate() is nested tuples; a round trip through some serialisers yields lists.
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
