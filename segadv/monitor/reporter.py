"""Everything the training loop reports, behind one object (torchtitan's metrics processor).

The loop tells a :class:`Reporter` what happened (a step done, a log step, an evaluation, a phase
outside the step, the end); the reporter's parts decide what to read and write and when: the
metrics writer (TensorBoard, metrics.jsonl and the W&B / MLflow runs, rank 0), the console
progress, the loss averages and the step timer, the run's time profile, status.json and D's
diagnostics. Between log steps nothing is read on the host: a step's losses are summed on their
devices (meters.py).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Iterator, Mapping, Optional, Protocol, Sequence, TypeVar

import torch

from segadv.config import Config
from segadv.data.palette import palette
from segadv.monitor.diagnostics import DHealthWatch, HealthEvent, confidence_quality
from segadv.monitor.images import confidence_panel, confusion_panel, segmentation_panel, training_views_panel
from segadv.monitor.meters import LossAverager, StepTimer, console_losses
from segadv.monitor.profile import (PhaseTimer, RunClock, RunProfile, format_profile, peak_memory_gib,
                                    profile_scalars)
from segadv.monitor.progress import Progress
from segadv.monitor.status import RunRecord
from segadv.monitor.writer import open_writer
from segadv.parallel import distributed

# The run's lines keep the loop's logger name, as the progress lines do (progress.py).
log = logging.getLogger("segadv.training.loop")

T = TypeVar("T")

class Parts(Protocol):
    """What the reporter reads of a run's parts (segadv/training/build.py's ``Training``)."""

    method: Any  # its ``panel(images)``, ``panel_stream``, ``training_views()`` and its class's ``d_losses``
    phases: PhaseTimer
    device_map: Any  # ``generator`` (where the ranks' losses are averaged) and ``devices``

    def networks(self) -> Sequence[Any]: ...  # each with ``short`` and ``opt`` (``lr``, ``loss_scale()``)


class LossGuard(Protocol):
    """segadv/engine/nonfinite.py's ``NonFiniteGuard``: fed the losses wherever they are read."""

    def check(self, step: int, losses: dict[str, float]) -> None: ...

    def check_unlogged(self, step: int, losses: LossAverager) -> None: ...

    def skipped(self) -> dict[str, float]: ...


class Evaluation(Protocol):
    """segadv/engine/evaluate.py's ``EvalResult``."""

    metrics: dict[str, object]
    samples: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    absent_classes: list[int]
    matrix: Optional[torch.Tensor]  # the confusion matrix on the host (rows: truth, columns: prediction)
    proxies: dict[str, float]  # the label-free scores by proxy/<name> ({}: none asked for)


class Reporter:
    """What one run reports; ``with Reporter(...) as reporter:`` closes it however the run ends.

    ``record``: the attempt's status.json (``train`` holds it around the run); ``guard``: where the
    losses are checked for non-finite values whenever they are read (None: not checked);
    ``is_main``: rank 0, the one that writes and warns; ``resume_step``: a resumed run's step, from
    which the metric files continue; ``clock``: the run's time as its checkpoint holds it (the
    checkpoint's ``clock`` entry, loaded before :meth:`begin`), which the profile, ``perf/train_seconds``
    and status.json's ``total_wall_s`` continue from. The writer opens here (a metrics.jsonl that cannot be read is
    a failed start); the progress, the timers and ``running`` start with :meth:`begin`."""

    def __init__(self, cfg: Config, parts: Parts, run_dir: Path, record: RunRecord, guard: LossGuard | None = None,
                 *, is_main: bool = True, resume_step: int | None = None, clock: RunClock | None = None) -> None:
        self.cfg, self.parts, self.record, self.guard, self.is_main = cfg, parts, record, guard, is_main
        self.clock = clock if clock is not None else RunClock()
        self.writer = open_writer(run_dir, cfg.log.tensorboard, is_main, resume_step, cfg)
        self.losses, self.timer = LossAverager(), StepTimer()
        # D's health on every rank (the losses it reads are averaged over the ranks: each decides
        # alike whether to stop), logged by rank 0 only.
        self.d_health = DHealthWatch.for_run(cfg, type(parts.method), announce=is_main)
        self.progress: Progress | None = None
        self.profile = RunProfile(parts.phases)
        self.start_step = self.step = 0
        self.closed = False

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close("finished" if kind is None else "killed" if issubclass(kind, KeyboardInterrupt) else "failed")

    def begin(self, step: int, best: Mapping[str, Any] | None) -> None:
        """The loop starts at ``step`` (0, or the step resumed from) with the checkpoint's best
        evaluation: the progress and the timers start (from the checkpoint's clock on a resume),
        status.json says ``running``, and the resolved config goes to TensorBoard as text."""
        self.start_step = self.step = step
        self.progress = Progress(self.cfg.train.max_steps, start=step,
                                 bar=self.cfg.log.progress_bar if self.is_main else False)
        self.timer.reset()  # the start-up is neither step time nor part of the loop's profile
        earlier = self.clock.earlier if step > 0 else None
        self.profile = RunProfile(self.parts.phases, earlier)
        self.clock.attach(self.profile, self.record.wall)
        self.record.begin(step, best, wall_before=earlier["wall_s"] if earlier else None)
        self.writer.text(step, "config", config_text(self.cfg))

    def step_done(self, step: int, losses: Mapping[str, torch.Tensor], data_waits: dict[str, float]) -> None:
        """Step ``step`` (counted from 1) returned ``losses`` (summed on their devices, not read)
        after waiting ``data_waits`` seconds per stream."""
        self.step = step
        self.losses.update(losses)
        if self.progress is not None:
            self.progress.advance(step)  # a counter on the host: the losses stay where they are
        self.timer.add_data_wait(data_waits)
        for name, seconds in data_waits.items():
            self.profile.phases.add(f"data/{name}", seconds)

    def should_log(self, step: int) -> bool:
        """Every ``train.log_every`` steps and at the last one."""
        return step % self.cfg.train.log_every == 0 or step == self.cfg.train.max_steps

    def log(self, step: int) -> dict[str, float]:
        """A log step: the losses' means since the last one, read on the host (the loop's sync)
        and averaged over the ranks, written with the learning rates, loss scales, timings and
        skipped updates and shown in the progress; then checked by the guard; D's health
        (``health/d_state``) is read from them too. Returns the means."""
        with self.profile.host_phase("logging"):
            means = self.losses.pop_means()
            perf = {**self.timer.pop(), **(self.guard.skipped() if self.guard is not None else {})}
            means = distributed.mean_over_ranks(means, self.parts.device_map.generator)
            health = self.d_health.update(step, means)
            self.writer.scalars(step, {**training_scalars(means, self.parts.networks()), **perf,
                                       **self.d_health.scalars(means)})
            self.progress.update(step, console_losses(means))
            self.parts.phases.resolve()  # the losses' read synced the devices
        if self.guard is not None:
            self.guard.check(step, means)
        for event in health:
            self.discriminator_health(step, event)
        return means

    def discriminator_health(self, step: int, event: HealthEvent) -> None:
        """D left its band (the warning, logged by the watch, also as TensorBoard text
        ``health/discriminator``) or came back into it: status.json's ``discriminator_health``."""
        if not event.back:
            self.writer.text(step, "health/discriminator", event.message)
        self.record.discriminator_health(event)

    @property
    def stop_reason(self) -> str | None:
        """Why the run stops at this log step, D having left its band under
        ``train.on_discriminator_collapse: stop`` (the same on every rank); None: it goes on."""
        return self.d_health.stop_reason

    def check_finite(self, step: int) -> None:
        """Before an evaluation or a save: the losses not logged yet go to the guard (a sync, at
        those steps only), so nothing non-finite is evaluated or saved."""
        if self.guard is not None:
            self.guard.check_unlogged(step, self.losses)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A phase of the loop outside the step (``evaluation``, ``checkpoint``): timed on the host
        into the run profile, and kept out of the step time."""
        with self.profile.host_phase(name):
            yield
        self.timer.reset()

    def elapsed(self) -> float:
        """Seconds since the loop began."""
        return self.profile.elapsed()

    def track(self, loader: Iterable[T]) -> Iterable[T]:
        """``loader`` with an evaluation bar where the run shows one and the val set is long."""
        return self.progress.evaluation(loader) if self.progress is not None else loader

    def evaluation(self, step: int, result: Evaluation, loader: Iterable, prefix: str = "val",
                   train_seconds: float | None = None) -> dict[str, object]:
        """G's evaluation on one val split, logged as ``<prefix>/mIoU``, ``<prefix>/pixel_acc``,
        ``<prefix>/IoU/<class>``, its input/truth/prediction panel where it kept samples, its
        row-normalised confusion matrix as ``<prefix>/confusion_matrix``, its label-free scores as
        ``proxy/*`` (where it has them), and a line; ``train_seconds`` (the time before it) as
        ``perf/train_seconds``, for accuracy against time (segadv-curves). Returns its metrics, the
        label-free scores under ``proxies``."""
        cfg, metrics = self.cfg, result.metrics
        scalars = {f"{prefix}/mIoU": metrics["mIoU"], f"{prefix}/pixel_acc": metrics["pixel_acc"]}
        if train_seconds is not None:
            scalars["perf/train_seconds"] = train_seconds
        names = class_names_for(cfg)
        notes = evaluation_notes(cfg, loader, result.absent_classes, names)
        scalars.update({f"{prefix}/IoU/{name}": iou for name, iou in zip(names, metrics["iou"]) if iou == iou})
        scalars.update(result.proxies)
        self.writer.scalars(step, scalars)
        if result.samples is not None:
            panel = segmentation_panel(*result.samples, palette(cfg.data.num_classes), cfg.data.input_normalization,
                                       names)
            self.writer.image(step, f"{prefix}/input_gt_pred", panel)
        if result.matrix is not None:
            self.writer.image(step, f"{prefix}/confusion_matrix", confusion_panel(result.matrix, names))
        self.progress.write(f"step {step}: {prefix} mIoU {metrics['mIoU']:.4f}, "
                            f"pixel accuracy {metrics['pixel_acc']:.4f}{notes}")
        if result.proxies:
            self.progress.write(f"step {step}: label-free scores (no label read): " + ", ".join(
                f"{name.removeprefix('proxy/')} {value:.4f}" for name, value in result.proxies.items()))
            return {**metrics, "proxies": dict(result.proxies)}
        return metrics

    def diagnostics(self, step: int, panel_images: torch.Tensor | None,
                    diagnostic: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """At an evaluation: the method's last training batch (:meth:`training_views`), its panel of
        ``panel_images`` with D's confidence histogram, and D's confidence quality on the
        ``diagnostic`` images against their masks (either None: not logged)."""
        self.training_views(step)
        if panel_images is not None:
            self._method_panel(step, panel_images)
        if diagnostic is not None:
            self._confidence_quality(step, *diagnostic)

    def training_views(self, step: int) -> None:
        """The method's last training batch as its iteration built it (``Method.training_views``:
        a self-training method's mixed images, their labels and the loss's pixel weights), its first
        ``log.num_images`` drawn as one panel under the views' tag (``train/mixed_batch``). Rank 0
        only, with TensorBoard on: the views are copied to the host here, never in the step."""
        cfg = self.cfg
        if not (self.is_main and cfg.log.tensorboard and cfg.log.num_images):
            return
        views = self.parts.method.training_views()
        if views is None:
            return
        views = views.first(cfg.log.num_images).to_host()
        panel = training_views_panel(views, palette(cfg.data.num_classes), cfg.data.input_normalization,
                                     class_names_for(cfg))
        self.writer.image(step, views.tag, panel)

    def _method_panel(self, step: int, images: torch.Tensor) -> None:
        """The method's panel and, from the same maps, the histogram of D's confidence at every
        pixel of the panel's images (``diag/d_confidence_<panel stream>``)."""
        method, cfg = self.parts.method, self.cfg
        maps = method.panel(images)
        if maps is not None:
            panel = confidence_panel(maps, palette(cfg.data.num_classes), cfg.data.input_normalization,
                                     class_names_for(cfg))
            self.writer.image(step, maps.tag, panel)
            self.writer.histogram(step, f"diag/d_confidence_{method.panel_stream}", maps.confidence)

    def _confidence_quality(self, step: int, images: torch.Tensor, truth: torch.Tensor) -> None:
        """Does D know which pixels are right? The method's own panel maps (G's argmax, D's
        confidence, the mask) on the diagnostic images, in chunks of the panel's size, against
        their masks: ``diag/d_confidence_auroc``, ``diag/d_mask_precision``, ``diag/d_mask_pass``,
        ``diag/g_pixel_acc`` (docs/training.md)."""
        chunk = max(self.cfg.log.num_images, 1)
        maps = [self.parts.method.panel(images[i:i + chunk]) for i in range(0, len(images), chunk)]
        if any(m is None for m in maps):
            return
        ignore = self.cfg.data.ignore_index
        quality = confidence_quality(torch.cat([m.preds for m in maps]), torch.cat([m.confidence for m in maps]),
                                     torch.cat([m.pseudo_labels for m in maps]) != ignore, truth, ignore)
        self.writer.scalars(step, {f"diag/{name}": value for name, value in quality.items()})

    def evaluated(self, step: int, metrics: Mapping[str, Any], best: Mapping[str, Any]) -> None:
        """The val evaluation at ``step`` is kept, ``best`` the checkpoints' best after it:
        status.json's scores and ``val/best_mIoU`` (the val mIoU of best.pt, whichever score chose it)."""
        self.record.evaluated(step, metrics, best)
        self.writer.scalars(step, {"val/best_mIoU": best["mIoU"]})

    def finish(self, step: int) -> None:
        """The loop ended at ``step``: rank 0 logs where its time went, and the files are flushed
        (a TensorBoard write that failed in its thread is raised here)."""
        if self.is_main:
            self._time_profile(step)
        self.writer.flush()

    def _time_profile(self, step: int) -> None:
        """Where this process's wall time went (docs/performance.md "Time profile of a run"): a
        table in the log and ``perf/time/*``, ``perf/share/*``, ``perf/peak_mem_gib/*`` at the last
        step. After a resume it covers the whole run when the checkpoint resumed from kept the
        earlier attempts' time (its ``clock``), else the steps this process ran."""
        wall, seconds = self.profile.table()
        peaks = peak_memory_gib(self.parts.device_map.devices)
        start = self.start_step
        ran = f"{step - start} steps" + (f", {start + 1}-{step}" if start else "")
        if self.profile.earlier_seconds and start:
            ran = (f"the run, steps 1-{step}: this process ran {start + 1}-{step}, the checkpoint it resumed "
                   f"from held the time of 1-{start}")
        else:
            ran = f"this process, {ran}"
        log.info("time profile (%s):\n%s", ran, format_profile(wall, seconds, peaks))
        self.writer.scalars(step, profile_scalars(wall, seconds, peaks))

    @property
    def tensorboard_dir(self) -> Path:
        return self.writer.tensorboard_dir

    def close(self, outcome: str = "finished") -> None:
        """status.json's step reached, the progress and the metric files closed (the trackers'
        runs ended as ``outcome``: "finished", "failed", "killed"); once."""
        if self.closed:
            return
        self.closed = True
        if self.progress is not None:
            self.record.reached(self.step)
            self.progress.close()
        self.writer.close(outcome)


def config_text(cfg: Config) -> str:
    """The resolved config as TensorBoard's text plugin shows it: Markdown, so the YAML goes in
    as an indented code block (its line breaks and indentation kept)."""
    from segadv.config.loading import config_yaml

    return "\n".join("    " + line for line in config_yaml(cfg).splitlines())


def training_scalars(losses: Mapping[str, float], networks: Sequence[Any]) -> dict[str, float]:
    """``train/<loss>``, and each network's ``train/lr_<short>`` and ``amp/scale_<short>``."""
    scalars = {f"train/{name}": value for name, value in losses.items()}
    for net in networks:
        scalars.update({f"train/lr_{net.short}": net.opt.last_step_lr, f"amp/scale_{net.short}": net.opt.loss_scale()})
    return scalars


def evaluation_notes(cfg: Config, loader: Iterable, absent: list[int], names: list[str]) -> str:
    """What an evaluation's numbers leave out: val samples dropped under data.on_error=skip, and
    classes with no ground-truth pixel (``; ...`` each, or "")."""
    from segadv.data.files import absent_classes_note
    from segadv.data.loaders import left_out

    skipped = len(left_out(loader))
    notes = [f"{skipped} val sample{'' if skipped == 1 else 's'} skipped (data.on_error=skip)"] if skipped else []
    absent_note = absent_classes_note(names, absent, cfg.data.ignore_index, "val")
    return "".join(f"; {note}" for note in [*notes, *([absent_note] if absent_note else [])])


def class_names_for(cfg: Config) -> list[str]:
    from segadv.data import class_names

    return list(class_names(cfg.data))
