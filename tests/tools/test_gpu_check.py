"""tools/gpu_check.sh: its dry mode runs every default section on the CPU within its cap and writes
the summary; the summary names every CUDA test that failed, timed out or was not reached."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_tool

ROOT = Path(__file__).resolve().parents[2]
summary = load_tool("gpu_check_summary")


@pytest.mark.slow  # a minute: the CUDA tests collected twice, a plan measured, two benches
def test_the_dry_run_runs_every_section_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), str(out), "--dry"], capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = (out / "summary.md").read_text()
    for section in ("env", "tests", "plan", "bench"):
        assert f"| {section} | 0 |" in text, text
    collected = len((out / "cuda-tests.txt").read_text().splitlines())
    assert collected > 100  # every CUDA-marked test, the equivalence harness's GPU cases among them
    assert f"{collected} collected: 0 passed, 0 failed, 0 errors, 0 timed out, {collected} skipped, 0 not reached" in text
    assert "| cpu | " in text  # the plan beside its measurement
    assert text.count("ratio ") == 2  # the demo's and VOC's bench
    assert "total" in result.stdout and "cap 240 s" in result.stdout


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.engine.test_hot_path" name="test_sync[g:cuda:0]" time="1"/>
<testcase classname="tests.integration.test_equivalence" name="test_one_step[g:cuda:0,d:cpu]" time="2">
  <failure message="AssertionError: float32 deviations {'D update': 0.1} exceed 0.002">trace</failure></testcase>
<testcase classname="tests.integration.test_equivalence" name="test_one_step[cuda-compile]" time="90">
  <failure message="Failed: Timeout (&gt;90.0s) from pytest-timeout.">trace</failure></testcase>
<testcase classname="tests.parallel.test_distributed" name="test_two_gpus" time="0">
  <skipped message="needs two CUDA devices">x</skipped></testcase>
</testsuite></testsuites>"""


def test_the_summary_names_every_failure_timeout_and_test_not_reached(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # node ids are resolved against the checkout, as gpu_check.sh runs it
    (tmp_path / "sections.tsv").write_text("section\texit\tseconds\tcap\ntests\t1\t150\t150\n")
    (tmp_path / "junit.xml").write_text(JUNIT)
    (tmp_path / "cuda-tests.txt").write_text("\n".join([
        "tests/engine/test_hot_path.py::test_sync[g:cuda:0]",
        "tests/integration/test_equivalence.py::test_one_step[g:cuda:0,d:cpu]",
        "tests/integration/test_equivalence.py::test_one_step[cuda-compile]",
        "tests/parallel/test_distributed.py::test_two_gpus",
        "tests/integration/test_equivalence_unimatch.py::test_unimatch[v2-g:1,d:0]"]))
    assert summary.main([str(tmp_path)]) == 1
    text = capsys.readouterr().out
    assert "5 collected: 1 passed, 1 failed, 0 errors, 1 timed out, 1 skipped, 1 not reached" in text
    assert ("- `tests/integration/test_equivalence.py::test_one_step[g:cuda:0,d:cpu]`: AssertionError: float32 "
            "deviations {'D update': 0.1} exceed 0.002") in text
    assert "### Timed out\n\n- `tests/integration/test_equivalence.py::test_one_step[cuda-compile]`" in text
    assert "### Not reached\n\n- `tests/integration/test_equivalence_unimatch.py::test_unimatch[v2-g:1,d:0]`" in text
    assert "- 1 x needs two CUDA devices" in text
    assert "| tests | 1 | 150 | 150 |" in text


def test_a_killed_test_run_still_names_every_collected_test(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    (tmp_path / "sections.tsv").write_text("section\texit\tseconds\tcap\ntests\t124\t150\t150\n")
    (tmp_path / "cuda-tests.txt").write_text("tests/engine/test_hot_path.py::test_sync[g:cuda:0]\n")
    assert summary.main([str(tmp_path)]) == 1
    text = capsys.readouterr().out
    assert "1 collected: 0 passed" in text and "1 not reached (no junit.xml: pytest was killed)" in text
    assert "- `tests/engine/test_hot_path.py::test_sync[g:cuda:0]`" in text
