"""The time profile: every phase's time lands in that phase, the table accounts for the whole wall
time, and timing never syncs the device per step (CUDA: events read at log time)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from segadv.training.build import build_training
from segadv.monitor.profile import STEP_PHASES, PhaseTimer, RunProfile, transfer_device
from segadv.parallel import parse_device_map, unwrap
from segadv.training.loop import train

from helpers import batch

SLEEP = 0.2


def test_time_lands_in_its_phase(tiny_cfg, monkeypatch):
    """Slow down exactly one phase's work; the added time shows in that phase and no other. The
    phase timer reads a clock that only the planted slowdown moves, so the machine's own speed
    (a busy 2-core CI runner) cannot move a phase."""
    import segadv.monitor.profile as profile

    clock = {"now": 0.0}
    monkeypatch.setattr(profile, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: clock["now"])}))
    parts = build_training(tiny_cfg, parse_device_map("cpu"))
    images, labels = batch(tiny_cfg)
    parts.method.iteration(images, labels, step=0)  # first-call costs out of the way
    slowed = PhaseTimer()
    parts.method.phases = slowed
    real_step = parts.d.opt.step

    def slow_step():
        clock["now"] += SLEEP  # the step "takes" SLEEP seconds on the timer's clock
        real_step()

    monkeypatch.setattr(parts.d.opt, "step", slow_step)
    for step in range(3):
        parts.method.iteration(images, labels, step=step)
    assert set(STEP_PHASES) == set(slowed.seconds)
    assert slowed.seconds["optimizer"] == pytest.approx(3 * SLEEP)  # the slowdowns are inside the phase
    assert all(slowed.seconds[name] == 0.0 for name in STEP_PHASES if name != "optimizer"), slowed.seconds


def test_run_profile_accounts_for_the_wall_time():
    profile = RunProfile(PhaseTimer())
    with profile.host_phase("evaluation"):
        time.sleep(SLEEP)
    time.sleep(SLEEP / 2)  # in no phase
    wall, seconds = profile.table()
    assert seconds["evaluation"] >= SLEEP and seconds["other"] >= SLEEP / 2
    assert sum(seconds.values()) == pytest.approx(wall)


def test_a_finished_run_logs_the_profile_table(tiny_cfg, caplog):
    caplog.set_level("INFO", logger="segadv.training.loop")
    result = train(tiny_cfg)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    final = {k: v for r in records if r["step"] == 4 for k, v in r.items()}
    phases = [*STEP_PHASES, "data/labeled", "evaluation", "checkpoint", "logging", "other"]
    shares = {name: final[f"perf/share/{name}"] for name in phases}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert not {k for k in final if k.startswith("perf/share/")} - {f"perf/share/{n}" for n in phases}
    assert shares["g_fwd_bwd"] > 0 and shares["d_fwd_bwd"] > 0 and shares["evaluation"] > 0
    assert final["perf/time/wall"] > 0 and final["perf/peak_mem_gib/cpu"] > 0
    assert "time profile" in caplog.text and "g_fwd_bwd" in caplog.text


def test_channels_last_places_both_networks_in_nhwc(tiny_cfg):
    tiny_cfg.train.channels_last = True
    parts = build_training(tiny_cfg, parse_device_map("cpu"))
    for network in (parts.g.module, parts.d.module):
        convs = [p for p in unwrap(network).parameters() if p.dim() == 4 and p.shape[-1] > 1]
        assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)


def test_copies_are_timed_on_the_stream_that_runs_them():
    cpu, cuda0, cuda1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    assert transfer_device(cpu, cuda0) == cuda0  # host-to-device: the target's stream
    assert transfer_device(cuda1, cuda0) == cuda1  # peer copy: the source's stream
    assert transfer_device(cuda0, cpu) == cuda0
    assert transfer_device(cpu, cpu) == cpu


@pytest.mark.cuda
def test_cuda_phases_record_events_and_read_them_at_log_time():
    device = torch.device("cuda", 0)
    timer = PhaseTimer()
    x = torch.randn(2048, 2048, device=device)
    # The profiler synchronises the device when it stops: count inside the phases' own span.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("phases"):
            for _ in range(3):
                with timer.phase("g_fwd_bwd", device):
                    x = (x @ x).tanh()
    events = prof.events()
    span = next(e for e in events if e.name == "phases")
    syncs = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
    assert not [e.name for e in events
                if e.name in syncs and span.time_range.start <= e.time_range.start <= span.time_range.end]
    assert timer.seconds.get("g_fwd_bwd", 0.0) == 0.0  # nothing read yet
    timer.resolve()
    assert timer.seconds["g_fwd_bwd"] > 0
