"""The loop's reporter (segadv/monitor/reporter.py) through its interface, on stand-in parts: what
each call writes to metrics.jsonl, status.json and the log, and that a step reads nothing on the
host. The whole run through it is tests/monitor/test_profile.py, test_status.py and tests/integration."""

from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from segadv.monitor.profile import PhaseTimer
from segadv.methods.registry import method_class
from segadv.monitor.diagnostics import DHealthWatch
from segadv.monitor.reporter import Reporter
from segadv.monitor.status import RunRecord, read_status

CPU = torch.device("cpu")
HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
              torch.Tensor.__int__, torch.Tensor.__index__}


class NoHostReads(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            raise AssertionError(f"read on the host: {func.__name__}")
        return func(*args, **(kwargs or {}))


class Method:
    panel_stream = "unlabeled"
    d_losses = ("loss_d", "loss_d_aux")  # as AdaptSegNet's two levels declare them

    def __init__(self, size: int = 8, ignore_index: int = 255) -> None:
        self.size, self.ignore, self.panel_calls = size, ignore_index, []

    def panel(self, images):
        """G right everywhere, D sure of the left half only, the mask passing that half."""
        self.panel_calls.append(len(images))
        n, size = len(images), self.size
        confidence = torch.zeros(n, size, size)
        confidence[..., : size // 2] = 1.0
        pseudo = torch.full((n, size, size), self.ignore)
        pseudo[..., : size // 2] = 1
        return SimpleNamespace(tag="method/panel", images=images, preds=torch.ones(n, size, size, dtype=torch.long),
                               confidence=confidence, pseudo_labels=pseudo)


class DeclaringMethod(Method):
    d_losses = ("loss_critic",)


class Guard:
    def __init__(self) -> None:
        self.checked, self.unlogged = [], []

    def check(self, step, losses):
        self.checked.append((step, dict(losses)))

    def check_unlogged(self, step, losses):
        self.unlogged.append((step, losses.steps))

    def skipped(self):
        return {"train/skipped_steps/generator": 0.0}


def parts_with(method) -> SimpleNamespace:
    nets = [SimpleNamespace(short=short, opt=SimpleNamespace(last_step_lr=lr, loss_scale=lambda: 1.0))
            for short, lr in (("g", 2.5e-4), ("d", 1e-4))]
    return SimpleNamespace(method=method, phases=PhaseTimer(), device_map=SimpleNamespace(generator=CPU, devices=[CPU]),
                           networks=lambda: nets)


@pytest.fixture
def cfg(tiny_cfg, tmp_path):
    tiny_cfg.log.tensorboard = False
    tiny_cfg.log.progress_bar = False
    tiny_cfg.train.max_steps, tiny_cfg.train.log_every = 10, 2
    return tiny_cfg


def reporter_for(cfg, tmp_path, method=None, guard=None, is_main=True, **kwargs) -> Reporter:
    record = RunRecord(tmp_path, cfg.train.max_steps, enabled=is_main)
    return Reporter(cfg, parts_with(method or Method()), tmp_path, record, guard, is_main=is_main, **kwargs)


def records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_a_step_reads_nothing_and_a_log_step_writes_the_means(cfg, tmp_path, caplog):
    guard = Guard()
    caplog.set_level(logging.INFO, logger="segadv.training.loop")
    with reporter_for(cfg, tmp_path, guard=guard) as reporter:
        reporter.begin(0, None)
        with NoHostReads():
            for step, value in ((1, 1.0), (2, 3.0)):
                reporter.step_done(step, {"loss_seg": torch.tensor(value), "loss_d": torch.tensor(2 * value)},
                                   {"labeled": 0.25})
        means = reporter.log(2)
    assert means == {"loss_seg": 2.0, "loss_d": 4.0}
    [record] = records(tmp_path)
    assert record["step"] == 2 and record["train/loss_seg"] == 2.0 and record["train/loss_d"] == 4.0
    assert record["train/lr_g"] == 2.5e-4 and record["train/lr_d"] == 1e-4 and record["amp/scale_g"] == 1.0
    assert record["perf/data_time"] == pytest.approx(0.25) and "perf/step_time" in record
    assert record["train/skipped_steps/generator"] == 0.0
    assert guard.checked == [(2, means)]
    assert "step 2/10 loss_seg=2.0000 loss_d=4.0000" in caplog.text
    assert reporter.parts.phases.seconds["data/labeled"] == pytest.approx(0.5)
    assert reporter.parts.phases.seconds["logging"] > 0


def test_empty_selections_are_logged_as_their_share_and_shown_only_when_not_zero(cfg, tmp_path, caplog):
    """train/empty/<loss>: the share of the steps since the last log line whose selection was empty;
    the console's line leaves out the ones at 0."""
    caplog.set_level(logging.INFO, logger="segadv.training.loop")
    with reporter_for(cfg, tmp_path) as reporter:
        reporter.begin(0, None)
        for step, (seg, empty) in enumerate(((0.0, 1.0), (0.5, 0.0), (0.7, 0.0), (0.3, 0.0)), start=1):
            reporter.step_done(step, {"loss_seg": torch.tensor(seg), "empty/loss_seg": torch.tensor(empty),
                                      "empty/loss_semi": torch.tensor(0.0)}, {"labeled": 0.0})
            if reporter.should_log(step):
                reporter.log(step)
    first, second = records(tmp_path)
    assert (first["train/empty/loss_seg"], first["train/empty/loss_semi"]) == (0.5, 0.0)
    assert (second["train/empty/loss_seg"], second["train/empty/loss_semi"]) == (0.0, 0.0)
    assert "step 2/10 loss_seg=0.2500 empty/loss_seg=0.5000 eta" in caplog.text
    assert "step 4/10 loss_seg=0.5000 eta" in caplog.text and "empty/loss_semi" not in caplog.text


def test_it_logs_every_log_every_steps_and_at_the_last(cfg, tmp_path):
    with reporter_for(cfg, tmp_path) as reporter:
        assert [step for step in range(1, 11) if reporter.should_log(step)] == [2, 4, 6, 8, 10]
        cfg.train.log_every = 4
        assert [step for step in range(1, 11) if reporter.should_log(step)] == [4, 8, 10]


def test_the_losses_not_logged_yet_go_to_the_guard_before_a_save(cfg, tmp_path):
    guard = Guard()
    with reporter_for(cfg, tmp_path, guard=guard) as reporter:
        reporter.begin(0, None)
        for step in (1, 2, 3):
            reporter.step_done(step, {"loss_seg": torch.tensor(1.0)}, {})
        reporter.check_finite(3)
    assert guard.unlogged == [(3, 3)]


def test_a_phase_outside_the_step_is_profiled_and_kept_out_of_the_step_time(cfg, tmp_path):
    with reporter_for(cfg, tmp_path) as reporter:
        reporter.begin(0, None)
        reporter.step_done(1, {"loss_seg": torch.tensor(1.0)}, {"labeled": 5.0})
        with reporter.phase("evaluation"):
            pass
        reporter.step_done(2, {"loss_seg": torch.tensor(1.0)}, {"labeled": 1.0})
        reporter.log(2)
    assert "evaluation" in reporter.parts.phases.seconds
    assert records(tmp_path)[0]["perf/data_time"] == pytest.approx(1.0)  # the wait before the phase is dropped


def d_loss_names(cfg, method):
    """The D losses a run's health watch reads for ``method``."""
    return tuple(d.name for d in DHealthWatch.for_run(cfg, type(method), announce=False).detectors)


def test_the_d_health_watch_reads_the_method_d_losses(cfg, tmp_path, caplog):
    assert d_loss_names(cfg, Method()) == method_class("adaptsegnet").d_losses == ("loss_d", "loss_d_aux")
    assert method_class("minent").d_losses == ()  # no D, nothing to watch
    assert d_loss_names(cfg, DeclaringMethod()) == ("loss_critic",)
    cfg.log.d_wins_loss, cfg.log.d_wins_steps, cfg.log.d_overpowers_loss = 0.1, 2, None  # no loss_seg: warns
    with caplog.at_level(logging.WARNING, logger="segadv.monitor.diagnostics"), \
            reporter_for(cfg, tmp_path, method=DeclaringMethod()) as reporter:
        reporter.begin(0, None)
        for step in (1, 2, 3, 4):
            reporter.step_done(step, {"loss_critic": torch.tensor(0.01), "loss_d": torch.tensor(0.01)}, {})
            if reporter.should_log(step):
                reporter.log(step)
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.levelno == logging.WARNING] == \
        ["D wins outright"]
    assert "loss_critic below 0.1" in caplog.text and "loss_d below" not in caplog.text


def test_only_rank_0_writes_and_warns_but_every_rank_decides_on_d_health(cfg, tmp_path, caplog):
    cfg.log.d_wins_loss, cfg.log.d_wins_steps, cfg.train.on_discriminator_collapse = 0.1, 1, "stop"
    with caplog.at_level(logging.INFO, logger="segadv.monitor.diagnostics"), \
            reporter_for(cfg, tmp_path, is_main=False) as reporter:
        reporter.begin(0, None)
        reporter.step_done(1, {"loss_d": torch.tensor(0.01)}, {})
        reporter.log(2)
        reporter.finish(2)
    assert reporter.stop_reason == "D wins outright on loss_d, train.on_discriminator_collapse: stop"
    assert caplog.records == []
    assert not (tmp_path / "metrics.jsonl").exists() and read_status(tmp_path) is None


def test_d_leaving_its_band_goes_to_the_metrics_tensorboard_and_status(cfg, tmp_path, caplog):
    cfg.log.d_wins_loss, cfg.log.d_wins_steps, cfg.train.log_every = 0.1, 2, 1
    cfg.log.d_overpowers_loss = None  # no loss_seg logged: the watch cannot tell the cause and warns at 0.1
    cfg.log.tensorboard = True
    with caplog.at_level(logging.WARNING, logger="segadv.monitor.diagnostics"), \
            reporter_for(cfg, tmp_path) as reporter:
        reporter.begin(0, None)
        for step, loss in enumerate((0.5, 0.01, 0.02, 0.03, 0.5), 1):
            reporter.step_done(step, {"loss_d": torch.tensor(loss)}, {})
            reporter.log(step)
            if step == 3:
                during = read_status(tmp_path)
        assert reporter.stop_reason is None  # train.on_discriminator_collapse: warn
        reporter.finish(5)
    assert [r["health/d_state"] for r in records(tmp_path) if "train/loss_d" in r] == [0.0, 0.0, 1.0, 1.0, 0.0]
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("D wins outright: loss_d below 0.1 at 2 consecutive log steps (steps 2-3;")
    [episode] = during.discriminator_health
    assert (during.outcome, episode.condition, episode.loss, episode.since, episode.step, episode.until) == \
        ("running", "wins", "loss_d", 2, 3, None)
    assert episode.values == {"loss_d": pytest.approx(0.02)}
    assert read_status(tmp_path).discriminator_health[0].until == 5  # back in the band

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(reporter.tensorboard_dir))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("health/d_state")] == \
        [(1, 0.0), (2, 0.0), (3, 1.0), (4, 1.0), (5, 0.0)]
    [text] = events.Tensors("health/discriminator/text_summary")
    assert text.step == 3 and text.tensor_proto.string_val[0].decode() == warning


def test_d_unstable_is_an_episode_in_status_and_state_2(cfg, tmp_path, caplog):
    """Two jumps far above chance within the window, D's accuracies above chance: "D unstable",
    recorded like the band's two sides, until the window holds fewer."""
    cfg.log.d_wins_steps, cfg.train.log_every = 3, 1
    with caplog.at_level(logging.WARNING, logger="segadv.monitor.diagnostics"), \
            reporter_for(cfg, tmp_path) as reporter:
        reporter.begin(0, None)
        for step, loss in enumerate((0.5, 6.0, 0.5, 6.0, 0.5, 0.5), 1):
            reporter.step_done(step, {"loss_d": torch.tensor(loss), "d_acc_real": torch.tensor(0.9),
                                      "d_acc_fake": torch.tensor(0.8)}, {})
            reporter.log(step)
        reporter.finish(6)
    assert [r["health/d_state"] for r in records(tmp_path) if "train/loss_d" in r] == [0, 0, 0, 2.0, 0, 0]
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("D unstable: loss_d at or above 1.4 (chance 0.693) at 2 of the last 3 log steps")
    [episode] = read_status(tmp_path).discriminator_health
    assert (episode.condition, episode.since, episode.step, episode.until) == ("unstable", 2, 4, 5)


def evaluation(classes: int, miou=0.5, pixel_acc=0.75):
    """An evaluation that never saw the last class (its IoU NaN)."""
    iou = [0.5] * (classes - 1) + [math.nan]
    return SimpleNamespace(metrics={"mIoU": miou, "pixel_acc": pixel_acc, "iou": iou}, samples=None,
                           absent_classes=[], matrix=torch.eye(classes, dtype=torch.int64), proxies={})


def test_an_evaluation_is_logged_and_recorded(cfg, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="segadv.training.loop")
    from segadv.data import class_names

    names = class_names(cfg.data)
    images = {}
    with reporter_for(cfg, tmp_path) as reporter:
        reporter.writer.image = lambda step, tag, image: images.setdefault(tag, (step, image))
        reporter.begin(0, None)
        metrics = reporter.evaluation(4, evaluation(len(names)), [], train_seconds=12.5)
        reporter.evaluation(4, evaluation(len(names), 0.25, 0.5), [], prefix="val_source")
        reporter.evaluated(4, metrics, {"mIoU": 0.5, "step": 4})
        status = read_status(tmp_path)
    val, source, best = records(tmp_path)
    assert metrics["mIoU"] == 0.5
    assert val["val/mIoU"] == 0.5 and val["val/pixel_acc"] == 0.75 and val["perf/train_seconds"] == 12.5
    assert val[f"val/IoU/{names[0]}"] == 0.5 and f"val/IoU/{names[-1]}" not in val  # NaN: never seen
    assert source["val_source/mIoU"] == 0.25 and "perf/train_seconds" not in source
    assert best == {"step": 4, "time": best["time"], "val/best_mIoU": 0.5}
    assert "step 4: val mIoU 0.5000, pixel accuracy 0.7500" in caplog.text
    assert "step 4: val_source mIoU 0.2500, pixel accuracy 0.5000" in caplog.text
    assert status.outcome == "running" and status.final.mIoU == 0.5 and status.best.pixel_acc == 0.75
    # the confusion matrix as a TensorBoard image at each evaluation, per val split
    assert set(images) == {"val/confusion_matrix", "val_source/confusion_matrix"}
    step, image = images["val/confusion_matrix"]
    assert step == 4 and image.dtype == torch.uint8 and image.shape[0] == 3


def test_the_diagnostics_are_the_method_panel_and_d_confidence_quality(cfg, tmp_path):
    cfg.log.num_images = 2
    method = Method(ignore_index=cfg.data.ignore_index)
    with reporter_for(cfg, tmp_path, method=method) as reporter:
        reporter.begin(0, None)
        diagnostic = torch.zeros(5, 3, 8, 8), torch.ones(5, 8, 8, dtype=torch.long)
        reporter.diagnostics(4, torch.zeros(2, 3, 8, 8), diagnostic)
        reporter.diagnostics(6, None, None)
    assert method.panel_calls == [2, 2, 2, 1]  # the panel, then the diagnostic images in chunks of its size
    [quality] = records(tmp_path)
    assert quality["step"] == 4 and quality["diag/g_pixel_acc"] == 1.0 and quality["diag/d_mask_precision"] == 1.0
    assert quality["diag/d_mask_pass"] == 0.5 and math.isnan(quality["diag/d_confidence_auroc"])  # G never wrong


class SelfTraining(Method):
    """A method offering its last training batch (``Method.training_views``), counting the asks."""

    def __init__(self, views=None) -> None:
        super().__init__()
        self.views, self.asked = views, 0

    def training_views(self):
        self.asked += 1
        return self.views


@pytest.mark.parametrize("is_main, tensorboard, num_images, drawn", [
    (True, True, 2, True),
    (False, True, 2, False),  # only rank 0 logs: the others never ask
    (True, False, 2, False),  # nothing would be written
    (True, True, 0, False),  # log.num_images: 0, no image panels
])
def test_the_methods_last_training_batch_is_drawn_by_rank_0_at_an_evaluation(cfg, tmp_path, is_main, tensorboard,
                                                                               num_images, drawn):
    from segadv.data import class_names
    from segadv.data.palette import palette
    from segadv.methods.base import TrainingViews
    from segadv.monitor.images import training_views_panel

    cfg.log.tensorboard, cfg.log.num_images = tensorboard, num_images
    labels = torch.ones(3, 8, 8, dtype=torch.long)
    views = TrainingViews(torch.zeros(3, 3, 8, 8), labels, torch.rand(3, 8, 8), tag="train/strong_view",
                          titles=("strong view", "pseudo label", "mask"))
    method = SelfTraining(views)
    images = []
    with reporter_for(cfg, tmp_path, method=method, is_main=is_main) as reporter:
        reporter.writer.image = lambda step, tag, image: images.append((step, tag, image))
        reporter.begin(0, None)
        reporter.diagnostics(4, None, None)
    assert method.asked == int(drawn)
    if drawn:  # the first log.num_images of the batch, under the views' own tag and titles
        expected = training_views_panel(views.first(2), palette(cfg.data.num_classes), cfg.data.input_normalization,
                                        class_names(cfg.data))
        [(step, tag, image)] = images
        assert step == 4 and tag == "train/strong_view" and torch.equal(image, expected)
    else:
        assert images == []


def test_a_method_without_training_views_draws_nothing(cfg, tmp_path):
    cfg.log.tensorboard = True
    method, images = SelfTraining(None), []  # Method.training_views's default, or no iteration yet
    with reporter_for(cfg, tmp_path, method=method) as reporter:
        reporter.writer.image = lambda step, tag, image: images.append(tag)
        reporter.begin(0, None)
        reporter.diagnostics(4, None, None)
    assert method.asked == 1 and images == []


def test_the_end_logs_the_profile_and_records_the_step_reached(cfg, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="segadv.training.loop")
    record = RunRecord(tmp_path, cfg.train.max_steps)
    with Reporter(cfg, parts_with(Method()), tmp_path, record) as reporter:
        reporter.begin(4, {"mIoU": 0.3, "step": 4})
        for step in (5, 6):
            reporter.step_done(step, {"loss_seg": torch.tensor(1.0)}, {"labeled": 0.0})
        reporter.finish(6)
    reporter.close()  # a second close does nothing
    assert "time profile (this process, 2 steps, 5-6)" in caplog.text
    [profile] = records(tmp_path)
    assert profile["step"] == 6 and profile["perf/time/wall"] > 0 and "perf/share/data/labeled" in profile
    assert record.step == 6 and record.start_step == 4 and read_status(tmp_path).best.mIoU == 0.3


def test_a_failed_start_closes_the_files(cfg, tmp_path):
    with pytest.raises(RuntimeError, match="config"):
        with reporter_for(cfg, tmp_path) as reporter:
            raise RuntimeError("cannot save the config")
    assert reporter.writer._jsonl.closed and reporter.progress is None


def test_the_bar_advances_at_every_step_without_a_host_read(cfg, tmp_path):
    cfg.log.progress_bar = True
    with reporter_for(cfg, tmp_path) as reporter:
        reporter.begin(0, None)
        with NoHostReads():
            reporter.step_done(1, {"loss_seg": torch.tensor(1.0)}, {})
            assert reporter.progress._bar.n == 1 and not reporter.progress._bar.postfix
        reporter.step_done(2, {"loss_seg": torch.tensor(3.0)}, {})
        reporter.log(2)
        assert reporter.progress._bar.n == 2 and "loss_seg=2.0000" in reporter.progress._bar.postfix
        with NoHostReads():
            reporter.step_done(3, {"loss_seg": torch.tensor(1.0)}, {})
        assert reporter.progress._bar.n == 3 and "loss_seg=2.0000" in reporter.progress._bar.postfix


def test_the_config_goes_to_tensorboard_as_text_at_the_start(cfg, tmp_path):
    cfg.log.tensorboard = True
    with reporter_for(cfg, tmp_path) as reporter:
        texts = []
        reporter.writer.text = lambda step, tag, markdown: texts.append((step, tag, markdown))
        reporter.begin(3, None)
    [(step, tag, markdown)] = texts
    assert (step, tag) == (3, "config") and "\n    train:\n" in markdown and "\n      max_steps: 10\n" in markdown
