"""train.early_stop (segadv/training/early_stop.py): the count on scripted scores (patience,
min_delta, each score's direction, NaN), its checkpoint entry, its place among the stop reasons,
the start's check of the score watched, and real tiny runs whose val mIoU is scripted per step:
the run stops at the right evaluation with a checkpoint and says why, a resume goes on counting,
a stopped run stays stopped until given more patience, and checkpoint.keep_best's files follow."""

from __future__ import annotations

import json
import logging

import pytest

from segadv.checkpoint.io import read_checkpoint
from segadv.cli.train import main
from segadv.config import load_config
from segadv.config.schema import EarlyStopConfig
from segadv.errors import UserError
from segadv.methods import method_class
from segadv.monitor.status import read_status
from segadv.training import loop
from segadv.training.early_stop import EarlyStop, check_monitor, stopped_early
from segadv.training.stopping import StopDecision

from conftest import TINY_OVERRIDES
from helpers import TARGET_DATA
from test_stopping import Alone, Requests


def counted(scores, monitor="val/mIoU", patience=2, min_delta=0.0, key="mIoU"):
    """The evaluations' scores fed in turn (step 10, 20, ...); the step it stops at, and the count."""
    early = EarlyStop(EarlyStopConfig(monitor=monitor, patience=patience, min_delta=min_delta))
    for i, score in enumerate(scores, 1):
        metrics = {key: score} if key != "proxies" else {"mIoU": 0.5, "proxies": {monitor: score}}
        if early.update(10 * i, metrics) is not None:
            return 10 * i, early
    return None, early


def test_patience_evaluations_without_improvement_stop_the_run():
    step, early = counted([0.3, 0.5, 0.4, 0.5, 0.45])  # equal is no improvement
    assert step == 40 and (early.best, early.best_step, early.wait) == (0.5, 20, 2)
    assert early.reason() == "train.early_stop: val/mIoU did not improve for 2 evaluations (best 0.5000 at step 20)"
    assert counted([0.3, 0.5, 0.4, 0.6, 0.55])[0] is None  # an improvement starts the count over
    step, early = counted([0.5, 0.4], patience=1)
    assert step == 20 and early.reason().endswith("did not improve for 1 evaluation (best 0.5000 at step 10)")


def test_min_delta_asks_for_at_least_that_much():
    step, early = counted([0.5, 0.55, 0.6, 0.8], min_delta=0.1)
    assert step == 30 and early.best == 0.5
    assert early.reason().startswith("train.early_stop: val/mIoU did not improve by 0.1 or more for 2 evaluations")
    # Exactly min_delta improves (0.125 and these scores are exact in binary).
    assert counted([0.5, 0.625, 0.75], min_delta=0.125)[0] is None


def test_each_score_in_its_direction_and_a_nan_never_improves():
    assert counted([0.5, 0.4, 0.45], monitor="proxy/entropy", key="proxies")[0] is None  # lower is better
    assert counted([0.5, 0.6, 0.55], monitor="proxy/entropy", key="proxies")[0] == 30
    assert counted([0.9, 0.95, 0.99], monitor="val/pixel_acc", key="pixel_acc")[0] is None
    step, early = counted([float("nan"), float("nan")])
    assert step == 20 and early.best is None and "(no finite score)" in early.reason()


def test_the_count_is_a_checkpoint_entry_kept_for_the_same_score_only(caplog):
    _, early = counted([0.3, 0.5, 0.4], patience=3)
    state = early.state_dict()
    assert state == {"monitor": "val/mIoU", "best": 0.5, "best_step": 20, "wait": 1}
    again = EarlyStop(EarlyStopConfig(monitor="val/mIoU", patience=3))
    again.load_state_dict(state)
    assert (again.best, again.best_step, again.wait) == (0.5, 20, 1)
    other = EarlyStop(EarlyStopConfig(monitor="val/pixel_acc"))
    with caplog.at_level(logging.WARNING):
        other.load_state_dict(state)
    assert (other.best, other.wait) == (None, 0) and "the count starts over" in caplog.text
    assert EarlyStop(EarlyStopConfig()).state_dict() is None  # off: nothing counted or saved
    # A resume's question: would the run stop at once?
    assert stopped_early(EarlyStopConfig(monitor="val/mIoU", patience=1), state) is not None
    assert stopped_early(EarlyStopConfig(monitor="val/mIoU", patience=2), state) is None
    assert stopped_early(EarlyStopConfig(), state) is None


def test_the_early_stop_is_heard_after_every_other_reason():
    stop = StopDecision(0, 10, Requests("SIGTERM", at=4), Alone())
    stop.after_step(4)
    stop.at_log(None)
    stop.at_evaluation("train.early_stop: ...")
    assert stop.stopped_by == "SIGTERM"
    stop = StopDecision(0, 10, Requests(), Alone())
    stop.after_step(4)
    stop.at_evaluation("train.early_stop: ...")
    assert (stop.early, stop.stopped_by, stop.outcome) == (True, "train.early_stop: ...", "stopped")
    stop = StopDecision(0, 10, Requests(), Alone())
    stop.after_step(10)
    stop.at_evaluation("train.early_stop: ...")
    assert stop.outcome == "finished"  # at train.max_steps the run is finished anyway


def test_a_score_the_run_never_computes_is_refused_naming_the_key():
    supervised = load_config(None, [*TINY_OVERRIDES, "train.early_stop.monitor=proxy/entropy"])
    with pytest.raises(UserError, match=r"^train.early_stop.monitor: proxy/entropy is a label-free score"):
        check_monitor(supervised, method_class("supervised"))
    minent = load_config(None, [*TINY_OVERRIDES, TARGET_DATA, "method.name=minent",
                                "train.early_stop.monitor=proxy/d_confidence"])
    with pytest.raises(UserError, match=r"^train.early_stop.monitor: proxy/d_confidence is D's score"):
        check_monitor(minent, method_class("minent"))
    for ok in ("val/pixel_acc", "proxy/snd"):
        check_monitor(load_config(None, [*TINY_OVERRIDES, TARGET_DATA, "method.name=minent",
                                         f"train.early_stop.monitor={ok}"]), method_class("minent"))


def test_the_start_exits_2_naming_the_key_and_leaves_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["--run-dir", str(run_dir), *TINY_OVERRIDES, "device_map=cpu",
                 "train.early_stop.monitor=proxy/entropy"])
    assert code == 2
    assert "train.early_stop.monitor: proxy/entropy is a label-free score" in capsys.readouterr().err
    assert not run_dir.exists()
    assert main(["--run-dir", str(run_dir), *TINY_OVERRIDES, "train.early_stop.monitor=val/loss"]) == 2
    assert "train.early_stop.monitor" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- real runs

MIOU = {2: 0.30, 4: 0.50, 6: 0.45, 8: 0.40, 10: 0.48, 12: 0.60}  # val mIoU by step, as scripted
REASON = "train.early_stop: val/mIoU did not improve for {n} evaluations (best 0.5000 at step 4)"


@pytest.fixture
def scripted(monkeypatch):
    """The run's real evaluations, their val mIoU replaced by MIOU's (what the early stop, best.pt
    and keep_best read): a tiny run's own scores are not ones a test can steer."""
    real = loop.evaluate_all

    def evaluate_all(cfg, parts, data, reporter, step):
        return {**real(cfg, parts, data, reporter, step), "mIoU": MIOU[step]}

    monkeypatch.setattr(loop, "evaluate_all", evaluate_all)


def run_cfg(run_dir, *extra):
    cfg = load_config(None, [*TINY_OVERRIDES, "train.max_steps=12", "train.eval_every=2", "checkpoint.every=100",
                             "log.tensorboard=false", "log.num_images=0", "train.early_stop.monitor=val/mIoU",
                             "train.early_stop.patience=2", "checkpoint.keep_best=2", *extra])
    cfg.run_dir, cfg.device_map = str(run_dir), "cpu"
    return cfg


def val_steps(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if "val/mIoU" in r]


@pytest.mark.slow  # four short trainings of a few steps each
def test_a_run_stops_at_the_evaluation_its_patience_ends_and_resumes_counting(tmp_path, scripted, caplog):
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"

    # Interrupted at step 6 (one evaluation without improvement so far): the count is saved.
    assert loop.train(run_cfg(run_dir), stop_at=6).stopped_by == "stop_at"
    assert read_checkpoint(ckpts / "last.pt")["early_stop"] == \
        {"monitor": "val/mIoU", "best": 0.5, "best_step": 4, "wait": 1}

    # Resumed, it counts on: step 8's evaluation is the second without improvement.
    with caplog.at_level(logging.INFO):
        result = loop.train(run_cfg(run_dir), resume="auto")
    assert (result.step, result.stopped_by) == (8, REASON.format(n=2))
    assert val_steps(run_dir) == [2, 4, 6, 8]
    last = read_checkpoint(ckpts / "last.pt")
    assert (last["step"], last["early_stop"]["wait"]) == (8, 2)
    status = read_status(run_dir)
    assert (status.outcome, status.step, status.stopped_by, status.exit_code) == ("stopped", 8, REASON.format(n=2), 0)
    assert f"stopped ({REASON.format(n=2)}) at step 8/12" in (run_dir / "train.log").read_text()
    assert f"to train on: segadv-train --run-dir {run_dir} --resume auto train.early_stop.patience=<more than 2> " \
        "(or train.early_stop.monitor=null)" in caplog.text
    # keep_best: the two best evaluations, named by step and score; best.pt the single best.
    assert sorted(p.name for p in ckpts.glob("best*")) == \
        ["best.json", "best.pt", "best_step_4_mIoU_0.5000.pt", "best_step_6_mIoU_0.4500.pt"]
    assert read_checkpoint(ckpts / "best.pt")["step"] == 4
    assert [(e["step"], e["score"]) for e in last["best_kept"]["files"]] == [(4, 0.5), (6, 0.45)]

    # A stopped run stays stopped: nothing built or trained, the reason said again.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = loop.train(run_cfg(run_dir), resume="auto")
    assert (again.step, again.stopped_by) == (8, REASON.format(n=2))
    assert f"{run_dir} stopped early: step 8 of train.max_steps=12, {REASON.format(n=2)}; nothing to train" \
        in caplog.text
    assert val_steps(run_dir) == [2, 4, 6, 8] and read_status(run_dir).outcome == "stopped"

    # More patience: it trains on, and step 10's evaluation (no better than step 4's) is the third.
    result = loop.train(run_cfg(run_dir, "train.early_stop.patience=3"), resume="auto")
    assert (result.step, result.stopped_by) == (10, REASON.format(n=3))
    assert val_steps(run_dir) == [2, 4, 6, 8, 10]
    assert sorted(p.name for p in ckpts.glob("best_step_*")) == \
        ["best_step_10_mIoU_0.4800.pt", "best_step_4_mIoU_0.5000.pt"]  # step 10 pushed step 6 out


def test_the_reason_gives_the_best_best_pt_holds_and_the_counts_own_labelled_where_another():
    _, early = counted([0.5, 0.55, 0.52], min_delta=0.1)  # best.pt takes 0.55, the count waits on 0.5
    assert early.reason({"mIoU": 0.55, "step": 20}) == (
        "train.early_stop: val/mIoU did not improve by 0.1 or more for 2 evaluations (best 0.5500 at step 20, "
        "in best.pt; the count's reference is 0.5000 at step 10, its last improvement by 0.1 or more)")
    _, early = counted([0.9, 0.8, 0.85], monitor="val/pixel_acc", key="pixel_acc")
    assert early.reason({"mIoU": 0.4, "step": 30}) == (
        "train.early_stop: val/pixel_acc did not improve for 2 evaluations (best val/mIoU 0.4000 at step 30, in "
        "best.pt; the count's reference is val/pixel_acc 0.9000 at step 10, its last improvement)")
    _, early = counted([0.5, 0.4, 0.45])
    assert early.reason({"mIoU": 0.5, "step": 10}) == early.reason() == \
        "train.early_stop: val/mIoU did not improve for 2 evaluations (best 0.5000 at step 10)"
    state = early.state_dict()
    assert stopped_early(EarlyStopConfig(monitor="val/mIoU", patience=2), state, {"mIoU": 0.5, "step": 10}) == \
        early.reason()


def test_an_early_stop_under_min_delta_names_the_best_best_pt_and_status_json_hold(tmp_path, monkeypatch, caplog):
    """best.pt keeps any better score, the count an improvement by min_delta: the stop's message
    gives best.pt's best (step 4), not the count's reference (step 2) as the best."""
    scores = {2: 0.50, 4: 0.55, 6: 0.52}
    real = loop.evaluate_all
    monkeypatch.setattr(loop, "evaluate_all",
                        lambda cfg, parts, data, reporter, step: {**real(cfg, parts, data, reporter, step),
                                                                  "mIoU": scores[step]})
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        result = loop.train(run_cfg(run_dir, "train.early_stop.min_delta=0.1", "checkpoint.keep_best=null"))
    reason = ("train.early_stop: val/mIoU did not improve by 0.1 or more for 2 evaluations (best 0.5500 at step 4, "
              "in best.pt; the count's reference is 0.5000 at step 2, its last improvement by 0.1 or more)")
    assert (result.step, result.stopped_by, result.best["step"]) == (6, reason, 4)
    assert read_checkpoint(run_dir / "checkpoints" / "best.pt")["step"] == 4
    status = read_status(run_dir)
    assert (status.stopped_by, status.best.step) == (reason, 4)
    assert f"stopped ({reason}) at step 6/12" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        again = loop.train(run_cfg(run_dir, "train.early_stop.min_delta=0.1", "checkpoint.keep_best=null"),
                           resume="auto")
    assert again.stopped_by == reason
    [line] = [r.getMessage() for r in caplog.records if "stopped early" in r.getMessage()]
    assert line.count("best") == 2 and "at step 4, in best.pt" in line  # one best, and best.pt named once
