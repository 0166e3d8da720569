"""tools/bench.py: one named figure per line, a breakdown inside the step it breaks down, and
bad counts answered with exit 2."""

import pytest

from conftest import TINY_OVERRIDES, load_tool
from segadv.monitor.profile import STEP_PHASES

bench = load_tool("bench")


def figures(out: str) -> dict[str, float]:
    """``name value [unit] [# note]`` lines (the format scripts read) -> {name: value}."""
    parsed = {}
    for line in out.splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.split()[:2]
        parsed[name] = float(value)
    return parsed


@pytest.mark.usefixtures("one_torch_thread")
def test_ratio_and_breakdown_figures_without_warmup(capsys):
    # --warmup 0 used to divide by zero steps.
    args = ["--no-variants", "--steps", "2", "--rounds", "1", "--warmup", "0",
            "--device-map", "g:cpu,d:cpu", *TINY_OVERRIDES]
    assert bench.main(args) == 0
    found = figures(capsys.readouterr().out)
    expected = {"bare/ms_per_step", "segadv/ms_per_step", "ratio", "flops/gflop_per_step", "flops/segadv_tflops"} | {
        f"breakdown/{p}/ms_per_step" for p in STEP_PHASES}
    assert set(found) == expected
    assert found["flops/gflop_per_step"] > 0
    # The figures print 4 significant digits.
    assert found["ratio"] == pytest.approx(found["bare/ms_per_step"] / found["segadv/ms_per_step"], rel=1e-3)
    # The phases are timed inside segadv's step: together they cannot take longer than it.
    breakdown = sum(found[f"breakdown/{p}/ms_per_step"] for p in STEP_PHASES)
    assert 0 < breakdown <= found["segadv/ms_per_step"] * 1.01
    assert found["breakdown/g_fwd_bwd/ms_per_step"] > 0 and found["breakdown/d_fwd_bwd/ms_per_step"] > 0


@pytest.mark.parametrize("flag,value", [("--steps", "0"), ("--rounds", "0"), ("--warmup", "-1"), ("--steps", "two")])
def test_bad_counts_exit_2_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main([flag, value])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


def test_the_stop_agreement_is_timed_and_costs_milliseconds_at_most():
    """The per-step all-reduce of the stop flag (DDP runs), timed call after call in two processes:
    with nothing to hide it, a few percent of the 80-ms steps of the tiny runs at most."""
    seconds = bench.stop_agreement_seconds(calls=50)
    assert 0 < seconds < 5e-3  # idle: ~0.3 ms; the bound leaves room for a loaded machine


@pytest.mark.usefixtures("one_torch_thread")
def test_compile_figures_for_g_d_and_both_against_eager_and_the_bare_loop(capsys):
    """--compile: the compiled steps timed beside the eager one and the bare loop (the eager
    backend here: dynamo's capture and the bench's wiring in seconds), each with its compile time."""
    args = ["--no-variants", "--compile", "--steps", "1", "--rounds", "1", "--warmup", "0",
            "--device-map", "cpu", *TINY_OVERRIDES, "compile.backend=eager"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    found = figures(out)
    for name in ("eager", "g", "d", "g+d"):
        assert found[f"compile/{name}/ms_per_step"] > 0
        # rel: each figure prints 4 significant digits
        assert found[f"compile/{name}/vs_bare"] == pytest.approx(
            found["compile/bare/ms_per_step"] / found[f"compile/{name}/ms_per_step"], rel=2e-3)
        assert (f"compile/{name}/compile_s" in found) == (name != "eager")
    assert found["compile/eager/speedup"] == 1
    assert all(found[f"compile/{name}/compile_s"] > 0 for name in ("g", "d", "g+d"))
    assert "graphs compiled during the timed rounds" not in out


@pytest.mark.usefixtures("one_torch_thread")
def test_the_profile_counts_both_sides_operators(capsys):
    """--profile: per step, each side's operators (the same arithmetic: within a few of each other)
    and the operators whose host time differs most."""
    args = ["--no-variants", "--steps", "1", "--rounds", "1", "--warmup", "0", "--profile", "1",
            "--device-map", "g:cpu,d:cpu", *TINY_OVERRIDES]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    found = figures(out)
    ops = {side: found[f"profile/{side}/aten_ops_per_step"] for side in ("segadv", "bare")}
    assert ops["bare"] > 100 and abs(ops["segadv"] - ops["bare"]) < 0.2 * ops["bare"]
    assert found["profile/segadv/kernel_launches_per_step"] == 0  # no CUDA here
    assert "# top 25 operators by host time per step, segadv minus bare" in out
