"""summary.md of a tools/gpu_check.sh run, from the files it left in OUT_DIR.

    python tools/gpu_check_summary.py OUT_DIR [--dry]

Reads sections.tsv (each section's exit and time), env.log, cuda-tests.txt (every CUDA test
collected) and junit.xml (what pytest reached), plan.json (segadv-plan --measure) and the bench logs;
prints Markdown naming every CUDA test that failed, errored, timed out or was not reached. Exits 1
when a section failed or a CUDA test did not pass or skip, else 0. Standard library only: it runs
on the lent machine as it is.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

GIB = 1024 ** 3


@dataclass
class TestResult:
    node: str
    outcome: str  # passed, failed, error, skipped, timeout
    message: str = ""


def node_id(case: ET.Element) -> str:
    """pytest's node id from a junit testcase: classname ``tests.integration.test_x`` (a class
    after the module where there is one) and the test's name."""
    parts = case.get("classname", "").split(".")
    for cut in range(len(parts), 0, -1):  # the longest prefix that names a file is the module
        path = "/".join(parts[:cut]) + ".py"
        if Path(path).exists() or cut == 1:
            return "::".join([path, *parts[cut:], case.get("name", "")])
    return case.get("name", "")


def junit_results(path: Path) -> list[TestResult]:
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                message = (found.get("message") or found.text or "").strip().splitlines()
                message = message[0][:200] if message else ""
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                if outcome in ("failed", "error") and "Timeout" in message:
                    outcome = "timeout"
                break
        results.append(TestResult(node_id(case), outcome, message))
    return results


def sections(out: Path) -> list[dict[str, str]]:
    path = out / "sections.tsv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


def tests_part(out: Path) -> tuple[list[str], bool]:
    collected_path, junit = out / "cuda-tests.txt", out / "junit.xml"
    if not collected_path.exists():
        return ["## CUDA tests", "", "not collected (the tests section did not run or did not get that far)"], True
    collected = [line.strip() for line in collected_path.read_text().splitlines() if "::" in line]
    results = junit_results(junit) if junit.exists() else []
    reached = {r.node for r in results}
    counts = Counter(r.outcome for r in results)
    missing = [node for node in collected if node not in reached]
    lines = ["## CUDA tests", "",
             f"{len(collected)} collected: {counts['passed']} passed, {counts['failed']} failed, "
             f"{counts['error']} errors, {counts['timeout']} timed out, {counts['skipped']} skipped, "
             f"{len(missing)} not reached" + ("" if junit.exists() else " (no junit.xml: pytest was killed)")]
    for outcome, title in (("failed", "Failed"), ("error", "Errors"), ("timeout", "Timed out")):
        named = [r for r in results if r.outcome == outcome]
        if named:
            lines += ["", f"### {title}", ""] + [f"- `{r.node}`: {r.message}" for r in named]
    if missing:
        lines += ["", "### Not reached", ""] + [f"- `{node}`" for node in missing]
    skipped = Counter(r.message for r in results if r.outcome == "skipped")
    if skipped:
        lines += ["", "### Skipped, by reason", ""] + [f"- {n} x {reason}" for reason, n in skipped.most_common()]
    bad = bool(counts["failed"] or counts["error"] or counts["timeout"] or missing)
    return lines, bad


def plan_part(out: Path) -> list[str]:
    path = out / "plan.json"
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return ["## Plan against the allocator", "", "no plan.json (the plan section failed or did not run)"]
    lines = ["## Plan against the allocator", "",
             "| device | planned peak GiB | measured tensors GiB | max_memory_allocated GiB | plan / allocator |",
             "|---|---|---|---|---|"]
    for device, figures in plan.get("devices", {}).items():
        planned, measured = figures.get("peak_bytes"), figures.get("measured_peak_bytes")
        allocator = figures.get("allocator_peak_bytes") if device != "cpu" else None
        ratio = f"{planned / allocator:.3f}" if planned and allocator else "n/a (no CUDA allocator)"
        lines.append(f"| {device} | {gib(planned)} | {gib(measured)} | {gib(allocator)} | {ratio} |")
    return lines


def gib(value) -> str:
    return f"{value / GIB:.3f}" if isinstance(value, (int, float)) else "n/a"


FIGURES = ("ratio", "segadv/ms_per_step", "bare/ms_per_step", "flops/segadv_tflops")


def bench_part(out: Path) -> list[str]:
    lines = ["## Bench (tools/bench.py, segadv against the bare loop in one process)", ""]
    for name in ("demo", "voc"):
        path = out / f"bench-{name}.log"
        if not path.exists():
            lines.append(f"- {name}: not run")
            continue
        text = path.read_text()
        found = {key: m.group(1) for key in FIGURES
                 if (m := re.search(rf"^{re.escape(key)}\s+(\S+)", text, re.MULTILINE))}
        machine = re.search(r"^# machine: (.*)$", text, re.MULTILINE)
        if "ratio" not in found:
            lines.append(f"- {name}: no figures (see bench-{name}.log)")
            continue
        lines.append(f"- {name}: ratio {found['ratio']} (segadv / bare throughput), segadv "
                     f"{found.get('segadv/ms_per_step', '?')} ms per step against {found.get('bare/ms_per_step', '?')}, "
                     f"{found.get('flops/segadv_tflops', '?')} TFLOP/s" + (f"; {machine.group(1)}" if machine else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--dry", action="store_true", help="the run was gpu_check.sh --dry (on the CPU)")
    args = parser.parse_args(argv)
    out: Path = args.out
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    env = (out / "env.log").read_text().strip() if (out / "env.log").exists() else "not recorded"
    lines = [f"# GPU check{' (dry run on the CPU)' if args.dry else ''}, {when}", "", f"machine: {env}", "",
             "| section | exit | seconds | cap |", "|---|---|---|---|"]
    rows = sections(out)
    lines += [f"| {r['section']} | {r['exit']} | {r['seconds']} | {r['cap']} |" for r in rows]
    failed_sections = [r["section"] for r in rows if r["exit"] != "0"]
    test_lines, tests_bad = tests_part(out) if any(r["section"] == "tests" for r in rows) else ([], False)
    lines += ["", *test_lines] if test_lines else []
    if any(r["section"] == "plan" for r in rows):
        lines += ["", *plan_part(out)]
    if any(r["section"] == "bench" for r in rows):
        lines += ["", *bench_part(out)]
        if args.dry:
            lines += ["", "(dry: one step a side without warm-up on small inputs, so the ratios test the "
                          "plumbing, not the machine)"]
    print("\n".join(lines))
    return 1 if failed_sections or tests_bad else 0


if __name__ == "__main__":
    sys.exit(main())
