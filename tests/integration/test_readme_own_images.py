"""The README's "Your own images" section runs as written, offline, on a tiny generated folder
dataset: its mine.yaml and its three commands, taken from the README itself (the training run cut
to a few steps by overrides appended to its command line, nothing else changed)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from data_builders import make_folder
from segadv.cli import data as data_cli
from segadv.cli import predict as predict_cli
from segadv.cli import train as train_cli

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {"segadv-data": data_cli.main, "segadv-train": train_cli.main, "segadv-predict": predict_cli.main}
SHORT = ["train.max_steps=2", "train.eval_every=2", "checkpoint.every=2", "train.log_every=1", "device_map=cpu"]


def section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Your own images")
    return text[start:text.index("\n## ", start + 1)]


def test_the_readme_section_for_your_own_images_runs_as_written(tmp_path, monkeypatch, capsys):
    text = section()
    [config] = re.findall(r"```yaml\n(.*?)```", text, re.S)
    [commands] = re.findall(r"```bash\n(.*?)```", text, re.S)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text(config)
    make_folder(tmp_path / "data" / "mine", n_train=4, n_val=2, num_classes=2)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as on a machine without a network: nothing may be fetched
    lines = [shlex.split(line) for line in commands.strip().splitlines()]
    assert [line[0] for line in lines] == ["segadv-data", "segadv-train", "segadv-predict"]
    for program, *args in lines:
        if program == "segadv-train":
            args += SHORT
        assert COMMANDS[program](args) == 0, capsys.readouterr().err
    run = tmp_path / "runs" / "mine"
    assert (run / "checkpoints" / "best.pt").is_file() and (run / "train.log").is_file()
    masks = sorted(p.name for p in (run / "predictions").glob("*.png"))
    overlays = sorted(p.name for p in (run / "predictions" / "overlay").glob("*.png"))
    assert masks == overlays == ["val_000.png", "val_001.png"]


def test_the_wheel_users_demo_command_is_what_make_demo_runs():
    makefile = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo:.*\n\t\$\(VENV\)/bin/(segadv-train[^\n]*)", makefile, re.M).group(1).strip()
    readme = (ROOT / "README.md").read_text()
    assert f"```\n{demo}\n```" in readme


def test_the_readme_lists_the_extras_pyproject_has():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if "# extras:" in line)
    assert sorted(re.findall(r"(\w+) \(", line.partition("# extras:")[2])) == sorted(extras)


@pytest.mark.parametrize("name", ["supervised", "advsemiseg", "domain_adaptation", "s4gan"])
def test_each_built_in_method_is_a_folder_as_the_readme_says(name):
    assert (ROOT / "segadv" / "methods" / name).is_dir()
    assert "each built-in method is one folder in `segadv/methods/`" in (ROOT / "README.md").read_text()
