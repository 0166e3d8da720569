"""D's diagnostics: accuracy on real and fake maps, confidence histogram, "D wins outright"."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from segadv.config import load_config
from segadv.config.schema import LogConfig
from segadv.monitor.diagnostics import DWinsDetector, d_accuracy, d_confidence
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


def test_d_wins_warns_once_after_enough_consecutive_low_losses(caplog):
    detector = DWinsDetector(bound=0.2, steps=3)
    with caplog.at_level(logging.WARNING, logger="segadv.monitor.diagnostics"):
        results = [detector.update(step, loss) for step, loss in
                   [(10, 0.1), (20, 0.15), (30, 0.3), (40, 0.1), (50, math.nan), (60, 0.1), (70, 0.05), (80, 0.19),
                    (90, 0.01), (100, 0.01), (110, 0.01)]]
    assert results == [False] * 7 + [True] + [False] * 3  # 0.3 and NaN start the count over
    assert len(caplog.records) == 1 and detector.warned
    assert ("D wins outright: loss_d below 0.2 at 3 consecutive log steps (steps 60-80; min 0.0500, now 0.1900)"
            in caplog.text)


def test_d_wins_from_the_log_section():
    detector = DWinsDetector.from_config(LogConfig(), name="loss_d_aux")
    assert (detector.bound, detector.steps, detector.name) == (0.2, 10, "loss_d_aux")
    assert DWinsDetector.from_config(LogConfig(d_wins_loss=None)) is None


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


# ------------------------------------------------------------------------- in a run


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("d_wins_loss", ["100", "null"])
def test_a_run_warns_once_per_d_that_wins_with_the_numbers(tmp_path, caplog, d_wins_loss):
    """Multi-level AdaptSegNet logs loss_d and loss_d_aux; a bound above any BCE loss makes both Ds
    "win" from the first log step: one warning each once log.d_wins_steps log steps are in."""
    cfg = load_config(None, [*UDA_OVERRIDES, "train.log_every=1", f"log.d_wins_loss={d_wins_loss}",
                             "log.d_wins_steps=2", "log.tensorboard=false"])
    cfg.run_dir, cfg.device_map = str(tmp_path / "run"), "cpu"
    with caplog.at_level(logging.WARNING, logger="segadv.monitor.diagnostics"):
        train(cfg)
    warnings = [r.getMessage() for r in caplog.records if r.name == "segadv.monitor.diagnostics"]
    if d_wins_loss == "null":
        assert warnings == []
        return
    logged = {r["step"]: r for r in read_metrics(tmp_path / "run") if "train/loss_d" in r}
    expected = []
    for name in ("loss_d", "loss_d_aux"):
        first, second = logged[1][f"train/{name}"], logged[2][f"train/{name}"]
        expected.append(f"D wins outright: {name} below 100 at 2 consecutive log steps (steps 1-2; "
                        f"min {min(first, second):.4f}, now {second:.4f})")
    assert [w.split(": D tells")[0] for w in warnings] == expected


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
