"""The README's "Your own images" section runs as written, offline, on a tiny generated folder
dataset: its mine.yaml and its three commands, taken from the README itself (the training run cut
to a few steps by overrides appended to its command line, nothing else changed); its Python block's
generated images; and its recipe learning on them within a small budget."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from data_builders import make_folder
from segadv.cli import data as data_cli
from segadv.cli import predict as predict_cli
from segadv.cli import train as train_cli
from segadv.config import load_config

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
    make_folder(tmp_path / "data" / "mine", n_train=8, n_val=2, num_classes=2)  # a batch of 8
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


def readme_images() -> None:
    """Runs the section's Python block, which writes its generated images under the cwd."""
    [code] = re.findall(r"```python\n(.*?)```", section(), re.S)
    exec(compile(code, "README.md, Your own images", "exec"), {"__name__": "__main__"})


def test_the_readmes_generated_images_are_the_layout_it_describes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    readme_images()
    for split, n in (("train", 24), ("val", 6)):
        images = sorted(p.stem for p in (tmp_path / "data" / "mine" / split / "images").glob("*.png"))
        masks = sorted(p.stem for p in (tmp_path / "data" / "mine" / split / "masks").glob("*.png"))
        assert images == masks and len(images) == n
    [config] = re.findall(r"```yaml\n(.*?)```", section(), re.S)
    (tmp_path / "mine.yaml").write_text(config)
    assert data_cli.main(["check", "--config", "mine.yaml"]) == 0, capsys.readouterr().err
    assert "problems: none" in capsys.readouterr().out


# The recipe's budget cut (steps, and the adversarial warm-up within them so that D's term still
# enters G's loss), float32 whatever the CPU (amp auto would pick bf16 where it is native).
BUDGET = ["train.max_steps=80", "train.eval_every=40", "checkpoint.every=80", "loss.adv_warmup_steps=20",
          "amp.generator.enabled=false", "amp.discriminator.enabled=false", "log.progress_bar=false",
          "device_map=cpu"]


def background_only_miou(masks: Path, num_classes: int) -> float:
    """The val mIoU of predicting background (class 0) at every pixel, scored as training scores."""
    from segadv.engine.evaluate import ConfusionMatrix

    matrix = ConfusionMatrix(num_classes)
    for path in sorted(masks.glob("*.png")):
        target = torch.from_numpy(np.array(Image.open(path))).long()[None]
        matrix.update(target, torch.zeros_like(target))
    return float(matrix.compute()["mIoU"])


def final_miou(config: str, run_dir: str, *overrides: str) -> float:
    assert train_cli.main(["--config", config, "--run-dir", run_dir, *BUDGET, *overrides]) == 0
    status = json.loads((Path(run_dir) / "status.json").read_text())
    assert status["outcome"] == "finished" and status["final"]["step"] == 80
    return status["final"]["mIoU"]


def test_the_readme_recipe_learns_more_than_background_on_a_small_budget(tmp_path, monkeypatch):
    """mine.yaml (on configs/folder_scratch.yaml) on the section's generated images: 80 steps on
    the CPU end above the score of predicting background everywhere, and above the same run with
    folder.yaml's optimizer (SGD at 2.5e-4, for a pretrained encoder)."""
    monkeypatch.chdir(tmp_path)
    readme_images()
    [config] = re.findall(r"```yaml\n(.*?)```", section(), re.S)
    (tmp_path / "mine.yaml").write_text(config)
    recipe = final_miou("mine.yaml", "runs/mine")
    background = background_only_miou(tmp_path / "data" / "mine" / "val" / "masks", num_classes=2)
    assert 0 < background < 0.5  # both classes in val: background alone scores its IoU over two classes
    assert recipe > background
    sgd = load_config("folder").optim.generator
    assert recipe > final_miou("mine.yaml", "runs/sgd", f"optim.generator.name={sgd.name}",
                               f"optim.generator.lr={sgd.lr}", f"optim.generator.weight_decay={sgd.weight_decay}")
