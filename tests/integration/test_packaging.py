"""The package as a user installs it: a wheel carrying the shipped configs, and an editable install.

Both go into fresh venvs that reuse this interpreter's site-packages for the dependencies (a .pth
file), built and installed without network (``--no-deps --no-build-isolation --no-index``), and run
from an empty directory without PYTHONPATH, so that nothing of this checkout is reachable but what
was installed.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]
RUN = [*TINY_OVERRIDES, "train.max_steps=2", "log.tensorboard=false", "device_map=cpu"]


def run(command: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def source_copy(dest: Path) -> Path:
    """What the package is built from (no build/ or egg-info left in the checkout)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("segadv", "configs", "docs"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


def fresh_venv(path: Path) -> Path:
    """A venv without pip whose dependencies (pip, setuptools, torch, ...) are this interpreter's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                          *site.getsitepackages()])
    Path(purelib, "_segadv_test_deps.pth").write_text("".join(f"{p}\n" for p in ours if Path(p).is_dir()))
    return python


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel and its build's output (``-v``: pip shows setuptools' warnings only then)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = source_copy(tmp / "src")
    proc = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index",
                "--disable-pip-version-check", "-w", tmp / "dist", src], cwd=tmp)
    (found,) = (tmp / "dist").glob("segadv-*.whl")
    return found, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def wheel(built: tuple[Path, str]) -> Path:
    return built[0]


def test_the_wheel_builds_without_a_setuptools_warning(built: tuple[Path, str]) -> None:
    """pyproject's packages name every folder of the wheel: a folder setuptools finds importable
    but unnamed ("Package would be ignored") is a warning now and left out of wheels later. Its
    Python warnings (``SomethingWarning:``) count; distutils' lower-case notes ("warning: build_py:
    byte-compiling is disabled") do not."""
    import re

    log = built[1]
    assert "Package would be ignored" not in log and "is absent from the `packages`" not in log
    assert re.findall(r"^.*\w*Warning: .*$", log, re.M) == []


def test_wheel_holds_every_module_and_every_shipped_config(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "segadv").rglob("*.py")}
    configs = {f"segadv/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / "configs").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert "segadv/configs/default.yaml" in configs and "segadv/configs/experiments/semi.yaml" in configs
    assert modules - names == set() and configs - names == set()
    assert "segadv/cli/experiment.py" in names and "segadv/monitor/status.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "segadv-experiment = segadv.cli.experiment:main" in scripts
    assert "segadv-curves = segadv.cli.curves:main" in scripts
    docs = {f"segadv/docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}  # what every --help points to
    assert "segadv/docs/training.md" in docs and docs - names == set()


def test_every_relative_link_of_the_wheels_docs_resolves_inside_the_wheel(wheel: Path) -> None:
    """The pages ship as segadv/docs/: a link to a figure or a file the wheel lacks (the demo's
    curves PNG, constraints/oldest.txt) would be broken on every wheel user's machine."""
    import posixpath
    import re

    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    pages = sorted(n for n in names if n.startswith("segadv/docs/") and n.endswith(".md"))
    assert "segadv/docs/demo_curves.png" in names
    broken = []
    for page in pages:
        text = archive.read(page).decode()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if not path or re.match(r"[a-z]+:", path):
                continue  # an anchor on the page, or a URL
            if posixpath.normpath(posixpath.join(posixpath.dirname(page), path)) not in names:
                broken.append(f"{page}: {target}")
    assert broken == []


def test_installed_wheel_trains_from_an_empty_directory(wheel: Path, tmp_path: Path) -> None:
    tmp_path = tmp_path.resolve()
    python = fresh_venv(tmp_path / "venv")
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", wheel],
        cwd=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    where = run([python, "-c", "import segadv, segadv.config as c; print(segadv.__file__); print(c.CONFIGS_DIR)"],
                cwd=empty).stdout.split()
    package = Path(where[0]).parent
    assert package.is_relative_to(tmp_path / "venv") and Path(where[1]) == package / "configs"

    train = tmp_path / "venv" / "bin" / "segadv-train"
    listed = run([train, "--list-configs"], cwd=empty).stdout.splitlines()
    assert [line.split()[0] for line in listed] == sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))

    # --help names pages that exist in the install; the clone's config path hints at the name
    pages = run([train, "--help"], cwd=empty).stdout.split("documentation:")[1].replace("\n", " ").split(",")
    assert pages and all(Path(p.strip()).is_file() and Path(p.strip()).is_relative_to(package) for p in pages)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    wrong = subprocess.run([train, "--config", "configs/voc.yaml", "--print-config"], cwd=empty,
                           capture_output=True, text=True, env=env)
    assert wrong.returncode == 2 and "--config voc" in wrong.stderr
    assert "kind: voc" in run([train, "--config", "voc", "--print-config"], cwd=empty).stdout

    run([train, *RUN], cwd=empty)  # the embedded default
    run([train, "--config", "semi", "--run-dir", "runs/semi", *RUN, "data.labeled_fraction=0.5"], cwd=empty)
    default_runs = [p for p in (empty / "runs").iterdir() if p.name.startswith("default-")]
    assert len(default_runs) == 1
    for run_dir in (default_runs[0], empty / "runs" / "semi"):
        assert (run_dir / "config.yaml").is_file() and (run_dir / "metrics.jsonl").is_file()
    assert "method:\n  name: advsemiseg" in (empty / "runs" / "semi" / "config.yaml").read_text()

    # The demo's test split scored, and a smoke run that keeps nothing, from the wheel alone.
    scored = run([tmp_path / "venv" / "bin" / "segadv-eval", "--checkpoint", default_runs[0], "--split", "test",
                  "data.test=test", "--device", "cpu", "--json"], cwd=empty).stdout
    assert json.loads(scored.strip().splitlines()[-1])["split"] == "test"
    smoke = run([train, "--run-dir", "runs/smoke", *RUN, "train.smoke=true"], cwd=empty)
    assert "nothing kept" in smoke.stderr and not (empty / "runs" / "smoke").exists()

    # The experiment tools are console scripts of the wheel: the shipped grids by name, the runs'
    # status.json read back, the curves of a run.
    experiment = tmp_path / "venv" / "bin" / "segadv-experiment"
    grids = run([experiment, "--list-grids"], cwd=empty).stdout.splitlines()
    experiments = Path(__file__).resolve().parents[2] / "configs" / "experiments"
    shipped_grids = sorted(path.stem for path in experiments.glob("*.yaml"))
    assert [line.split()[0] for line in grids] == shipped_grids
    pretext = empty / "runs" / "pretext" / "checkpoints" / "last.pt"  # the checkpoint its warm rows start from
    pretext.parent.mkdir(parents=True)
    pretext.write_bytes(b"")
    commands = run([experiment, "run", "semi", "--dry-run"], cwd=empty).stdout.splitlines()
    assert len(commands) == 29 and all(" -m segadv.cli.train --config semi --run-dir " in line for line in commands)
    table = json.loads(run([experiment, "table", default_runs[0], "runs/semi", "--json"], cwd=empty).stdout)
    assert [(r["outcome"], r["step"]) for r in table["runs"]] == [("finished", 2), ("finished", 2)]
    assert "method.name" in table["differing_keys"]
    curves = run([tmp_path / "venv" / "bin" / "segadv-curves", "runs/semi"], cwd=empty).stdout
    assert curves.startswith("runs/semi: did not reach 0.80 (best mIoU ")  # two steps reach no 0.80: said in words


def test_editable_install_finds_the_checkouts_configs_as_the_package(tmp_path: Path) -> None:
    """``pip install -e .`` (what ``make test`` does) maps segadv.configs onto the checkout's
    configs/; importlib.resources finds them there, not a fallback."""
    tmp_path = tmp_path.resolve()
    src = source_copy(tmp_path / "src")
    python = fresh_venv(tmp_path / "venv")
    run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-e", src], cwd=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    code = ("import importlib.resources, segadv.config as c; "
            "print(importlib.resources.files('segadv.configs')); print(c.CONFIGS_DIR); "
            "print(c.load_config('semi').method.name)")
    assert run([python, "-c", code], cwd=empty).stdout.split() == [str(src / "configs"), str(src / "configs"),
                                                                    "advsemiseg"]
