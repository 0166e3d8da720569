"""D's diagnostics: accuracy on real and fake maps, confidence histogram, D's health ("D wins
outright", "D collapsed", "D unstable")."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from segadv.config import load_config
from segadv.config.schema import LogConfig
from segadv.methods.registry import method_class
from segadv.monitor.diagnostics import (DHealthDetector, DHealthWatch, HealthBand, d_accuracy, d_confidence,
                                        d_loss_scale)
from segadv.monitor.writer import MetricWriter, NullWriter
from segadv.training.loop import train

from helpers import UDA_OVERRIDES

LOGITS = torch.tensor([[[[2.0, -1.0], [0.5, -3.0]]], [[[0.0, 1.0], [-2.0, 4.0]]]])  # (2,1,2,2)
VALID = torch.tensor([[[True, True], [False, True]], [[True, False], [True, True]]])


def test_accuracy_counts_the_logits_on_the_targets_side_of_zero_over_valid_pixels():
    # valid logits: 2, -1, -3 | 0, -2, 4. Real (> 0): 2, 4. Fake (< 0): -1, -3, -2. A logit of 0 is neither.
    real, fake = d_accuracy(LOGITS, 1.0, VALID), d_accuracy(LOGITS, 0.0, VALID)
    assert real.shape == () and real.dtype == torch.float32
    assert real.item() == pytest.approx(2 / 6) and fake.item() == pytest.approx(3 / 6)
    assert d_accuracy(LOGITS, 1.0).item() == pytest.approx(4 / 8) and d_accuracy(LOGITS, 0.0).item() == pytest.approx(3 / 8)
    assert d_accuracy(LOGITS, 1.0, torch.zeros_like(VALID)).item() == 0.0


def test_confidence_is_the_sigmoid_at_the_valid_pixels():
    assert torch.equal(d_confidence(LOGITS, VALID), torch.sigmoid(torch.tensor([2.0, -1.0, -3.0, 0.0, -2.0, 4.0])))
    assert torch.equal(d_confidence(LOGITS), torch.sigmoid(LOGITS.flatten()))


HEALTH_LOGGER = "segadv.monitor.diagnostics"


def feed(detector, values):
    """``(step, loss_d, d_acc_real, d_acc_fake)`` rows (accuracies None: not logged); the events."""
    events = []
    for step, loss, real, fake in values:
        logged = {"loss_d": loss, **({"d_acc_real": real, "d_acc_fake": fake} if real is not None else {})}
        events.append(detector.update(step, logged))
    return events


def test_d_wins_outright_warns_once_per_episode_after_a_window_below_the_band(caplog):
    detector = DHealthDetector(HealthBand(wins_loss=0.2, window=3))
    with caplog.at_level(logging.INFO, logger=HEALTH_LOGGER):
        events = feed(detector, [(10, 0.1, 1, 1), (20, 0.15, 1, 1), (30, 0.3, 1, 1), (40, 0.1, 1, 1),
                                 (50, math.nan, 1, 1), (60, 0.1, 1, 1), (70, 0.05, 0.99, 1), (80, 0.19, 0.98, 0.97),
                                 (90, 0.01, 1, 1), (100, 0.01, 1, 1), (110, 0.4, 0.9, 0.8), (120, 0.1, 1, 1)])
    fired = {step: event for step, event in zip(range(10, 130, 10), events) if event is not None}
    assert list(fired) == [80, 110]  # 0.3 and NaN start the count over; once per episode, not every step
    warning, back = fired[80], fired[110]
    assert (warning.condition, warning.loss, warning.step, warning.since, warning.back) == ("wins", "loss_d", 80, 60, False)
    assert warning.values == {"loss_d": 0.19, "d_acc_real": 0.98, "d_acc_fake": 0.97}
    assert (back.condition, back.step, back.since, back.back) == ("wins", 110, 60, True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0] == warning.message
    assert warning.message.startswith(
        "D wins outright: loss_d below 0.2 at 3 consecutive log steps (steps 60-80; min 0.0500, max 0.1900, "
        "now 0.1900; D's accuracy on real 0.980, on fake 0.970): D tells G's maps from real ones almost surely")
    assert "Likely cause: D learns much faster than G" in warning.message
    assert "log.d_wins_loss" in warning.message and "train.on_discriminator_collapse" not in warning.message
    assert "D back in its band: loss_d 0.4000 at step 110 (D wins outright since step 60)" in caplog.text
    assert detector.state is None


def test_d_collapsed_is_a_loss_at_chance_with_accuracies_at_chance_once_d_told_the_two_apart(caplog):
    """A D stuck at a constant output (sure everything is real: accuracy 1 on real, 0 on fake) has
    a loss at or above ln 2; one that never went below it yet has not learnt, and one whose
    accuracies still separate the two is weak, not collapsed."""
    detector = DHealthDetector(HealthBand(collapse_loss=0.69, collapse_accuracy=0.55, window=3))
    with caplog.at_level(logging.WARNING, logger=HEALTH_LOGGER):
        events = feed(detector, [(1, 0.70, 0.5, 0.5), (2, 0.70, 0.5, 0.5), (3, 0.70, 0.5, 0.5),  # not learnt yet
                                 (4, 0.45, 0.8, 0.8),  # told apart
                                 (5, 0.70, 0.9, 0.6), (6, 0.71, 0.8, 0.7), (7, 0.72, 0.9, 0.5),  # weak, not chance
                                 (8, 0.693, 1.0, 0.0), (9, 0.80, 1.0, 0.0), (10, 0.75, 1.0, 0.0), (11, 0.75, 1.0, 0.0)])
    assert [i for i, event in enumerate(events, 1) if event is not None] == [10]
    event = events[9]
    assert (event.condition, event.since, event.step, event.back) == ("collapsed", 8, 10, False)
    assert detector.state == "collapsed"
    assert event.message.startswith(
        "D collapsed: loss_d at or above 0.69 (chance 0.693), D's accuracies at chance (their mean at most 0.55), "
        "at 3 consecutive log steps (steps 8-10; min 0.6930, max 0.8000, now 0.7500; D's accuracy on real 1.000, "
        "on fake 0.000): D no longer tells G's maps from real ones")
    assert "Likely cause: D stuck at a constant output" in event.message
    assert [r.getMessage() for r in caplog.records] == [event.message]


def test_without_accuracies_collapse_is_read_from_the_loss_alone():
    detector = DHealthDetector(HealthBand(window=2))
    events = feed(detector, [(1, 0.5, None, None), (2, 0.7, None, None), (3, 0.7, None, None)])
    assert events[:2] == [None, None] and events[2].condition == "collapsed"
    assert events[2].values == {"loss_d": 0.7} and "accuracies" not in events[2].message


def test_a_summed_d_loss_is_held_to_doubled_bounds():
    """The supervised method logs the sum of D's two BCE halves: its bounds are the keys' times 2."""
    assert method_class("supervised").d_loss_scale == 2.0 and method_class("advsemiseg").d_loss_scale == 1.0
    detector = DHealthDetector(HealthBand(window=1), scale=2.0)
    assert feed(detector, [(1, 0.39, 1, 1)])[0].message.startswith(
        "D wins outright: loss_d below 0.4 (2 x the key's: loss_d sums D's two halves) at 1 consecutive")
    detector = DHealthDetector(HealthBand(window=1), scale=2.0)
    assert feed(detector, [(1, 0.41, 1, 1), (2, 1.0, 0.9, 0.9), (3, 1.37, 0.5, 0.5)]) == [None] * 3
    assert feed(detector, [(4, 1.386, 1.0, 0.0)])[0].message.startswith(
        "D collapsed: loss_d at or above 1.38 (chance 1.386; 2 x the key's: loss_d sums D's two halves)")


def test_the_band_comes_from_the_log_section_and_each_side_can_be_turned_off():
    from segadv.config.schema import LogConfig

    assert HealthBand.from_config(LogConfig()) == HealthBand(0.2, 0.69, 0.55, 10)
    only_collapse = HealthBand.from_config(LogConfig(d_wins_loss=None))
    assert feed(DHealthDetector(only_collapse), [(1, 0.0, 1, 1)] * 20) == [None] * 20
    off = HealthBand.from_config(LogConfig(d_wins_loss=None, d_collapse_loss=None, d_unstable_loss=None))
    assert not off.checked and DHealthWatch(off, ("loss_d",)).detectors == []


def test_the_watch_reads_each_d_loss_with_its_own_accuracies_and_skips_what_is_not_logged():
    """AdaptSegNet's two levels: loss_d with d_acc_source/d_acc_target, loss_d_aux with the _aux
    ones; a run without the aux D (or a method without a D: mean_teacher with lambda_adv 0) logs
    no such loss and gets no check nor state."""
    watch = DHealthWatch(HealthBand(window=2), ("loss_d", "loss_d_aux"), stop=True, announce=False)
    level = {"loss_d": 0.5, "d_acc_source": 0.8, "d_acc_target": 0.7}
    aux = {"loss_d_aux": 0.05, "d_acc_source_aux": 1.0, "d_acc_target_aux": 1.0}
    assert watch.update(1, {**level, **aux}) == [] and watch.stop_reason is None
    [event] = watch.update(2, {**level, **aux})
    assert (event.loss, event.condition) == ("loss_d_aux", "wins")
    assert event.values == {"loss_d_aux": 0.05, "d_acc_source_aux": 1.0, "d_acc_target_aux": 1.0}
    assert "D's accuracy on source 1.000, on target 1.000" in event.message
    assert event.message.endswith("stopping the run (train.on_discriminator_collapse: stop).")
    assert watch.stop_reason == "D wins outright on loss_d_aux, train.on_discriminator_collapse: stop"
    assert watch.scalars({**level, **aux}) == {"health/d_state": 0.0, "health/d_state_aux": 1.0}
    assert watch.update(3, {"loss_seg": 1.0}) == [] and watch.scalars({"loss_seg": 1.0}) == {}


def test_only_the_methods_with_a_bce_d_are_watched():
    cfg = load_config(None, [*UDA_OVERRIDES, "method.name=minent"])
    assert DHealthWatch.for_run(cfg, method_class("minent")).detectors == []  # no D
    cfg = load_config(None, UDA_OVERRIDES)
    assert [d.name for d in DHealthWatch.for_run(cfg, method_class("adaptsegnet")).detectors] == ["loss_d", "loss_d_aux"]
    cfg = load_config(None, [*UDA_OVERRIDES, "method.adaptsegnet.gan=ls"])
    assert d_loss_scale(cfg, method_class("adaptsegnet")) is None  # squared errors, not BCE's scale
    assert DHealthWatch.for_run(cfg, method_class("adaptsegnet")).detectors == []
    cfg = load_config(None, ["method.name=supervised", "train.on_discriminator_collapse=stop"])
    watch = DHealthWatch.for_run(cfg, method_class("supervised"))
    assert watch.stop and [(d.name, d.scale) for d in watch.detectors] == [("loss_d", 2.0)]


def test_histogram_goes_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = torch.tensor([0.1, 0.2, 0.2, 0.9])
    writer = MetricWriter(tmp_path)
    writer.histogram(5, "d/confidence_unlabeled", values)
    writer.close()
    events = EventAccumulator(str(writer.tensorboard_dir))
    events.Reload()
    (event,) = events.Histograms("d/confidence_unlabeled")
    assert event.step == 5
    assert (event.histogram_value.num, event.histogram_value.min, event.histogram_value.max) == pytest.approx((4, 0.1, 0.9))
    assert event.histogram_value.sum == pytest.approx(1.4)
    assert not (tmp_path / "metrics.jsonl").read_text()

    (tmp_path / "quiet").mkdir()
    quiet = MetricWriter(tmp_path / "quiet", tensorboard=False)
    quiet.histogram(5, "d/confidence_unlabeled", values)
    quiet.close()
    assert not quiet.tensorboard_dir.exists()
    NullWriter(tmp_path).histogram(5, "d/confidence_unlabeled", values)


# The demo (`make demo`: configs/default.yaml, the supervised method, loss.adv_warmup_steps 100,
# log every 25 steps) as it ran: (step, loss_seg, loss_d), loss_d the sum of D's two halves. D
# leads G from step 100 to 525 (loss_d 0.10-0.38, below the doubled 0.4) while G's loss_seg falls
# from 0.42 to 0.18 and val mIoU rises from 0.28 to 0.67; then G closes the lead.
DEMO = [
    (25, 0.7073, 1.3760), (50, 0.4901, 1.3097), (75, 0.4676, 0.8975), (100, 0.4246, 0.3185), (125, 0.3737,
    0.1517), (150, 0.3213, 0.1425), (175, 0.2874, 0.1534), (200, 0.2929, 0.1660), (225, 0.2781, 0.1041), (250,
    0.2507, 0.1873), (275, 0.2394, 0.1559), (300, 0.2326, 0.2347), (325, 0.2402, 0.1960), (350, 0.2361, 0.1434),
    (375, 0.2266, 0.2977), (400, 0.2071, 0.2527), (425, 0.2001, 0.2695), (450, 0.2007, 0.2539), (475, 0.1778,
    0.3231), (500, 0.1678, 0.3800), (525, 0.1812, 0.3364), (550, 0.1543, 0.4274), (575, 0.1587, 0.3504), (600,
    0.1543, 0.3983), (625, 0.1520, 0.3803), (650, 0.1337, 0.5019), (675, 0.1391, 0.4408), (700, 0.1336, 0.4851),
    (725, 0.1278, 0.5765), (750, 0.1284, 0.5962), (775, 0.1204, 0.6254), (800, 0.1144, 0.6268), (825, 0.1287,
    0.6103), (850, 0.1079, 0.6258), (875, 0.1083, 0.6604), (900, 0.0970, 0.6180), (925, 0.0939, 0.7139), (950,
    0.1084, 0.6312), (975, 0.1089, 0.6244), (1000, 0.1080, 0.5621), (1025, 0.0944, 0.6815), (1050, 0.0881,
    0.6452), (1075, 0.0934, 0.6454), (1100, 0.0963, 0.6213), (1125, 0.0929, 0.6929), (1150, 0.0818, 0.6924),
    (1175, 0.0834, 0.6930), (1200, 0.0845, 0.6833)]


def demo_detector(**band):
    return DHealthDetector(HealthBand(**{"start": 100, **band}), "loss_d", scale=2.0)


def feed_seg(detector, rows):
    return [event for step, seg, loss in rows if (event := detector.update(step, {"loss_seg": seg, "loss_d": loss}))]


def test_the_demo_does_not_warn_about_itself_though_d_leads_below_the_band(caplog):
    below = [step for step, _, loss in DEMO if step > 100 and loss < 0.4]
    assert below[:17] == list(range(125, 550, 25))  # 17 log steps in a row: the old rule warned at 350
    with caplog.at_level(logging.INFO, logger=HEALTH_LOGGER):
        assert feed_seg(demo_detector(), DEMO) == []
    assert caplog.records == []


def test_d_ahead_of_a_g_that_stopped_learning_warns_naming_g_lr_and_lambda_adv(caplog):
    """The demo's D losses with G's loss_seg flat at 0.3 from step 100: the first full window
    after the warm-up (steps 125-350) warns, and names G's knobs, not D's."""
    stalled = [(step, seg if step <= 100 else 0.3 + 0.01 * (step // 25 % 2), loss) for step, seg, loss in DEMO]
    with caplog.at_level(logging.WARNING, logger=HEALTH_LOGGER):
        [warning, back] = feed_seg(demo_detector(), stalled)
    assert (warning.condition, warning.since, warning.step, back.step, back.back) == ("wins", 125, 350, 550, True)
    assert warning.message.startswith("D wins outright: loss_d below 0.4 (2 x the key's: loss_d sums D's two halves) "
                                      "at 10 consecutive log steps (steps 125-350;")
    assert "G's loss_seg 0.3060 over the window's first half, 0.3040 over its second" in warning.message
    assert "Act: raise G's learning rate (optim.generator.lr) or its adversarial weight (loss.lambda_adv)" \
        in warning.message
    assert "optim.discriminator.lr" not in warning.message
    assert warning.values == {"loss_d": 0.1434}  # the event keeps D's values; G's loss only decides the cause


def test_d_near_zero_overpowers_g_and_warns_naming_d_lr_even_while_g_learns():
    rows = [(step, 2.0 - 0.1 * step, 0.001) for step in range(1, 5)]
    [warning] = feed_seg(DHealthDetector(HealthBand(window=3)), rows)
    assert warning.step == 3 and warning.message.startswith("D wins outright: loss_d below 0.02 at 3 consecutive")
    assert "D overpowers G" in warning.message
    assert "Act: lower D's learning rate (optim.discriminator.lr)" in warning.message
    assert "optim.generator.lr" not in warning.message
    # Off (null): the same D, with G learning, is a lead G can close.
    assert feed_seg(DHealthDetector(HealthBand(window=3, overpowers_loss=None)), rows) == []


def test_no_d_wins_count_before_g_adversarial_term_starts():
    """Before loss.adv_warmup_steps, G ignores D and cannot push back: D's lead does not count."""
    rows = [(step, 1.0, 0.0) for step in range(10, 110, 10)]
    detector = DHealthDetector(HealthBand(window=3, start=60))
    assert [event.since for event in feed_seg(detector, rows)] == [70]  # 70, 80, 90: the first window after 60



# D's accuracies on real and on fake maps at each of DEMO's log steps, as the demo logged them.
DEMO_ACCURACIES = [
    (1.0000, 0.0037), (0.9826, 0.5297), (0.9774, 0.9761), (0.9952, 0.9949), (0.9988, 0.9967), (0.9882, 0.9864),
    (0.9835, 0.9785), (0.9761, 0.9802), (1.0000, 0.9990), (0.9887, 0.9644), (0.9888, 0.9724), (0.9682, 0.9500),
    (0.9813, 0.9529), (0.9853, 0.9867), (0.9587, 0.9151), (0.9528, 0.9406), (0.9530, 0.9411), (0.9716, 0.9358),
    (0.9300, 0.9261), (0.9468, 0.8807), (0.9646, 0.9239), (0.9306, 0.8732), (0.9585, 0.9147), (0.9608, 0.8763),
    (0.9427, 0.9306), (0.9361, 0.8536), (0.9362, 0.8835), (0.9391, 0.8823), (0.8826, 0.8320), (0.8809, 0.8367),
    (0.8997, 0.8192), (0.9086, 0.8148), (0.8526, 0.8296), (0.8724, 0.8332), (0.8970, 0.8096), (0.8955, 0.8407),
    (0.8307, 0.8204), (0.9109, 0.8092), (0.8938, 0.8565), (0.9204, 0.8458), (0.8941, 0.8226), (0.8946, 0.8392),
    (0.8971, 0.8582), (0.8928, 0.8507), (0.8717, 0.8442), (0.8997, 0.7809), (0.8824, 0.8098), (0.8776, 0.8368)]

# The demo with D at 100 times its learning rate (`segadv-train optim.discriminator.lr=0.01`, the
# 2-core AMD EPYC VM, 2026-11-27) as it ran: (step, loss_seg, loss_d, d_acc_real, d_acc_fake). D
# wins during the warm-up (loss_d 0.02 and 0.002 at steps 75 and 100), then swings: 12.8 and 14.0
# (ten times chance, 1.386 for the sum) at steps 125 and 150, 3.7 at 275, 0.15-1.5 between, with
# its accuracies 0.64-0.95 throughout: never 10 log steps in a row below the band or at chance, so
# the band's two sides said nothing. G pays for it: val mIoU 0.585 at the end against the demo's 0.83.
DEMO_100X = [
    (25, 0.7073, 3.4932, 0.7308, 0.5207), (50, 0.4901, 0.8741, 0.8882, 0.8329), (75, 0.4676, 0.0224, 0.9937,
    0.9984), (100, 0.4246, 0.0019, 0.9999, 0.9999), (125, 0.4086, 12.8224, 0.7660, 0.7799), (150, 0.3792,
    14.0382, 0.6445, 0.6483), (175, 0.3185, 1.4831, 0.9188, 0.8669), (200, 0.3149, 0.6350, 0.9131, 0.9284),
    (225, 0.3188, 1.4336, 0.8772, 0.9140), (250, 0.3060, 0.9945, 0.8547, 0.9190), (275, 0.2986, 3.6752, 0.8167,
    0.8370), (300, 0.3038, 1.1537, 0.8988, 0.8933), (325, 0.2830, 0.2403, 0.9532, 0.9785), (350, 0.2869, 0.1546,
    0.9584, 0.9781), (375, 0.2938, 0.2282, 0.9625, 0.9593), (400, 0.3560, 0.7596, 0.8966, 0.9074), (425, 0.3016,
    0.6432, 0.8744, 0.8898), (450, 0.3675, 0.3250, 0.9371, 0.9398), (475, 0.2858, 0.4671, 0.9121, 0.9300), (500,
    0.2891, 0.3817, 0.8954, 0.9132), (525, 0.3650, 0.3592, 0.9262, 0.9159), (550, 0.3393, 0.4696, 0.8854,
    0.8999), (575, 0.3403, 0.6148, 0.8908, 0.8966), (600, 0.3072, 2.0709, 0.7957, 0.8156), (625, 0.2344, 1.0807,
    0.8536, 0.8551), (650, 0.2147, 0.9605, 0.8138, 0.8362), (675, 0.2263, 0.8153, 0.8227, 0.8240), (700, 0.2358,
    0.4844, 0.8973, 0.8722), (725, 0.2869, 0.5758, 0.8889, 0.8401), (750, 0.2523, 0.5596, 0.8671, 0.8765), (775,
    0.2473, 0.6547, 0.8742, 0.8102), (800, 0.2363, 0.5546, 0.8496, 0.8715), (825, 0.2685, 0.5131, 0.8975,
    0.8507), (850, 0.2568, 0.7125, 0.8431, 0.7890), (875, 0.2435, 0.6525, 0.8341, 0.8123), (900, 0.2500, 0.5798,
    0.9105, 0.8394), (925, 0.2412, 0.8571, 0.8540, 0.7553), (950, 0.2318, 0.6386, 0.9129, 0.7623), (975, 0.2893,
    0.5995, 0.8329, 0.8251), (1000, 0.2637, 0.7861, 0.7868, 0.8118), (1025, 0.2387, 0.6167, 0.8762, 0.8262),
    (1050, 0.2687, 0.6055, 0.8811, 0.8009), (1075, 0.2503, 0.5180, 0.8811, 0.8495), (1100, 0.2522, 0.7643,
    0.8422, 0.7764), (1125, 0.2787, 0.5480, 0.8921, 0.8412), (1150, 0.2580, 0.5308, 0.9313, 0.8452), (1175,
    0.2737, 0.4319, 0.9362, 0.9105), (1200, 0.2839, 0.5029, 0.9375, 0.8648)]


def demo_watch():
    """The demo's watch as a run of configs/default.yaml builds it (the band's defaults, the
    warm-up, the supervised method's summed scale)."""
    cfg = load_config(None, [])
    return DHealthWatch.for_run(cfg, method_class(cfg.method.name))


def feed_all(watch, rows):
    """``(step, loss_seg, loss_d, d_acc_real, d_acc_fake)`` rows into a watch; its events and its
    ``health/d_state`` at each log step."""
    events, states = [], []
    for step, seg, loss, real, fake in rows:
        logged = {"loss_seg": seg, "loss_d": loss, "d_acc_real": real, "d_acc_fake": fake}
        events += watch.update(step, logged)
        states.append(watch.scalars(logged)["health/d_state"])
    return events, states


def test_the_demo_with_its_accuracies_warns_about_nothing(caplog):
    rows = [(*row, *accuracy) for row, accuracy in zip(DEMO, DEMO_ACCURACIES, strict=True)]
    with caplog.at_level(logging.INFO, logger=HEALTH_LOGGER):
        events, states = feed_all(demo_watch(), rows)
    assert events == [] and set(states) == {0.0} and caplog.records == []


def test_the_demo_at_100x_d_learning_rate_warns_d_unstable_naming_d_lr(caplog):
    """Two log steps of the window far above chance with D's accuracies above it: the warning at
    step 150, the second jump; back at step 400, when the window (steps 175-400) holds one."""
    with caplog.at_level(logging.INFO, logger=HEALTH_LOGGER):
        events, states = feed_all(demo_watch(), DEMO_100X)
    [warning, back] = events
    assert (warning.condition, warning.since, warning.step, warning.back) == ("unstable", 125, 150, False)
    assert (back.condition, back.since, back.step, back.back) == ("unstable", 125, 400, True)
    assert warning.values == {"loss_d": 14.0382, "d_acc_real": 0.6445, "d_acc_fake": 0.6483}
    assert warning.message.startswith(
        "D unstable: loss_d at or above 2.8 (chance 1.386; 2 x the key's: loss_d sums D's two halves) at 2 of the "
        "last 6 log steps (steps 25-150; step 125 12.8224 (D's accuracy on real 0.766, on fake 0.780), step 150 "
        "14.0382 (D's accuracy on real 0.644, on fake 0.648)), D's accuracies above chance (their mean above 0.55)")
    assert "Act: lower D's learning rate (optim.discriminator.lr)" in warning.message
    assert "log.d_unstable_loss" in warning.message and "optim.generator.lr" not in warning.message
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [warning.message]
    assert "D back in its band: loss_d 0.7596 at step 400 (D unstable since step 125)" in caplog.text
    steps = [row[0] for row in DEMO_100X]
    assert [step for step, state in zip(steps, states) if state] == list(range(150, 400, 25))
    assert {state for state in states if state} == {2.0}


def unstable_detector(**band):
    return DHealthDetector(HealthBand(**{"window": 4, **band}))


def test_d_unstable_counts_jumps_far_above_chance_once_d_told_the_two_apart():
    """The rule on the references' scale (bound 1.4, two jumps within the window): a fresh D's
    loss above it is not a jump (it never told the two apart); a jump while D's accuracies are at
    chance is the collapsed side's; one jump alone, or two further apart than the window, warn
    nothing."""
    assert feed(unstable_detector(), [(1, 3.0, 0.7, 0.6), (2, 2.0, 0.7, 0.6), (3, 0.5, 0.9, 0.9),  # not told apart
                                      (4, 2.0, 0.5, 0.5), (5, 1.5, 0.6, 0.4)]) == [None] * 5  # at chance
    detector = unstable_detector()
    assert feed(detector, [(1, 0.5, 0.9, 0.9), (2, 1.5, 0.8, 0.8), (3, 0.5, 0.9, 0.9), (4, 0.6, 0.9, 0.9),
                           (5, 0.6, 0.9, 0.9), (6, 1.4, 0.8, 0.7)]) == [None] * 6  # steps 2 and 6: 5 apart
    [event] = [e for e in feed(detector, [(7, 0.6, 0.9, 0.9), (8, 1.39, 0.9, 0.9), (9, 2.5, 0.9, 0.8)]) if e]
    assert (event.condition, event.since, event.step) == ("unstable", 6, 9)
    assert "at 2 of the last 4 log steps (steps 6-9; step 6 1.4000" in event.message


def test_d_unstable_needs_accuracies_and_its_key():
    rows = [(1, 0.5, None, None), (2, 2.0, None, None), (3, 2.0, None, None), (4, 0.5, None, None)]
    assert feed(unstable_detector(), rows) == [None] * 4  # a constant output's loss can be high too
    rows = [(1, 0.5, 0.9, 0.9), (2, 2.0, 0.8, 0.8), (3, 2.0, 0.8, 0.8)]
    assert feed(unstable_detector(unstable_loss=None), rows) == [None] * 3
    assert feed(unstable_detector(unstable_loss=3.0), rows) == [None] * 3
    assert feed(unstable_detector(), rows)[2].condition == "unstable"
    assert HealthBand.from_config(LogConfig(d_unstable_loss=None)).unstable_loss is None

# ------------------------------------------------------------------------- in a run


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("d_wins_loss", ["100", "null"])
def test_a_run_warns_once_per_d_that_wins_with_the_numbers(tmp_path, caplog, d_wins_loss):
    """Multi-level AdaptSegNet logs loss_d and loss_d_aux; bounds above any BCE loss make both Ds
    "win" and "overpower" from the first log step: one warning each once log.d_wins_steps log steps
    are in, whatever G's loss does."""
    cfg = load_config(None, [*UDA_OVERRIDES, "train.log_every=1", f"log.d_wins_loss={d_wins_loss}",
                             "log.d_overpowers_loss=100", "log.d_wins_steps=2", "log.tensorboard=false"])
    cfg.run_dir, cfg.device_map = str(tmp_path / "run"), "cpu"
    with caplog.at_level(logging.WARNING, logger="segadv.monitor.diagnostics"):
        train(cfg)
    warnings = [r.getMessage() for r in caplog.records if r.name == "segadv.monitor.diagnostics"]
    if d_wins_loss == "null":
        assert warnings == []
        return
    logged = {r["step"]: r for r in read_metrics(tmp_path / "run") if "train/loss_d" in r}
    expected = []
    for name, suffix in (("loss_d", ""), ("loss_d_aux", "_aux")):
        first, second = logged[1][f"train/{name}"], logged[2][f"train/{name}"]
        source, target = logged[2][f"train/d_acc_source{suffix}"], logged[2][f"train/d_acc_target{suffix}"]
        expected.append(f"D wins outright: {name} below 100 at 2 consecutive log steps (steps 1-2; "
                        f"min {min(first, second):.4f}, max {max(first, second):.4f}, now {second:.4f}; "
                        f"D's accuracy on source {source:.3f}, on target {target:.3f})")
    assert [w.split("; G's loss_seg")[0] for w in warnings] == expected
    assert all("Act: lower D's learning rate (optim.discriminator.lr)" in w for w in warnings)
    states = [(r["health/d_state"], r["health/d_state_aux"]) for _, r in sorted(logged.items())]
    assert states == [(0.0, 0.0)] + [(1.0, 1.0)] * (len(states) - 1)  # from the warning on


def test_auroc_is_the_probability_a_positive_outscores_a_negative_ties_counting_half():
    from segadv.monitor.diagnostics import auroc

    scores = torch.tensor([0.9, 0.8, 0.3, 0.1])
    assert auroc(scores, torch.tensor([True, True, False, False])) == 1.0
    assert auroc(scores, torch.tensor([False, False, True, True])) == 0.0
    # pairs (pos, neg): (0.8, 0.9) lost, (0.8, 0.3) won, (0.1, 0.9) lost, (0.1, 0.3) lost: 1 of 4
    assert auroc(scores, torch.tensor([False, True, False, True])) == 0.25
    assert auroc(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([True, False, False])) == 0.5  # ties: half
    assert auroc(scores, torch.ones(4, dtype=torch.bool)) != auroc(scores, torch.ones(4, dtype=torch.bool))  # NaN
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(2000, generator=gen), torch.rand(2000, generator=gen) > 0.5
    assert abs(auroc(x, y) - 0.5) < 0.05  # uninformative scores


def test_confidence_quality_reads_the_truth_at_labeled_pixels_only():
    from segadv.monitor.diagnostics import confidence_quality

    preds = torch.tensor([[[1, 1], [2, 2]]])
    truth = torch.tensor([[[1, 0], [2, 255]]])  # right, wrong, right, ignored
    confidence = torch.tensor([[[0.9, 0.2], [0.6, 0.0]]])
    passes = confidence >= 0.5
    quality = confidence_quality(preds, confidence, passes, truth, ignore_index=255)
    assert quality == {"d_confidence_auroc": 1.0, "d_mask_precision": 1.0, "d_mask_pass": pytest.approx(2 / 3),
                       "g_pixel_acc": pytest.approx(2 / 3)}
