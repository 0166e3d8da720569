"""Whether a plan fits and the largest batch that does (segadv/plan/fit.py), and the report of a
plan (segadv/plan/report.py), on plans made by hand: no dry run, no argparse."""

import pytest

from segadv.config import load_config
from segadv.plan import dry_run as dry_run_module
from segadv.plan.dry_run import DevicePlan, Plan
from segadv.plan.fit import (ALLOWANCE_TEXT, CONTEXT_BYTES, GiB, MAX_BATCH_LIMIT, MiB, allowance, largest_batch, need, peak_of_run,
                             shortfalls, with_batch)
from segadv.plan.report import advice_table, max_batch_text, plan_json, plan_table


def row(device, peak, evaluation=0, checkpoint=0):
    return DevicePlan(device, params_bytes=peak // 4, grads_bytes=peak // 4, optimizer_bytes=peak // 4,
                      activations_bytes=peak // 4, peak_bytes=peak, peak_step=1, evaluation_peak_bytes=evaluation,
                      checkpoint_peak_bytes=checkpoint)


def plan(**peaks):
    return Plan({name.replace("_", ":"): row(name.replace("_", ":"), peak) for name, peak in peaks.items()},
                transfer_bytes_per_iteration=3 * MiB, host_to_device_bytes_per_iteration=MiB, steps=2, seconds=0.5,
                steps_run=[1, 2])


def test_a_cuda_devices_need_is_its_run_peak_plus_the_allowance_and_the_host_is_not_budgeted():
    assert peak_of_run(row("cuda:0", 100, evaluation=300, checkpoint=200)) == 300
    assert allowance("cpu", GiB) == 0
    assert allowance("cuda:0", GiB) == CONTEXT_BYTES + GiB // 10
    assert need("cuda:0", row("cuda:0", GiB)) == GiB + CONTEXT_BYTES + GiB // 10
    # the 10% is of the largest of the three peaks, as the legend says: here the evaluation's
    assert need("cuda:0", row("cuda:0", GiB, evaluation=2 * GiB)) == 2 * GiB + CONTEXT_BYTES + 2 * GiB // 10
    assert "10% of the largest of the training, evaluation and checkpoint peaks" in ALLOWANCE_TEXT
    p = plan(cuda_0=GiB, cuda_1=3 * GiB, cpu=50 * GiB)
    assert shortfalls(p, None) == {}
    assert shortfalls(p, 2 * GiB) == {"cuda:1": need("cuda:1", p.devices["cuda:1"]) - 2 * GiB}


def test_the_report_says_which_device_fits():
    p = plan(cuda_0=GiB, cuda_1=3 * GiB, cpu=GiB)
    data = plan_json(p, 2 * GiB, None, searched=False)
    assert data["fits"] is False and "max_batch" not in data
    assert [data["devices"][d]["fits"] for d in ("cuda:0", "cuda:1", "cpu")] == [True, False, True]
    assert data["devices"]["cuda:1"]["need_bytes"] == need("cuda:1", p.devices["cuda:1"])
    lines = plan_table(p, 2 * GiB).splitlines()
    assert "fits 2.00 GiB" in lines[0]
    assert [line.split()[-1] for line in lines[1:4]] == ["yes", "no", "(host)"]
    assert plan_json(p, None, MAX_BATCH_LIMIT, searched=True)["max_batch_is_lower_bound"] is True
    assert max_batch_text(MAX_BATCH_LIMIT) == f"at least {MAX_BATCH_LIMIT} (the search's cap)"
    assert max_batch_text(12) == "12"
    assert advice_table([], 2, 8 * GiB).splitlines()[1] == "none"


@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_largest_batch_is_the_last_that_fits_and_a_multiple_of_the_accumulation(monkeypatch, accumulation):
    """A need affine in the batch (1 GiB + 0.1 GiB a sample): the search lands on the last fit."""
    runs = []

    def fake_dry_run(cfg, steps, world_size=1):
        runs.append(cfg.data.batch_size)
        return plan(cuda_0=GiB + cfg.data.batch_size * GiB // 10)

    monkeypatch.setattr(dry_run_module, "dry_run", fake_dry_run)
    cfg = load_config(None, ["data.batch_size=4", f"train.accumulation_steps={accumulation}"])
    budget = 8 * GiB
    batch, found = largest_batch(cfg, 1, budget)
    assert batch % accumulation == 0 and not shortfalls(found, budget)
    assert shortfalls(fake_dry_run(with_batch(cfg, batch + accumulation), 1), budget)
    assert len(runs) < 12  # the line fit, not a walk
    monkeypatch.setattr(dry_run_module, "dry_run", lambda cfg, steps, world_size=1: plan(cuda_0=100 * GiB))
    assert largest_batch(cfg, 1, budget) == (None, None)
