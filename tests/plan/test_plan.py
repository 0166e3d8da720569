"""segadv-plan: segadv's own iteration dry-run on stand-in devices (docs/planning.md)."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import segadv.methods.adversarial as step_module
from conftest import needs_planner_torch
from segadv.config import load_config
from segadv.config import CONFIGS_DIR
from segadv.errors import UserError
from segadv.plan.accounting import PlacementError
from segadv.cli.plan import main
from segadv.plan.fit import MAX_BATCH_LIMIT
from segadv.methods.advsemiseg.iteration import AdvSemiSeg
from segadv.methods import method_class
from segadv.methods.supervised.iteration import Supervised
from segadv.plan.dry_run import dry_run, measure

pytestmark = needs_planner_torch

SHIPPED = sorted(p.name for p in CONFIGS_DIR.glob("*.yaml"))


def has_aux_discriminator(cfg):
    return "discriminator_aux" in method_class(cfg.method.name).networks(cfg)


AUX_D = {name for name in SHIPPED if has_aux_discriminator(load_config(CONFIGS_DIR / name))}
TEACHER = {name for name in SHIPPED
           if "teacher" in method_class(load_config(CONFIGS_DIR / name).method.name).networks(
               load_config(CONFIGS_DIR / name))}
# The configs' own architectures on small crops (a few seconds a dry run; fake tensors cost per op,
# not per pixel, so this is about the crop's effect on nothing but the figures).
SMALL_SIDE = 112  # a multiple of DeepLab's 16 and DINOv2's patch 14
SMALL_CROP = f"[{{name: Resize, height: {SMALL_SIDE}, width: {SMALL_SIDE}}}]"


def demo(*overrides):
    """The demo's config on g:1,d:0, in float32 (its amp auto would plan bf16 on these devices):
    the tests' baselines are float32 whatever the demo picks."""
    return load_config(None, ["device_map=g:1,d:0", "amp.generator.enabled=false", "amp.discriminator.enabled=false",
                              *overrides])


def small(name, *overrides):
    cfg = load_config(CONFIGS_DIR / name, [f"data.train_transforms={SMALL_CROP}", *overrides])
    if cfg.target_data is not None:
        cfg = load_config(CONFIGS_DIR / name, [f"data.train_transforms={SMALL_CROP}",
                                               f"target_data.train_transforms={SMALL_CROP}", *overrides])
    return cfg


# Each config under one of the two AMP mixes, taking turns down the sorted list: a paper config and
# its _reference variant sit next to each other, so each method is planned under both mixes.
MIXES = [("bfloat16", "float16"), ("float16", "bfloat16")]


@pytest.mark.parametrize("name,g_dtype,d_dtype", [(name, *MIXES[i % 2]) for i, name in enumerate(SHIPPED)])
def test_every_shipped_config_plans_on_two_gpus(name, g_dtype, d_dtype):
    device_map = "g:1,d:0,d_aux:2" if name in AUX_D else "g:1,d:0"
    if name in TEACHER:  # the mean teacher's EMA of G on D's card (issue 47's g:1,d:0,t:0)
        device_map += ",t:0"
    cfg = small(name, f"device_map={device_map}", "amp.generator.enabled=true", f"amp.generator.dtype={g_dtype}",
                "amp.discriminator.enabled=true", f"amp.discriminator.dtype={d_dtype}")
    plan = dry_run(cfg, steps=1)
    # G's card, then D's where the method builds a D or puts a teacher there (a UniMatch V1 run
    # without D trains G alone), then the aux D's
    besides_g = {"discriminator", "teacher"} & set(method_class(cfg.method.name).networks(cfg))
    expected = ["cuda:1"] + (["cuda:0"] if besides_g else []) + (["cuda:2"] if name in AUX_D else [])
    assert list(plan.devices) == expected
    for row in plan.devices.values():
        assert row.params_bytes > 0
        assert max(row.params_bytes, row.grads_bytes, row.optimizer_bytes, row.activations_bytes) <= row.peak_bytes
        assert row.peak_bytes <= row.params_bytes + row.grads_bytes + row.optimizer_bytes + row.activations_bytes
    g_params = sum(p.numel() for p in build_generator_of(cfg).parameters())
    assert plan.devices["cuda:1"].params_bytes >= 4 * g_params  # G's float32 weights on G's device
    assert (plan.transfer_bytes_per_iteration > 0) == bool(besides_g)  # G's maps to D, the teacher's weights


def build_generator_of(cfg):
    from segadv.models import build_generator

    with torch.device("meta"):
        return build_generator(cfg.model.generator.model_copy(update={"encoder_weights": None}),
                               cfg.data.num_classes)


def test_a_batch_the_networks_refuse_is_a_user_error():
    # Refused as segadv-train refuses it, before any network is built (segadv/data/batch_checks.py).
    with pytest.raises(UserError, match=r"data\.batch_size=1: G's BatchNorm cannot train on a batch of one sample"):
        dry_run(small("advent_gta5_cityscapes.yaml", "data.batch_size=1", "device_map=g:1,d:0"), steps=1)


def test_bf16_lowers_the_generators_peak():
    fp32 = dry_run(demo(), steps=1).devices["cuda:1"]
    bf16 = dry_run(demo("amp.generator.enabled=true"), steps=1).devices["cuda:1"]
    assert bf16.activations_bytes < 0.8 * fp32.activations_bytes
    assert bf16.peak_bytes < fp32.peak_bytes
    assert bf16.params_bytes == fp32.params_bytes  # weights stay float32 under autocast


def test_doubling_the_batch_doubles_the_activations():
    one = dry_run(demo("data.batch_size=8"), steps=2)
    two = dry_run(demo("data.batch_size=16"), steps=2)
    for device in ("cuda:1", "cuda:0"):
        ratio = two.devices[device].activations_bytes / one.devices[device].activations_bytes
        assert 1.7 <= ratio <= 2.3, (device, ratio)
        assert two.devices[device].params_bytes == one.devices[device].params_bytes


def test_accumulation_plans_the_micro_batch():
    """train.accumulation_steps=4 at batch 8: each device's activations are batch 2's (the micro-batch),
    the step's stream batch still drawn whole on the host."""
    whole = dry_run(demo("data.batch_size=8"), steps=2)
    micro = dry_run(demo("data.batch_size=8", "train.accumulation_steps=4"), steps=2)
    two = dry_run(demo("data.batch_size=2"), steps=2)
    for device in ("cuda:1", "cuda:0"):
        got, batch_2 = micro.devices[device].activations_bytes, two.devices[device].activations_bytes
        assert abs(got - batch_2) <= 0.01 * batch_2, (device, got, batch_2)
        assert got < 0.35 * whole.devices[device].activations_bytes
        assert micro.devices[device].grads_bytes == whole.devices[device].grads_bytes
        assert micro.devices[device].flops_per_iteration == whole.devices[device].flops_per_iteration  # per step


def test_activation_checkpointing_lowers_only_the_generators_activations():
    """The recompute runs in the plan's backward; G keeps its stages' and decoder's inputs only."""
    plain = dry_run(demo(), steps=2)
    checkpointed = dry_run(demo("model.generator.activation_checkpointing=true"), steps=2)
    g, g_plain = checkpointed.devices["cuda:1"], plain.devices["cuda:1"]
    assert g.activations_bytes < 0.9 * g_plain.activations_bytes  # measured 0.82: the demo's G has two stages
    assert g.peak_bytes < g_plain.peak_bytes
    assert g.params_bytes == g_plain.params_bytes and g.grads_bytes == g_plain.grads_bytes
    assert checkpointed.devices["cuda:0"].activations_bytes == plain.devices["cuda:0"].activations_bytes
    # The recompute is counted in the compute --advise ranks by (G's stages and decoder forward again).
    assert 1.1 * g_plain.flops_per_iteration < g.flops_per_iteration < 1.5 * g_plain.flops_per_iteration
    assert checkpointed.devices["cuda:0"].flops_per_iteration == plain.devices["cuda:0"].flops_per_iteration


def test_voc_plans_checkpointing_and_accumulation_within_the_issues_ratios():
    """configs/voc.yaml at its own 320 px crops, g:1,d:0: G's activations with checkpointing at most
    0.6 of without (measured 0.45), with batch 10 in 5 micro-batches at most 0.35 (measured 0.20)."""
    def g_activations(*overrides):
        cfg = load_config(CONFIGS_DIR / "voc.yaml", ["device_map=g:1,d:0", "data.batch_size=10", *overrides])
        return dry_run(cfg, steps=1).devices["cuda:1"].activations_bytes

    plain = g_activations()
    assert g_activations("model.generator.activation_checkpointing=true") <= 0.6 * plain
    assert g_activations("train.accumulation_steps=5") <= 0.35 * plain


def test_advise_ranks_settings_that_each_fit_when_planned_on_their_own(capsys):
    """A budget just under what the plain demo needs on one GPU: the first option, planned with its
    own device map and overrides, fits; the options come cheapest first; each one is a setting the
    advisor names in full."""
    from segadv.plan.fit import need

    plain = dry_run(demo("device_map=g:0,d:0"), steps=1).devices["cuda:0"]
    gib = (need("cuda:0", plain) - 2**20) / 2**30  # 1 MiB short for fp32 on one GPU with the whole batch
    assert main(["--advise", "--gpus", "2", "--gpu-memory", f"{gib:.6f}", "--steps", "1", "--json"]) == 0
    options = json.loads(capsys.readouterr().out)["options"]
    assert options
    flops = [o["flops_per_iteration"] for o in options]
    assert flops == sorted(flops)
    keys = {o.split("=")[0] for o in options[0]["overrides"]}
    assert {"amp.generator.enabled", "amp.discriminator.enabled", "model.generator.activation_checkpointing",
            "train.accumulation_steps"} <= keys
    assert not any(o["device_map"] == "g:0,d:0" and o["overrides"] == [
        "amp.generator.enabled=false", "amp.discriminator.enabled=false",
        "model.generator.activation_checkpointing=false", "train.accumulation_steps=1"] for o in options)
    first = options[0]
    assert main(["--device-map", first["device_map"], "--gpu-memory", f"{gib:.6f}", "--steps", "1", "--json",
                 *first["overrides"]]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["fits"]
    assert {name: d["need_bytes"] for name, d in alone["devices"].items()} == {
        name: d["need_bytes"] for name, d in first["devices"].items()}


def test_advise_exits_3_when_nothing_fits_and_refuses_what_it_chooses_itself(capsys):
    assert main(["--advise", "--gpus", "2", "--gpu-memory", "0.3", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["options"] == []
    for args in (["--advise", "--gpu-memory", "4"], ["--advise", "--gpus", "2"],
                 ["--advise", "--gpus", "2", "--gpu-memory", "4", "--device-map", "g:1,d:0"],
                 ["--gpus", "2", "--device-map", "g:1,d:0"]):
        assert main(args) == 2, args


def test_measure_on_cpu_agrees_with_the_plan(capfd, monkeypatch):
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    cfg = load_config(None, ["device_map=cpu"])
    plan = dry_run(cfg, steps=2)
    capfd.readouterr()
    measure(cfg, plan, steps=2)
    err = capfd.readouterr().err  # the profiler's C++ log (fd 2) too: no ERROR line on a CPU machine
    assert "ERROR" not in err and "gpuGetDeviceCount" not in err and "profiler_start" not in err, err
    row = plan.devices["cpu"]
    assert abs(row.measured_peak_bytes - row.peak_bytes) <= 0.02 * row.peak_bytes
    # The allocator holds a little more than the tensors (its own rounding, CPU kernels' scratch).
    assert row.peak_bytes <= row.allocator_peak_bytes <= 1.2 * row.peak_bytes


@pytest.mark.cuda
def test_measure_on_cuda_agrees_with_max_memory_allocated():
    cfg = load_config(None, ["device_map=cuda:0"])
    plan = dry_run(cfg, steps=2)
    measure(cfg, plan, steps=2)
    row = plan.devices["cuda:0"]
    assert abs(row.measured_peak_bytes - row.peak_bytes) <= 0.02 * row.peak_bytes
    assert abs(row.allocator_peak_bytes - row.peak_bytes) <= 0.05 * row.peak_bytes


def planted(monkeypatch, stray):
    real = step_module.masked_bce_with_logits

    def with_stray(logits, target, valid):
        return real(stray(logits), target, valid)

    monkeypatch.setattr(step_module, "masked_bce_with_logits", with_stray)


def planted_at(monkeypatch, method_cls, target_step):
    """A stray host tensor in D's GAN loss, only in the iteration at ``target_step``."""
    current = {}
    real_call = method_cls.__call__

    def call(self, streams, step):
        current["step"] = step
        return real_call(self, streams, step)

    monkeypatch.setattr(method_cls, "__call__", call)
    planted(monkeypatch, lambda t: t + torch.zeros(t.shape) if current.get("step") == target_step else t)


@pytest.mark.parametrize("method_cls, overrides, step", [
    (Supervised, (), 0),  # the first step only
    (Supervised, ("loss.adv_warmup_steps=7",), 7),  # the adversarial warm-up's end only
    (AdvSemiSeg, ("method.name=advsemiseg", "data.labeled_fraction=0.5", "method.advsemiseg.semi_start=30",
                  "method.advsemiseg.semi_start_adv=30"), 30),  # AdvSemiSeg's switch-on step only
])
def test_a_bug_in_one_schedule_regime_only_is_caught(monkeypatch, capsys, method_cls, overrides, step):
    planted_at(monkeypatch, method_cls, step)
    assert main(["--device-map", "g:1,d:0", "--steps", "1", "train.max_steps=100", *overrides]) == 2
    err = capsys.readouterr().err
    assert "made a tensor of shape" in err and "segadv/methods/adversarial.py:" in err and "Traceback" not in err


def test_the_plan_runs_every_regime_and_names_the_step_of_each_peak(capsys):
    assert main(["--config", "semi", "--device-map", "g:1,d:0", "--json", "--steps", "1",
                 "method.advsemiseg.semi_start=30", "method.advsemiseg.semi_start_adv=20", "train.max_steps=100"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["steps_run"][:3] == [0, 20, 30] and data["steps_run"][-1] == 99
    assert all(entry["peak_step"] in data["steps_run"] for entry in data["devices"].values())


def test_a_method_without_a_d_places_none(monkeypatch, capsys):
    """MinEnt trains G alone: the d the map names holds nothing and has no row. Planted bug: a
    method that declares G alone but builds a D on the map's d is caught (a row for cuda:0)."""
    argv = ["--config", "uda", "method.name=minent", "--device-map", "g:1,d:0", "--json", "--steps", "1"]
    assert main(argv) == 0
    assert list(json.loads(capsys.readouterr().out)["devices"]) == ["cuda:1"]
    minent = method_class("minent")
    monkeypatch.setattr(minent, "networks", classmethod(lambda cls, cfg: ("generator", "discriminator")))
    assert main(argv) == 0
    assert set(json.loads(capsys.readouterr().out)["devices"]) == {"cuda:1", "cuda:0"}


def test_the_evaluation_is_planned_with_its_own_peak(capsys):
    assert main(["--config", "semi", "--device-map", "g:1,d:0", "--json", "--steps", "1"]) == 0
    devices = json.loads(capsys.readouterr().out)["devices"]
    g, d = devices["cuda:1"], devices["cuda:0"]
    # G at data.val_batch_size 25 (80 px) holds more than its weights; D runs the method's panel.
    assert g["evaluation_peak_bytes"] > g["params_bytes"] + g["grads_bytes"] + g["optimizer_bytes"]
    assert d["evaluation_peak_bytes"] > d["params_bytes"] + d["grads_bytes"] + d["optimizer_bytes"]
    assert g["need_bytes"] >= max(g["peak_bytes"], g["evaluation_peak_bytes"])


def test_a_placement_bug_in_evaluate_is_caught(monkeypatch, capsys):
    """The labels left on the host in evaluate: its confusion-matrix update mixes devices."""
    import segadv.engine.evaluate as evaluate_module

    real = evaluate_module.to_device
    monkeypatch.setattr(evaluate_module, "to_device",
                        lambda t, device: t if t.dtype == torch.int64 else real(t, device))
    assert main(["--device-map", "g:1,d:0", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "mixes devices cpu, cuda:1" in err and "segadv/engine/evaluate.py:" in err and "Traceback" not in err


def test_a_save_and_a_resume_are_planned(capsys):
    assert main(["--device-map", "g:1,d:0", "--json", "--steps", "1", "amp.generator.enabled=true",
                 "amp.generator.dtype=float16"]) == 0  # G's GradScaler saved and loaded too
    g = json.loads(capsys.readouterr().out)["devices"]["cuda:1"]
    # The resume's optimizer state is made anew on G's device beside its weights.
    assert g["checkpoint_peak_bytes"] >= g["params_bytes"] + g["optimizer_bytes"]


def test_a_resume_that_loads_onto_an_unmapped_gpu_is_caught(monkeypatch, capsys):
    """Seed 004's bug: a checkpoint's tensors put on cuda:0 (torch.load without map_location) while
    the map names cuda:1 and cuda:2."""
    from segadv.checkpoint.state import NetworkWeights

    real = NetworkWeights.load_state_dict
    monkeypatch.setattr(NetworkWeights, "load_state_dict",
                        lambda self, state: real(self, {k: v.to("cuda:0") for k, v in state.items()}))
    assert main(["--device-map", "g:1,d:2", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "on cuda:0, which the device map does not name (cuda:1, cuda:2)" in err and "Traceback" not in err


@pytest.mark.parametrize("profile", [False, True])
def test_the_cuda_only_paths_run_on_the_stand_in(monkeypatch, profile):
    """activate() makes G's device current, PhaseTimer records events on its streams (or, with
    train.profile, synchronises), the checkpoint captures each device's generator state: on the
    stand-in's torch.cuda facade, as on a GPU."""
    from segadv.plan import standin

    calls = []
    facade = standin.FACADE
    monkeypatch.setattr(standin.StandInEvent, "record", lambda self, stream=None: calls.append("event"))
    real_sync, real_rng = facade.synchronize, facade.get_rng_state
    monkeypatch.setattr(facade, "synchronize", lambda device=None: calls.append("sync") or real_sync(device))
    monkeypatch.setattr(facade, "get_rng_state",
                        lambda device=None: calls.append(f"rng {device}") or real_rng(device))
    dry_run(demo("device_map=g:3,d:1", f"train.profile={str(profile).lower()}"), steps=1)
    assert facade.current_device() == 3  # activate(): G's device
    assert ("sync" if profile else "event") in calls
    assert {"rng standin:3", "rng standin:1"} <= set(calls)


def test_a_stray_default_device_tensor_is_caught(monkeypatch):
    planted(monkeypatch, lambda logits: logits + torch.zeros(logits.shape))  # the default device: the CPU
    with pytest.raises(PlacementError) as caught:
        dry_run(demo(), steps=1)
    message = str(caught.value)
    assert "aten.zeros.default" in message and "on cpu" in message
    assert "segadv/methods/adversarial.py:" in message and "masked_bce_with_logits(" in message


def test_a_hard_coded_cuda_device_is_caught(monkeypatch):
    planted(monkeypatch, lambda logits: logits.to("cuda:0"))
    with pytest.raises(PlacementError) as caught:
        dry_run(demo("device_map=g:1,d:2"), steps=1)
    message = str(caught.value)
    assert "aten._to_copy.default" in message and "on cuda:0, which the device map does not name (cuda:1, cuda:2)" in message
    assert "segadv/methods/adversarial.py:" in message


@pytest.mark.parametrize("stray", [lambda t: t.cuda(), lambda t: t.to("cuda"),
                                   lambda t: t + torch.zeros(t.shape, device="cuda")])
def test_cuda_without_an_index_resolves_to_the_current_device_as_on_a_gpu(monkeypatch, stray):
    """On D's side of g:1,d:0 a bare "cuda" is G's device (activate() made it current): D's maps
    then meet D's mask on cuda:0, a finding naming the file; where D shares G's device it is right."""
    planted(monkeypatch, stray)
    with pytest.raises(PlacementError, match=r"mixes devices cuda:0, cuda:1\n  at segadv/") as caught:
        dry_run(demo("device_map=g:1,d:0"), steps=1)
    assert "Traceback" not in str(caught.value)
    dry_run(demo("device_map=g:1,d:1"), steps=1)  # the same code is correct there


def test_cuda_on_the_maps_d_receives_is_caught(monkeypatch, capsys):
    """G's maps handed to D with a bare .cuda() (G's device on a GPU) instead of D's device."""
    import segadv.methods.supervised.iteration as supervised

    monkeypatch.setattr(supervised, "hand_over", lambda phases, maps, source, target: maps.cuda())
    assert main(["--device-map", "g:1,d:0", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "mixes devices cuda:0, cuda:1" in err and "segadv/" in err and "Traceback" not in err
    assert main(["--device-map", "g:1,d:1", "--steps", "1"]) == 0  # one GPU for both: .cuda() is right


def test_cpu_index_tensors_are_accepted_as_cuda_accepts_them(monkeypatch):
    planted(monkeypatch, lambda t: t[torch.arange(t.shape[0])])
    dry_run(demo(), steps=1)


def test_a_host_read_in_the_iteration_is_a_finding(monkeypatch, capsys):
    def read(t):
        float(t.mean())
        return t

    planted(monkeypatch, read)
    assert main(["--device-map", "g:1,d:0", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "host read" in err and "segadv/methods/adversarial.py:" in err and "Traceback" not in err


def test_an_op_mixing_devices_is_caught(monkeypatch):
    # D's logits moved to G's device, then met with D's validity mask: the ops mix devices.
    planted(monkeypatch, lambda logits: logits.to(torch.device("standin", 1)))
    with pytest.raises(PlacementError, match=r"mixes devices cuda:0, cuda:1"):
        dry_run(demo(), steps=1)


def test_replica_sets_are_refused_with_the_replica_to_plan():
    with pytest.raises(UserError, match=r"g:cuda:1\+cuda:2 is a DataParallel replica set.*g:cuda:1"):
        dry_run(demo("device_map=g:1+2,d:0"), steps=1)


def test_cli_exit_codes_and_json(capsys, caplog):
    assert main(["--device-map", "g:1,d:0", "--gpu-memory", "24"]) == 0
    text = capsys.readouterr().out
    assert "cuda:1" in text and "cuda:0" in text and "allowance per CUDA device (assumed" in text
    assert main(["--device-map", "g:1,d:0", "--gpu-memory", "0.5", "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert list(data["devices"]) == ["cuda:1", "cuda:0"] and data["fits"] is False
    assert data["devices"]["cuda:1"]["fits"] is False
    assert "cuda:1 does not fit in 0.50 GiB" in caplog.text
    for entry in data["devices"].values():
        assert set(entry) >= {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes",
                              "fits"}
    assert main(["--max-batch"]) == 2
    assert main(["--device-map", "g:1+2,d:0"]) == 2


def test_max_batch_is_the_largest_that_fits(capsys):
    assert main(["--device-map", "g:1,d:0", "--gpu-memory", "0.9", "--max-batch", "--json", "--steps", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    best = data["max_batch"]
    assert best and data["fits"]
    assert main(["--device-map", "g:1,d:0", "--gpu-memory", "0.9", "--json", "--steps", "1",
                 f"data.batch_size={best + 1}"]) == 3


def test_max_batch_with_accumulation_searches_multiples_of_the_micro_batch_count(capsys):
    args = ["--device-map", "g:1,d:0", "--gpu-memory", "0.9", "--max-batch", "--json", "--steps", "1"]
    assert main([*args, "train.accumulation_steps=4"]) == 0
    best = json.loads(capsys.readouterr().out)["max_batch"]
    assert best and best % 4 == 0
    assert main(["--device-map", "g:1,d:0", "--gpu-memory", "0.9", "--json", "--steps", "1",
                 f"data.batch_size={best + 4}", "train.accumulation_steps=4"]) == 3


@pytest.mark.parametrize("args", [["--device-map", "g:1,d:256"], ["--device-map", "g:²,d:0"],
                                  ["--device-map", "g:1,d:0", "--gpu-memory", "nan"],
                                  ["--device-map", "g:1,d:0", "--gpu-memory", "inf"]])
def test_out_of_range_indices_and_non_finite_memory_are_user_errors(args):
    assert main(args) == 2


def test_max_batch_exits_3_when_nothing_fits_and_never_reports_a_batch_that_cannot_train(capsys, caplog):
    """At 0.5 GiB not even batch 1 fits the demo, and batch 1 cannot train (BatchNorm over one
    value per channel in the ASPP pooling): exit 3 with the configured batch's shortfall."""
    assert main(["--device-map", "g:1,d:0", "--gpu-memory", "0.5", "--max-batch", "--json", "--steps", "1"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["max_batch"] is None and data["fits"] is False
    assert "does not fit in 0.50 GiB at data.batch_size 8" in caplog.text


def test_max_batch_at_the_search_cap_is_a_lower_bound(capsys):
    assert main(["--device-map", "g:1,d:0", "--gpu-memory", "4000", "--max-batch", "--json", "--steps", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_batch"] == MAX_BATCH_LIMIT and data["max_batch_is_lower_bound"] is True


def test_dataparallel_on_one_device_is_planned_unwrapped_with_a_note(capsys):
    assert main(["--device-map", "g:1,d:0", "--steps", "1", "parallel.generator=dp"]) == 0
    assert "note: parallel.generator=dp on one device (cuda:1)" in capsys.readouterr().out


def test_no_message_names_the_stand_in(capsys, caplog):
    caplog.set_level(logging.INFO)
    assert main(["--device-map", "g:1,d:0,d_aux:2", "--steps", "1"]) == 2
    assert main(["--device-map", "g:1,d:0", "--steps", "1"]) == 0
    out = capsys.readouterr()
    assert "standin" not in caplog.text + out.out + out.err


def test_voc_plans_without_voc_or_weights():
    """configs/voc.yaml (DeepLabV3+/ResNet-101, batch 10, 320 px) as segadv-plan runs it: no data
    files, no ImageNet weights; under a minute on a 2-core CPU."""
    result = subprocess.run(
        [sys.executable, "-m", "segadv.cli.plan", "--config", str(CONFIGS_DIR / "voc.yaml"), "--device-map",
         "g:1,d:0", "--gpu-memory", "1", "--json"], capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).parent)
    assert result.returncode == 3, result.stderr
    data = json.loads(result.stdout)
    assert list(data["devices"]) == ["cuda:1", "cuda:0"]
    g = data["devices"]["cuda:1"]
    assert 3.0 * 2**30 < g["peak_bytes"] < 5.0 * 2**30 and g["fits"] is False
    assert "cuda:1 does not fit in 1.00 GiB" in result.stderr


def test_the_confidence_diagnostics_images_are_planned_on_the_host():
    """AdvSemiSeg on synthetic data holds log.diagnostic_images unlabeled images and their masks
    for the whole run (diag/d_confidence_auroc): the plan's host row counts them."""
    cfg = small("semi.yaml", "device_map=cpu", "data.synthetic.image_size=64")
    with_diag, without = (dry_run(cfg.model_copy(update={"log": cfg.log.model_copy(update={"diagnostic_images": n})}),
                                  steps=1) for n in (16, 0))
    size = SMALL_SIDE  # the images come through the training pipeline: SMALL_CROP's Resize
    assert with_diag.devices["cpu"].peak_bytes - without.devices["cpu"].peak_bytes == 16 * (3 * size * size * 4 + size * size * 8)


def test_advise_offers_micro_batches_of_one_only_where_g_trains_on_one():
    """DeepLabV3+'s image pooling cannot train BatchNorm on one sample; frozen BatchNorm and
    DeepLab-v2 (no pooling) can."""
    from segadv.plan.advise import accumulation_choices

    assert accumulation_choices(demo("data.batch_size=4")) == [1, 2]
    assert accumulation_choices(demo("data.batch_size=4", "model.generator.norm=frozen")) == [1, 2, 4]
    assert accumulation_choices(demo("data.batch_size=4", "model.generator.arch=deeplabv2")) == [1, 2, 4]
    assert accumulation_choices(demo("data.batch_size=4", "model.generator.norm=frozen_affine")) == [1, 2]


def test_frozen_batchnorm_is_planned_at_batch_one_without_its_affine_state():
    """norm: frozen trains the demo's DeepLabV3+ at batch 1 (its pooling BatchNorm in eval mode),
    and BatchNorm's weight and bias take neither gradients nor optimizer state."""
    plain = dry_run(demo("data.batch_size=2"), steps=2).devices["cuda:1"]
    frozen = dry_run(demo("data.batch_size=2", "model.generator.norm=frozen"), steps=2).devices["cuda:1"]
    assert frozen.params_bytes == plain.params_bytes
    assert frozen.grads_bytes < plain.grads_bytes and frozen.optimizer_bytes < plain.optimizer_bytes
    dry_run(demo("data.batch_size=1", "model.generator.norm=frozen"), steps=1)
    dry_run(demo("data.batch_size=1", "model.generator.arch=deeplabv2", "model.generator.norm=frozen_affine"), steps=1)
    with pytest.raises(UserError, match="G.s BatchNorm cannot train on a batch of one sample"):
        dry_run(demo("data.batch_size=1"), steps=1)


def test_the_label_free_scores_are_planned_and_d_reading_g_devices_maps_is_caught(monkeypatch):
    """The evaluation of a run with target images adds the proxies' passes, D's among them: G's
    maps cross to D's device (segadv/methods/adversarial.py ``realness``). Planted: a D view that
    does not move them."""
    import segadv.methods.domain_adaptation.iteration as adaptation

    cfg = load_config("uda", ["device_map=g:1,d:0", "model.generator.aux_head=false"])
    planned = dry_run(cfg, steps=1).devices
    with monkeypatch.context() as patched:
        patched.setattr(method_class("adaptsegnet"), "reads_unlabeled", classmethod(lambda cls, cfg: False))
        without = dry_run(cfg, steps=1).devices
    # D's score runs D in the evaluation, G's two more passes (the mirror, the smaller image) add to G's.
    assert planned["cuda:0"].evaluation_peak_bytes > without["cuda:0"].evaluation_peak_bytes
    assert planned["cuda:1"].evaluation_peak_bytes >= without["cuda:1"].evaluation_peak_bytes

    def unmoved(d, maps, labels):
        with d.opt.autocast():
            return torch.sigmoid(d.bare(maps).float())

    monkeypatch.setattr(adaptation, "realness", unmoved)
    with pytest.raises(PlacementError, match="aten.convolution.default mixes devices cuda:0, cuda:1"):
        dry_run(cfg, steps=1)
