"""``amp.<network>.enabled: auto`` (issue 52): bf16 where the network's device computes bf16
natively (a CUDA device of compute capability 8.0+, a CPU with AMX-BF16 or AVX512-BF16), else off;
resolved once per role where the roles are built, with one log line per network; planned by
segadv-plan; and a run it resolves to bf16 is held to the float32 loop as the equivalence harness
holds bf16 (tests/integration/test_equivalence.py)."""

import dataclasses
import importlib.util
import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from segadv.config import load_config
from segadv.config.schema import NetworkAmpConfig
from segadv.engine import amp_optimizer
from segadv.engine.amp_optimizer import cpu_bf16_features, resolve_auto, uses_float16
from segadv.parallel import distributed, parse_device_map
from segadv.training import build
from segadv.training.build import build_training, network_roles
from segadv.training.checks import check_build

AUTO = NetworkAmpConfig(enabled="auto")
BOTH_AUTO = ("amp.generator.enabled=auto", "amp.discriminator.enabled=auto")
CPU = (torch.device("cpu"),)


@pytest.fixture
def cpu_flags(monkeypatch):
    """Set the CPU's native bf16 instruction sets the detection reports, with oneDNN uncapped (the
    ISA subset of `make test-isa` caps the process's own oneDNN; the rule is tested apart)."""
    def set_flags(*flags):
        monkeypatch.setattr(amp_optimizer, "cpu_bf16_features", lambda: tuple(flags))
        monkeypatch.setattr(amp_optimizer, "onednn_isa_cap", lambda: None)
    return set_flags


@pytest.fixture
def cuda_capability(monkeypatch):
    def set_capability(major, minor):
        monkeypatch.setattr(amp_optimizer, "cuda_capability", lambda device: (major, minor))
    return set_capability


# ----------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("flags", [("avx512_bf16",), ("amx_bf16",), ("amx_bf16", "avx512_bf16")])
def test_auto_is_bf16_on_a_cpu_with_native_bf16(cpu_flags, flags):
    cpu_flags(*flags)
    amp, why = resolve_auto(AUTO, CPU)
    assert amp.enabled is True and amp.dtype == "bfloat16" and not uses_float16(amp)
    assert why == f"CPU with {' and '.join(flags)}"


def test_auto_is_off_on_a_cpu_without_native_bf16(cpu_flags):
    cpu_flags()
    amp, why = resolve_auto(AUTO, CPU)
    assert amp.enabled is False
    assert why.startswith("CPU without native bf16") and "5-8x slower" in why


@pytest.mark.parametrize("cap, flags, native", [
    ("AVX2", ("avx512_bf16",), ()), ("SSE41", ("amx_bf16", "avx512_bf16"), ()),
    ("AVX512_CORE_BF16", ("amx_bf16", "avx512_bf16"), ("avx512_bf16",)), ("avx512_core_amx", ("amx_bf16",), ("amx_bf16",)),
    ("DEFAULT", ("avx512_bf16",), ("avx512_bf16",)), ("NOT_AN_ISA", ("avx512_bf16",), ("avx512_bf16",))])
def test_auto_follows_the_isa_onednn_is_capped_at(monkeypatch, cap, flags, native):
    """ONEDNN_MAX_CPU_ISA below a CPU's native bf16 makes oneDNN emulate it: auto stays float32 and
    says why; a cap at or above it (or one oneDNN ignores) leaves the choice to the CPU."""
    monkeypatch.setattr(amp_optimizer, "cpu_bf16_features", lambda: flags)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    amp, why = resolve_auto(AUTO, CPU)
    assert amp.enabled is bool(native)
    if native:
        assert why.startswith(f"CPU with {' and '.join(native)}")
    else:
        assert why == (f"CPU with {' and '.join(flags)}, but ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN's kernels "
                       "below them: bf16 runs emulated there, 5-8x slower")
    assert amp_optimizer.onednn_isa_cap({"DNNL_MAX_CPU_ISA": "avx2"}) == "AVX2"  # oneDNN's older name


@pytest.mark.parametrize("capability, native", [((8, 0), True), ((9, 0), True), ((7, 5), False), ((6, 1), False)])
def test_auto_on_cuda_follows_the_compute_capability(cuda_capability, capability, native):
    cuda_capability(*capability)
    amp, why = resolve_auto(AUTO, (torch.device("cuda", 1),))
    assert amp.enabled is native and amp.dtype == "bfloat16"
    assert why.startswith(f"cuda:1: CUDA compute capability {capability[0]}.{capability[1]}")


def test_a_replica_set_is_bf16_only_where_every_replica_is(cuda_capability, monkeypatch):
    monkeypatch.setattr(amp_optimizer, "cuda_capability", lambda device: (8, 6) if device.index == 0 else (7, 0))
    amp, why = resolve_auto(AUTO, (torch.device("cuda", 0), torch.device("cuda", 1)))
    assert amp.enabled is False and why == "cuda:1: CUDA compute capability 7.0 < 8.0 emulates bf16"


def test_an_unknown_device_type_stays_float32():
    amp, why = resolve_auto(AUTO, (torch.device("meta"),))
    assert amp.enabled is False and "no rule for meta" in why


@pytest.mark.parametrize("amp", [NetworkAmpConfig(), NetworkAmpConfig(enabled=True),
                                 NetworkAmpConfig(enabled=True, dtype="float16")])
def test_an_explicit_setting_is_left_as_it_is(cpu_flags, amp):
    cpu_flags("avx512_bf16")
    assert resolve_auto(amp, CPU)[0] is amp


def test_the_cpu_flags_are_read_from_cpuinfo(monkeypatch):
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: False, raising=False)
    text = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f {}\nbugs\t\t: spectre_v1\n"
    assert cpu_bf16_features(text.format("avx512_bf16 amx_tile")) == ("avx512_bf16",)
    assert cpu_bf16_features(text.format("amx_bf16 amx_tile avx512_bf16")) == ("amx_bf16", "avx512_bf16")
    assert cpu_bf16_features(text.format("avx512_vnni")) == ()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert cpu_bf16_features(text.format("")) == ("avx512_bf16",)  # torch's own probe counts too


# ----------------------------------------------------------------------------- the schema


def test_the_schema_takes_true_false_and_auto():
    cfg = load_config(None, ["amp.generator.enabled=auto", "amp.discriminator.enabled=true"])
    assert cfg.amp.generator.enabled == "auto" and cfg.amp.discriminator.enabled is True
    demo = load_config(None, [])  # the demo picks per machine; the schema's default stays float32
    assert demo.amp.generator.enabled == "auto" and demo.amp.discriminator.enabled == "auto"
    from segadv.config.schema import NetworkAmpConfig

    assert NetworkAmpConfig().enabled is False


def test_auto_with_float16_exits_2_naming_the_key(capsys):
    from segadv.cli.train import main

    assert main(["amp.discriminator.enabled=auto", "amp.discriminator.dtype=float16"]) == 2
    err = capsys.readouterr().err
    assert "amp.discriminator" in err and "never float16" in err


# ----------------------------------------------------------------------------- the build


def test_auto_is_resolved_once_per_role_and_logged(tiny_cfg, cpu_flags, caplog, monkeypatch):
    for key, value in (("generator", "auto"), ("discriminator", "auto")):
        setattr(getattr(tiny_cfg.amp, key), "enabled", value)
    agreed = []
    monkeypatch.setattr(build, "check_ranks_agree", lambda facts, hint="": agreed.append(facts))
    device_map = parse_device_map("cpu")
    cpu_flags("avx512_bf16")
    with caplog.at_level(logging.INFO, logger="segadv.training.build"):
        roles = network_roles(tiny_cfg, device_map, distributed.DistEnv(), check_build(tiny_cfg, device_map))
    assert [r.settings.amp.enabled for r in roles] == [True, True]
    assert all(r.settings.amp.dtype == "bfloat16" and r.loss_scaling in (False, None) for r in roles)
    lines = [r.getMessage() for r in caplog.records if "auto ->" in r.getMessage()]
    assert lines == ["amp.generator: auto -> bf16 (CPU with avx512_bf16)",
                     "amp.discriminator: auto -> bf16 (CPU with avx512_bf16)"]
    assert agreed == [{"amp.generator.enabled: auto": "bf16", "amp.discriminator.enabled: auto": "bf16"}]
    assert tiny_cfg.amp.generator.enabled == "auto"  # the config (and so the checkpoint's) keeps auto

    caplog.clear()
    cpu_flags()
    with caplog.at_level(logging.INFO, logger="segadv.training.build"):
        parts = build_training(tiny_cfg, device_map)
    assert [net.opt.autocast_enabled for net in parts.networks()] == [False, False]
    lines = [r.getMessage() for r in caplog.records if "auto ->" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("amp.generator: auto -> off (CPU without native bf16")


def test_no_line_and_no_rank_check_without_auto(tiny_cfg, caplog, monkeypatch):
    agreed = []
    monkeypatch.setattr(build, "check_ranks_agree", lambda facts, hint="": agreed.append(facts))
    device_map = parse_device_map("cpu")
    with caplog.at_level(logging.INFO, logger="segadv.training.build"):
        network_roles(tiny_cfg, device_map, distributed.DistEnv(), check_build(tiny_cfg, device_map))
    assert agreed == [] and not [r for r in caplog.records if "auto ->" in r.getMessage()]


# ----------------------------------------------------------------------------- the plan


def plan_text(capsys, *argv) -> tuple[str, dict]:
    from segadv.cli.plan import main

    assert main(["--steps", "1", *argv]) == 0
    text = capsys.readouterr().out
    assert main(["--steps", "1", "--json", *argv]) == 0
    return text, json.loads(capsys.readouterr().out)


@pytest.mark.slow  # segadv-plan, as tests/plan/: its stand-in devices need a newer torch than the floor
def test_the_plan_plans_auto_as_bf16_on_a_cuda_map_and_says_so(capsys, monkeypatch):
    monkeypatch.setattr(amp_optimizer, "cuda_capability", lambda device: pytest.fail("a planned GPU is not asked"))
    text, auto = plan_text(capsys, "--device-map", "g:1,d:0", *BOTH_AUTO)
    assert "note: amp.generator: auto -> bf16 (cuda:1 planned as a GPU with bf16 tensor cores" in text
    assert "note: amp.discriminator: auto -> bf16 (cuda:0 planned as a GPU with bf16 tensor cores" in text
    assert "Ampere or newer" in text
    _, explicit = plan_text(capsys, "--device-map", "g:1,d:0", "amp.generator.enabled=true",
                            "amp.discriminator.enabled=true")
    assert auto["devices"] == explicit["devices"]  # planned as the bf16 run it resolves to


@pytest.mark.slow  # segadv-plan, as above
@pytest.mark.parametrize("flags, chosen", [(("avx512_bf16",), "bf16 (CPU with avx512_bf16)"),
                                           ((), "off (CPU without native bf16")])
def test_the_plan_of_a_cpu_map_is_what_this_cpu_gives(capsys, cpu_flags, flags, chosen):
    cpu_flags(*flags)
    from segadv.cli.plan import main

    assert main(["--steps", "1", "--device-map", "cpu", "amp.generator.enabled=auto"]) == 0
    assert f"note: amp.generator: auto -> {chosen}" in capsys.readouterr().out


# ----------------------------------------------------------------------------- equivalence


def equivalence_harness():
    """tests/integration/test_equivalence.py as a module: its harness and its bf16 tolerance."""
    name = "segadv_equivalence_harness"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "integration" / "test_equivalence.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def resolved_case(harness, name: str, overrides: tuple[str, ...], float32: bool):
    """A harness case whose overrides say auto, run as what auto resolves to (the harness reads a
    case's precision from ``enabled=true`` in its overrides; bf16 cases run on frozen BatchNorm
    statistics, which its docstring explains)."""
    cls = type("ResolvedCase", (harness.Case,), {"float32": property(lambda self: float32)})
    return dataclasses.dataclass(frozen=True)(cls)(name, overrides=overrides)


def test_an_auto_run_resolved_to_bf16_is_held_to_the_float32_loop(cpu_flags):
    """On a CPU patched to report avx512_bf16, auto is the explicit both-bf16 case of the harness:
    the same step, and within its bf16 tolerance (cosine >= AMP_MIN_COSINE) of the float32 loop."""
    harness = equivalence_harness()
    cpu_flags("avx512_bf16")
    both_bf16 = harness.Case("both-bf16", overrides=(*harness.amp("generator", "bfloat16"),
                                                     *harness.amp("discriminator", "bfloat16")))
    auto = resolved_case(harness, "both-auto", BOTH_AUTO, float32=False)
    reference = harness.reference_outcome(both_bf16.freeze_stats, both_bf16.model_overrides)
    got = harness.segadv_outcome(auto)
    cos = harness.assert_equivalent(both_bf16, got, reference)  # compared as the bf16 case: by cosine
    assert harness.AMP_MIN_COSINE == 0.99 and min(cos.values()) >= harness.AMP_MIN_COSINE
    explicit = harness.segadv_outcome(both_bf16)
    for a, b in ((got.g_update, explicit.g_update), (got.d_update, explicit.d_update)):
        assert all(torch.equal(a[k], b[k]) for k in a)
    # and where the CPU has no native bf16 it is the float32 case, held to float32's tolerance
    cpu_flags()
    plain = harness.Case("cpu")
    off = resolved_case(harness, "auto-off", BOTH_AUTO, float32=True)
    worst = harness.assert_equivalent(plain, harness.segadv_outcome(off), harness.reference_outcome(
        plain.freeze_stats, plain.model_overrides))
    assert max(worst.values()) <= harness.FP32_RTOL
