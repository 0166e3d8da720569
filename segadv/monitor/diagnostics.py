"""What D's side of the game looks like: D's accuracy on real and fake maps, its confidence on
unlabeled pixels (for a histogram), and D's health: a band for D's loss and accuracies, with a
warning when D leaves it, winning outright (the failure users of AdvSemiSeg's reference report:
D's loss near zero, G's adversarial terms then teach little and self-training's confidence mask
empties), collapsed (D no longer tells real from fake: its loss at chance) or unstable (D's loss
jumps far above chance while it still mostly tells the two apart: confidently wrong, its steps
overshoot)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional

import torch

from segadv.config.schema import LogConfig

if TYPE_CHECKING:
    from segadv.config import Config

log = logging.getLogger(__name__)


def d_accuracy(logits: torch.Tensor, target: float, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Fraction of D's (N,1,H,W) logits on ``target``'s side of 0 (target 1: > 0, target 0: < 0)
    over the (N,H,W) ``valid`` pixels (None: all). A 0-dim float32 tensor on the logits' device,
    no host sync; 0 when no pixel is valid (like the masked losses, the count is clamped to 1)."""
    logits = logits.squeeze(1).detach()
    correct = logits > 0 if target > 0.5 else logits < 0
    if valid is None:
        return correct.float().mean()
    weights = valid.float()
    return (correct.float() * weights).sum() / weights.sum().clamp_min(1.0)


def d_confidence(logits: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """D's confidence sigmoid(logits) at the (N,H,W) ``valid`` pixels of (N,1,H,W) logits (None:
    every pixel), flat float32, for ``MetricWriter.histogram``. Selecting by a mask syncs with
    the device: call it at log time, not every step."""
    confidence = torch.sigmoid(logits.squeeze(1).detach().float())
    return confidence.flatten() if valid is None else confidence[valid]


def auroc(scores: torch.Tensor, positives: torch.Tensor) -> float:
    """The area under the ROC curve of ``scores`` for the boolean ``positives``: the probability
    that a random positive scores above a random negative, ties counting half (the Mann-Whitney U
    over n_pos * n_neg). NaN when either class is empty."""
    scores, positives = scores.flatten().double(), positives.flatten().bool()
    n_pos = int(positives.sum())
    n_neg = positives.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = scores.argsort()
    _, inverse, counts = torch.unique_consecutive(scores[order], return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = ((ends - counts + 1 + ends) / 2)[inverse]  # 1-based, tied scores share their mean rank
    rank_sum = ranks[positives[order]].sum().item()
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def confidence_quality(preds: torch.Tensor, confidence: torch.Tensor, passes: torch.Tensor, truth: torch.Tensor,
                       ignore_index: int) -> dict[str, float]:
    """Does D know which pixels G got right? Over the labeled pixels of (N,H,W) maps: the AUROC of
    D's ``confidence`` for "G's argmax ``preds`` equals ``truth``", the precision of the pixels
    that ``passes`` the method's mask (the share of them G got right) and that share of pixels.
    The truth is read for this diagnostic only, never by training."""
    labeled = truth != ignore_index
    correct = (preds == truth)[labeled]
    passing = passes[labeled]
    return {
        "d_confidence_auroc": auroc(confidence[labeled], correct),
        "d_mask_precision": correct[passing].float().mean().item() if passing.any() else float("nan"),
        "d_mask_pass": passing.float().mean().item(),
        "g_pixel_acc": correct.float().mean().item(),
    }


# ---------------------------------------------------------------------------- D's health

WINS, COLLAPSED, UNSTABLE = "wins", "collapsed", "unstable"
CONDITIONS = {WINS: "D wins outright", COLLAPSED: "D collapsed", UNSTABLE: "D unstable"}
# health/d_state: in the band, out of it on either side, or jumping out of it upwards
STATE_VALUES = {None: 0.0, WINS: 1.0, COLLAPSED: -1.0, UNSTABLE: 2.0}
CHANCE = math.log(2)  # the references' loss_D (the mean of the two halves) of a D that says 0.5 everywhere
# D's accuracies beside its loss, as the methods log them: (on real, on fake) and their words.
ACCURACY_PAIRS = (("d_acc_real", "d_acc_fake", "real", "fake"), ("d_acc_source", "d_acc_target", "source", "target"))
HEALTH_KEYS = ("log.d_wins_loss, log.d_overpowers_loss, log.d_collapse_loss, log.d_collapse_accuracy, "
               "log.d_unstable_loss, log.d_wins_steps")
# "D unstable": this many log steps of the window at or above band.unstable_loss. One such log step
# may be a transient; two within the window are D's steps overshooting again and again (the demo's
# D at 100x its learning rate: 3 of the 10 log steps after its warm-up, 2.7 to 10 times chance).
UNSTABLE_STEPS = 2
G_LOSS = "loss_seg"  # G's segmentation loss, whose trend over the window says whether G still learns
G_LEARNS = 0.02  # G learns: the mean of its loss over the window's later half at least 2% below the earlier half's


@dataclass(frozen=True)
class HealthBand:
    """D's healthy band on the references' scale (AdvSemiSeg's loss_D: the mean of D's BCE on real
    and fake maps): its loss at least ``wins_loss`` (None: not checked) and, once it has been below
    ``collapse_loss``, not back at or above it while the mean of D's accuracies on real and fake is
    at most ``collapse_accuracy`` (None: not checked). ``window`` consecutive log steps out of it
    make a warning. Below ``wins_loss``, the window warns only where D overpowers G (every loss
    in it below ``overpowers_loss``) or G's segmentation loss did not fall over it: D ahead of a G
    that still learns is a lead G can close. ``start``: log steps up to this one (G's adversarial
    term off, loss.adv_warmup_steps) do not count towards "D wins outright". ``unstable_loss``
    (None: not checked): ``UNSTABLE_STEPS`` log steps of the last ``window`` with D's loss at or
    above it, once D told the two apart, while its accuracies (where logged; none: not checked) are
    above ``collapse_accuracy``, make "D unstable": a calibrated D's loss never exceeds chance, so
    one far above it with D still mostly right is confidently wrong. It counts within the warm-up
    too: that is D's step alone, whatever G does. The ``log`` section's keys (docs/training.md,
    "D's health")."""

    wins_loss: Optional[float] = 0.2
    collapse_loss: Optional[float] = 0.69
    collapse_accuracy: float = 0.55
    window: int = 10
    overpowers_loss: Optional[float] = 0.02
    start: int = 0
    unstable_loss: Optional[float] = 1.4

    @classmethod
    def from_config(cls, cfg: LogConfig, adv_warmup_steps: int = 0) -> "HealthBand":
        return cls(cfg.d_wins_loss, cfg.d_collapse_loss, cfg.d_collapse_accuracy, cfg.d_wins_steps,
                   cfg.d_overpowers_loss, adv_warmup_steps, cfg.d_unstable_loss)

    @property
    def checked(self) -> bool:
        return self.wins_loss is not None or self.collapse_loss is not None or self.unstable_loss is not None


@dataclass(frozen=True)
class HealthEvent:
    """D's loss ``loss`` left its band at log step ``step`` on the ``condition`` side, out since
    ``since`` (the warning), or (``back``) came back into it at ``step`` after an episode out
    since ``since``. ``values``: the D loss and D's accuracies logged at ``step``."""

    condition: str  # WINS, COLLAPSED or UNSTABLE
    loss: str
    step: int
    since: int
    values: dict[str, float]
    message: str
    back: bool = False

    @property
    def label(self) -> str:
        return CONDITIONS[self.condition]


class DHealthDetector:
    """The health of one D loss, ``name``, fed each log step's averaged values (the loss and, where
    the run logs them beside it, D's accuracies on real and fake). An episode starts when
    ``band.window`` consecutive log steps are out of the band on the same side, "D wins outright"
    (the loss below the band) or "D collapsed" (at or above its top, D's accuracies at chance),
    or where ``UNSTABLE_STEPS`` of the last ``band.window`` log steps jumped far above it, "D
    unstable", with one warning naming the values, the window and the likely cause; it ends, with
    an info line, at the first log step back in the band (unstable: with fewer such jumps in the
    window). ``scale``: the logged loss over the references'
    (``Method.d_loss_scale``: 2 for a sum of the two halves); the bounds are compared and named
    times it. ``announce``: log the lines (rank 0); ``stop``: the warning says the run stops. A
    non-finite value starts the count over. Its count starts over on a resumed run."""

    def __init__(self, band: HealthBand, name: str = "loss_d", scale: float = 1.0, *, announce: bool = True,
                 stop: bool = False) -> None:
        self.band, self.name, self.scale, self.announce, self.stop = band, name, scale, announce, stop
        self.suffix = name[len("loss_d"):] if name.startswith("loss_d") else None  # loss_d_aux: _aux
        self.tag = "health/d_state" + (self.suffix if self.suffix is not None else f"_{name}")
        self.told_apart = False  # the loss was below band.collapse_loss (off: chance) at a log step
        self._streak: list[tuple[int, dict[str, float]]] = []
        self._streak_condition: Optional[str] = None
        self._recent: list[tuple[int, bool, dict[str, float]]] = []  # the last window's (step, a jump, values)
        self.state: Optional[str] = None  # the episode's condition; None: in the band
        self.since: Optional[int] = None

    def accuracies(self, logged: Mapping[str, float]) -> Optional[tuple[str, str, str, str]]:
        """The names of D's accuracies beside this loss in ``logged`` and their words
        (``d_acc_real``, ``d_acc_fake``, "real", "fake"), or None where the run logs none."""
        if self.suffix is None:
            return None
        for real, fake, real_word, fake_word in ACCURACY_PAIRS:
            if real + self.suffix in logged and fake + self.suffix in logged:
                return real + self.suffix, fake + self.suffix, real_word, fake_word
        return None

    def condition(self, step: int, loss: float, accuracy: Optional[tuple[float, float]]) -> Optional[str]:
        """Which side of the band one log step's values are on (None: in it, or below it before
        ``band.start``, while G's adversarial term is off and G cannot push back)."""
        band, scale = self.band, self.scale
        if loss < (band.collapse_loss if band.collapse_loss is not None else CHANCE) * scale:
            self.told_apart = True
        if band.wins_loss is not None and loss < band.wins_loss * scale:
            return WINS if step > band.start else None
        if (band.collapse_loss is not None and self.told_apart and loss >= band.collapse_loss * scale
                and (accuracy is None or (accuracy[0] + accuracy[1]) / 2 <= band.collapse_accuracy)):
            return COLLAPSED
        return None

    def jumps(self, loss: float, accuracy: Optional[tuple[float, float]]) -> bool:
        """A log step at or above ``band.unstable_loss`` (times the scale) once D told the two
        apart, while D's accuracies, logged, are above chance (``band.collapse_accuracy``): D
        confidently wrong. The default bound, 1.4, is about twice chance, far above a collapsed D's
        loss, which stays near chance with its accuracies."""
        bound = self.band.unstable_loss
        return (bound is not None and accuracy is not None and self.told_apart and loss >= bound * self.scale
                and (accuracy[0] + accuracy[1]) / 2 > self.band.collapse_accuracy)

    def unstable_steps(self) -> list[tuple[int, dict[str, float]]]:
        """The log steps of the last window that jumped (``jumps``)."""
        return [(step, values) for step, jumped, values in self._recent if jumped]

    def update(self, step: int, logged: Mapping[str, float]) -> Optional[HealthEvent]:
        """Takes one log step's averaged values; the event it makes (a warning or a return into
        the band), if any. A loss the run did not log is skipped."""
        if self.name not in logged:
            return None
        loss = logged[self.name]
        names = self.accuracies(logged)
        values = {self.name: loss, **({names[0]: logged[names[0]], names[1]: logged[names[1]]} if names else {})}
        if not all(math.isfinite(value) for value in values.values()):  # the guard reports it
            self._streak.clear()
            self._recent.clear()
            return None
        accuracy = (values[names[0]], values[names[1]]) if names else None
        now = self.condition(step, loss, accuracy)
        self._recent = [*self._recent, (step, self.jumps(loss, accuracy), values)][-self.band.window:]
        # The window's entries also carry G's segmentation loss (its trend: cause()); events do not.
        entry = {**values, G_LOSS: logged[G_LOSS]} if G_LOSS in logged and math.isfinite(logged[G_LOSS]) else values
        unstable = len(self.unstable_steps()) >= UNSTABLE_STEPS
        if self.state == UNSTABLE and unstable:
            return None
        if self.state is None and unstable:
            self.state, self.since = UNSTABLE, self.unstable_steps()[0][0]
            event = HealthEvent(UNSTABLE, self.name, step, self.since, values, self.warning(UNSTABLE, names))
            self._streak.clear()
            if self.announce:
                log.warning("%s", event.message)
            return event
        if self.state is not None:
            if now == self.state:
                return None
            where = "D back in its band" if now is None else f"D out on the band's other side ({CONDITIONS[now]})"
            event = HealthEvent(self.state, self.name, step, self.since, values,
                                f"{where}: {self.name} {loss:.4f} at step {step} "
                                f"({CONDITIONS[self.state]} since step {self.since})", back=True)
            self.state = self.since = None
            self._start(now, step, entry)
            if self.announce:
                log.info("%s", event.message)
            return event
        if now is None:
            self._streak.clear()
            return None
        if self._streak_condition != now:
            self._streak.clear()
        self._start(now, step, entry)
        if len(self._streak) < self.band.window:
            return None
        if now == WINS and self.cause() is None:  # D ahead of a G that learns: slide the window on
            self._streak.pop(0)
            return None
        self.state, self.since = now, self._streak[0][0]
        event = HealthEvent(now, self.name, step, self.since, values, self.warning(now, names))
        self._streak.clear()
        if self.announce:
            log.warning("%s", event.message)
        return event

    def _start(self, condition: Optional[str], step: int, values: dict[str, float]) -> None:
        if condition is None:
            self._streak.clear()
        else:
            self._streak_condition = condition
            self._streak.append((step, values))

    def g_trend(self) -> Optional[tuple[float, float]]:
        """The mean of G's segmentation loss over the window's earlier and later halves, or None
        where a log step of the window lacks it."""
        losses = [values.get(G_LOSS) for _, values in self._streak]
        if len(losses) < 2 or any(loss is None for loss in losses):
            return None
        half = len(losses) // 2
        return sum(losses[:half]) / half, sum(losses[-half:]) / half

    def cause(self) -> Optional[str]:
        """Why a full window below the band is worth a warning: "overpowers" (every D loss in it
        below ``band.overpowers_loss``), "g_stalled" (G's segmentation loss did not fall by
        ``G_LEARNS`` over it), "unknown" (the run logs no such loss beside D's), or None: G still
        learns, so D's lead is one G can close."""
        bound = self.band.overpowers_loss
        if bound is not None and all(values[self.name] < bound * self.scale for _, values in self._streak):
            return "overpowers"
        trend = self.g_trend()
        if trend is None:
            return "unknown"
        return None if trend[1] <= trend[0] * (1 - G_LEARNS) else "g_stalled"

    def warning(self, condition: str, names: Optional[tuple[str, str, str, str]]) -> str:
        """The warning line: the values over the window, the bound, the likely cause and the keys."""
        band, scale, name = self.band, self.scale, self.name
        summed = f"{scale:g} x the key's: {name} sums D's two halves" if scale != 1 else ""
        if condition == UNSTABLE:
            text = self.unstable_text(names, summed)
        elif condition == WINS:
            window = self.window_text(names)
            cause, trend = self.cause(), self.g_trend()
            bound = band.overpowers_loss if cause == "overpowers" else band.wins_loss
            g = ("" if trend is None else
                 f"; G's {G_LOSS} {trend[0]:.4f} over the window's first half, {trend[1]:.4f} over its second")
            text = (f"D wins outright: {name} below {bound * scale:g}{f' ({summed})' if summed else ''} "
                    f"{window}{g}: D tells G's maps from real ones almost surely, so G's adversarial terms carry little "
                    "signal and a confidence-masked self-training loss passes few pixels. ")
            if cause == "overpowers":
                text += ("Likely cause: D overpowers G: its loss near 0 saturates its logits, D's own gradient "
                         "vanishes and G's adversarial term, driven by those logits, can swamp G's segmentation loss. "
                         "Act: lower D's learning rate (optim.discriminator.lr)")
            elif cause == "g_stalled":
                text += (f"Likely cause: G does not learn ({G_LOSS} did not fall over the window), so nothing closes "
                         "D's lead. Act: raise G's learning rate (optim.generator.lr) or its adversarial weight "
                         "(loss.lambda_adv) so G pushes back")
            else:
                text += (f"Likely cause: D learns much faster than G (without G's {G_LOSS} over the window "
                         "the watch cannot tell which side to slow): "
                         "lower D's learning rate (optim.discriminator.lr), or raise G's (optim.generator.lr) or its "
                         "adversarial weight (loss.lambda_adv)")
        else:
            window = self.window_text(names)
            accuracies = ("" if names is None else
                          f", D's accuracies at chance (their mean at most {band.collapse_accuracy:g}),")
            text = (f"D collapsed: {name} at or above {band.collapse_loss * scale:g} (chance {CHANCE * scale:.3f}"
                    f"{f'; {summed}' if summed else ''}){accuracies} {window}: D no longer tells G's maps from real "
                    "ones, so G's adversarial terms carry no signal. Likely cause: D stuck at a constant output after "
                    "too large a step (D's learning rate, an fp16 overflow) or G's maps pushed where D cannot follow. "
                    "Act: lower D's learning rate (optim.discriminator.lr)")
        stop = "; stopping the run (train.on_discriminator_collapse: stop)" if self.stop else ""
        return f"{text}. The band: {HEALTH_KEYS} (docs/training.md, \"D's health\"){stop}."

    def window_text(self, names: Optional[tuple[str, str, str, str]]) -> str:
        """The window of consecutive log steps out of the band: its steps, the loss's range and D's
        accuracies now."""
        losses = [values[self.name] for _, values in self._streak]
        first, last = self._streak[0][0], self._streak[-1][0]
        now = self._streak[-1][1]
        accuracy = ""
        if names is not None:
            real, fake = now[names[0]], now[names[1]]
            accuracy = f"; D's accuracy on {names[2]} {real:.3f}, on {names[3]} {fake:.3f}"
        return (f"at {len(losses)} consecutive log steps (steps {first}-{last}; min {min(losses):.4f}, "
                f"max {max(losses):.4f}, now {losses[-1]:.4f}{accuracy})")

    def unstable_text(self, names: Optional[tuple[str, str, str, str]], summed: str) -> str:
        """"D unstable"'s text: the log steps of the window that jumped, with D's accuracies there."""
        band, scale, name = self.band, self.scale, self.name
        assert names is not None and band.unstable_loss is not None  # jumps() needs both
        jumps = self.unstable_steps()
        at = ", ".join(f"step {step} {values[name]:.4f} (D's accuracy on {names[2]} {values[names[0]]:.3f}, "
                       f"on {names[3]} {values[names[1]]:.3f})" for step, values in jumps)
        return (f"D unstable: {name} at or above {band.unstable_loss * scale:g} (chance {CHANCE * scale:.3f}"
                f"{f'; {summed}' if summed else ''}) at {len(jumps)} of the last {len(self._recent)} log steps "
                f"(steps {self._recent[0][0]}-{self._recent[-1][0]}; {at}), D's accuracies above chance (their mean "
                f"above {band.collapse_accuracy:g}): D is confidently wrong where it errs, a loss no calibrated D "
                "reaches, so its updates overshoot and G's adversarial terms follow a D that swings from step to "
                "step. Likely cause: D's learning rate too large (or an fp16 overflow). "
                "Act: lower D's learning rate (optim.discriminator.lr)")


def d_loss_scale(cfg: "Config", method: type) -> Optional[float]:
    """The method's D losses over the references' scale (``Method.d_loss_scale``), or None where
    they are not BCE (a domain adaptation method's ``gan: ls``: squared errors), which the band
    does not read."""
    section = getattr(cfg.method, getattr(method, "name", ""), None)
    if getattr(section, "gan", "bce") != "bce":
        return None
    return float(getattr(method, "d_loss_scale", 1.0))


class DHealthWatch:
    """D's health for each D loss ``names`` of the run (``Method.d_losses``; a loss the run does
    not log, ``loss_d_aux`` with one D, is skipped), fed the averaged losses of each log step.
    Those are averaged over the ranks before they come here, so every rank's watch takes the same
    decisions at the same steps (``stop_reason``) with no collective of its own; rank 0 alone
    ``announce``s. ``stop``: the first warning sets ``stop_reason`` (train.on_discriminator_collapse)."""

    def __init__(self, band: HealthBand, names: tuple[str, ...], scale: Optional[float] = 1.0, *,
                 stop: bool = False, announce: bool = True) -> None:
        self.stop = stop
        self.stop_reason: Optional[str] = None
        checked = band.checked and scale is not None
        self.detectors = [DHealthDetector(band, name, scale, announce=announce, stop=stop)
                          for name in names] if checked else []
        if names and band.checked and scale is None and announce:
            log.info("D's health is not checked: an ls GAN's D losses are squared errors, not BCE's scale "
                     "(docs/training.md, \"D's health\")")

    @classmethod
    def for_run(cls, cfg: "Config", method: type, announce: bool = True) -> "DHealthWatch":
        """The watch of a run of ``cfg`` with the method class ``method`` (its ``d_losses`` and
        ``d_loss_scale``)."""
        band = HealthBand.from_config(cfg.log, cfg.loss.adv_warmup_steps)
        return cls(band, tuple(getattr(method, "d_losses", ())), d_loss_scale(cfg, method),
                   stop=cfg.train.on_discriminator_collapse == "stop", announce=announce)

    def update(self, step: int, logged: Mapping[str, float]) -> list[HealthEvent]:
        """One log step's averaged values; the events it made (warnings, returns into the band)."""
        events = [event for event in (detector.update(step, logged) for detector in self.detectors) if event]
        warnings = [event for event in events if not event.back]
        if self.stop and self.stop_reason is None and warnings:
            self.stop_reason = f"{warnings[0].label} on {warnings[0].loss}, train.on_discriminator_collapse: stop"
        return events

    def scalars(self, logged: Mapping[str, float]) -> dict[str, float]:
        """``health/d_state`` (``_aux``...) of each D loss in ``logged``: 0 in the band, 1 while D
        wins outright, -1 while it has collapsed."""
        return {d.tag: STATE_VALUES[d.state] for d in self.detectors if d.name in logged}
