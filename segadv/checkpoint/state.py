"""What a segadv checkpoint holds, the periodic saving policy of a run, and finding one to resume."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from torch import nn

from segadv import __version__
from segadv.checkpoint.io import read_checkpoint, save_checkpoint
from segadv.engine.amp_optimizer import AmpOptimizer
from segadv.errors import UserError
from segadv.fsutil import atomic_write_text
from segadv.parallel.placement import unwrap

log = logging.getLogger(__name__)

FORMAT = "segadv"
FORMAT_VERSION = 1
ABANDONED_DIR = "abandoned"
STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
BEST_RECORD = "best.json"


def training_state(
    step: int,
    generator: nn.Module,
    discriminator: nn.Module,
    opt_g: AmpOptimizer,
    opt_d: AmpOptimizer,
    config: dict[str, Any],
    rng: dict[str, Any] | None = None,
    data_streams: dict[str, Any] | None = None,
    aux_discriminator: nn.Module | None = None,
    opt_d_aux: AmpOptimizer | None = None,
    best: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything needed to resume; network weights are unwrapped (never a ``module.`` prefix).
    ``data_streams``: each data stream's position (``Streams.state_dict()``). ``aux_discriminator``:
    the aux output's D, where the run has one. ``best``: the best evaluation so far
    (``{"mIoU", "step"}``), so a resumed run keeps ``best.pt`` honest."""
    extra: dict[str, Any] = {}
    if aux_discriminator is not None and opt_d_aux is not None:
        extra = {"discriminator_aux": unwrap(aux_discriminator).state_dict(),
                 "optim_discriminator_aux": opt_d_aux.state_dict()}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "segadv_version": __version__,
        "step": step,
        "generator": unwrap(generator).state_dict(),
        "discriminator": unwrap(discriminator).state_dict(),
        "optim_generator": opt_g.state_dict(),
        "optim_discriminator": opt_d.state_dict(),
        "rng": rng or {},
        "data_streams": data_streams,  # None: positions unknown, resume assumes one batch a step
        "best": best,
        "config": config,
        **extra,
    }


def is_segadv_checkpoint(obj: dict[str, Any]) -> bool:
    return obj.get("format") == FORMAT


def restore_training_state(
    ckpt: dict[str, Any],
    generator: nn.Module,
    discriminator: nn.Module,
    opt_g: AmpOptimizer,
    opt_d: AmpOptimizer,
    aux_discriminator: nn.Module | None = None,
    opt_d_aux: AmpOptimizer | None = None,
) -> int:
    """Load every piece strictly; returns the step the checkpoint was taken at."""
    from segadv.checkpoint.loader import load_weights  # the same strict loader as everywhere

    if not is_segadv_checkpoint(ckpt):
        raise UserError("not a segadv training checkpoint (no 'format': 'segadv' entry): it can "
                        "initialise weights (init.generator.path) but not resume a run")
    load_weights(ckpt, generator, role="generator", name="checkpoint")
    load_weights(ckpt, discriminator, role="discriminator", name="checkpoint")
    opt_g.load_state_dict(ckpt["optim_generator"])
    opt_d.load_state_dict(ckpt["optim_discriminator"])
    saved_aux = "discriminator_aux" in ckpt
    if (aux_discriminator is not None) != saved_aux:
        has = {True: "has an aux discriminator", False: "has none"}
        raise UserError(f"the checkpoint {has[saved_aux]} and this run {has[aux_discriminator is not None]} "
                        "(model.generator.aux_head or method.name differ from the run that saved it)")
    if aux_discriminator is not None and opt_d_aux is not None:
        load_weights(ckpt["discriminator_aux"], aux_discriminator, role="discriminator", name="checkpoint aux D")
        opt_d_aux.load_state_dict(ckpt["optim_discriminator_aux"])
    return int(ckpt["step"])


class Checkpointer:
    """Writes ``checkpoints/step_<N>.pt`` every ``every`` steps and keeps ``last.pt`` current.

    Every file is written atomically, so a crash at any moment leaves the previous complete
    checkpoint in place; retention deletes only after the new file is complete.
    """

    def __init__(self, run_dir: Path, every: int, keep_last: int | None = None) -> None:
        self.directory = run_dir / "checkpoints"
        self.every = every
        self.keep_last = keep_last

    @property
    def last_path(self) -> Path:
        return self.directory / "last.pt"

    @property
    def best_path(self) -> Path:
        """The checkpoint of the best evaluation (by val mIoU); ``best.json`` beside it says which."""
        return self.directory / "best.pt"

    def save_best(self, step: int, state: dict[str, Any], best: dict[str, Any]) -> Path:
        """``best.pt`` (a full training state), then ``best.json`` (its step and mIoU), each atomic:
        a kill between them leaves a best.json one evaluation behind best.pt, never ahead of it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        save_checkpoint(state, self.best_path)
        atomic_write_text(self.directory / BEST_RECORD, json.dumps({"step": step, **best}) + "\n")
        log.info("best val mIoU so far (%.4f at step %d): %s", best["mIoU"], step, self.best_path.name)
        return self.best_path

    def best_step(self) -> int | None:
        """The step of ``best.pt`` per ``best.json`` (None: no record)."""
        try:
            return int(json.loads((self.directory / BEST_RECORD).read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def due(self, step: int, final: bool) -> bool:
        return final or step % self.every == 0

    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        # last.pt first: a kill between the two writes then leaves last.pt the newest complete
        # checkpoint (and only the step file missing), never a step file ahead of last.pt.
        paths = [self.last_path]
        if step % self.every == 0:
            paths.append(self.directory / f"step_{step}.pt")
        save_checkpoint(state, *paths)
        log.info("checkpoint saved at step %d: %s", step, ", ".join(p.name for p in paths))
        self._apply_retention(keep=paths[-1])
        return paths[-1]

    def step_files(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every step_<N>.pt, newest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := STEP_FILE.match(p.name))]
        return sorted(found, reverse=True)

    def archive_later_checkpoints(self, start_step: int, resumed_from: Path | None) -> Path | None:
        """A run starting at ``start_step`` (0 fresh, else the step of the file it resumed from)
        abandons every checkpoint here from a later step, and ``last.pt`` unless it is the file
        resumed from. They move to ``abandoned/from_step_<N>-<time>/`` (nothing is deleted), so
        ``--resume auto`` and ``keep_last`` never pick a file of the abandoned future: after a
        rewind to step 500 of a run that once reached 1000, a preemption at 700 resumes at 700.
        Returns the archive folder, or None when nothing was moved."""
        later = [path for step, path in self.step_files() if step > start_step]
        last = self.last_path
        if last.is_file() and (resumed_from is None or resumed_from.resolve() != last.resolve()):
            later.append(last)
        best_step = self.best_step()
        if self.best_path.is_file() and (best_step is None or best_step > start_step or start_step == 0):
            later += [p for p in (self.best_path, self.directory / BEST_RECORD) if p.is_file()]
        if not later:
            return None
        base = self.directory / ABANDONED_DIR / f"from_step_{start_step}-{time.strftime('%Y%m%d-%H%M%S')}"
        archive, n = base, 1
        while archive.exists():
            archive, n = base.with_name(f"{base.name}.{n}"), n + 1
        archive.mkdir(parents=True)
        for path in later:
            os.replace(path, archive / path.name)
        log.warning("starting at step %d: moved %s (checkpoints of an abandoned later run) to %s",
                    start_step, ", ".join(p.name for p in later), archive)
        return archive

    def remove_stale_temp_files(self) -> None:
        """Temp files of a write that a crash cut short (the checkpoint they were to replace is
        intact): safe to delete when a run starts."""
        if self.directory.is_dir():
            for path in self.directory.glob(".*.tmp-*"):
                path.unlink(missing_ok=True)
                log.info("removed %s, left by an interrupted checkpoint write", path.name)

    def _apply_retention(self, keep: Path) -> None:
        if self.keep_last is None:
            return
        for _, path in self.step_files()[self.keep_last:]:
            if path != keep:
                path.unlink(missing_ok=True)
                log.info("retention (checkpoint.keep_last=%d): removed %s", self.keep_last, path.name)

    def newest_loadable(self, trusted: bool = False) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that loads: last.pt, or a newer step file (a run dir written by
        another tool or copied in), else step files from newest to oldest. A truncated or corrupt
        file is skipped with a warning. Each file is read at most once; normally only last.pt is."""
        last = self._try_read(self.last_path, trusted) if self.last_path.is_file() else None
        last_step = int(last[1].get("step", -1)) if last else -1
        for step, path in self.step_files():
            if step <= last_step:
                break  # last.pt is at least as new as every remaining step file
            found = self._try_read(path, trusted)
            if found is not None:
                return found
        return last

    @staticmethod
    def _try_read(path: Path, trusted: bool) -> tuple[Path, dict[str, Any]] | None:
        try:
            return path, read_checkpoint(path, trusted=trusted)
        except UserError as err:
            log.warning("skipping %s: %s", path, err)
            return None
