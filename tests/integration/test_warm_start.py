"""The experiments' warm start: G pretrained on the synthetic pretext task (configs/pretext.yaml)
and loaded into the experiments' G's (configs/semi.yaml, configs/uda.yaml) through
``init.generator`` with the classifier heads left fresh, as the shipped grids do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from segadv.checkpoint import load_weights, read_checkpoint
from segadv.config import load_config
from segadv.data import class_names
from segadv.data.synthetic import PRETEXT_CLASSES, SHAPE_CLASSES, SyntheticShapes
from segadv.models import build_generator
from segadv.cli.train import main as train_main

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["data.synthetic.image_size=32", "data.synthetic.train_size=40", "data.synthetic.val_size=4",
         "data.batch_size=2", "data.val_batch_size=4", "train.max_steps=2", "train.eval_every=2",
         "train.log_every=1", "checkpoint.every=2", "log.tensorboard=false", "log.num_images=0"]
HEADS = ("segmentation_head.", "aux_head.")


def test_the_pretext_domain_draws_other_classes_from_its_own_streams():
    pretext = SyntheticShapes("train", 12, 48, len(PRETEXT_CLASSES), seed=0, domain="pretext")
    source = SyntheticShapes("train", 12, 48, 5, seed=0)
    assert pretext.class_names == list(PRETEXT_CLASSES)
    assert not set(PRETEXT_CLASSES[1:]) & set(SHAPE_CLASSES[:5])  # none of the experiments' classes
    for i in range(12):
        image, mask = pretext.raw(i)
        again = SyntheticShapes("train", 12, 48, 5, seed=0, domain="pretext").raw(i)
        assert np.array_equal(image, again[0]) and np.array_equal(mask, again[1])  # deterministic
        assert not np.array_equal(image, source.raw(i)[0])  # its own draw
        assert set(np.unique(mask)) <= set(range(len(PRETEXT_CLASSES))) and mask.any()
    with pytest.raises(ValueError, match="pretext domain"):
        SyntheticShapes("train", 4, 48, len(PRETEXT_CLASSES) + 1, seed=0, domain="pretext")


def grid_overrides(grid: str, row: str) -> list[str]:
    """The ``init.`` and ``model.`` overrides the shipped grid gives its row (common ones included)."""
    spec = yaml.safe_load((ROOT / "configs" / "experiments" / grid).read_text())
    overrides = spec.get("common_overrides", []) + next(r["overrides"] for r in spec["rows"] if r["name"] == row)
    return [o for o in overrides if o.startswith(("init.", "model."))]


@pytest.mark.parametrize(("config", "grid", "row", "small"), [
    ("semi.yaml", "semi.yaml", "AdvSemiSeg (adversarial + semi), warm", ["data.labeled_fraction=0.1"]),
    ("uda.yaml", "uda.yaml", "AdaptSegNet, warm",
     ["target_data.synthetic.image_size=32", "target_data.synthetic.train_size=8", "target_data.synthetic.val_size=4"]),
])
def test_a_pretext_run_loads_into_the_experiments_generator_with_the_head_fresh(tmp_path, monkeypatch, config,
                                                                                  grid, row, small):
    monkeypatch.chdir(ROOT)
    overrides = grid_overrides(grid, row)
    model_overrides = [o for o in overrides if o.startswith("model.")]
    init = load_config(None, [o for o in overrides if o.startswith("init.")]).init.generator
    init = {"path": init.path, "exclude": init.exclude}
    assert init["path"] == "runs/pretext/checkpoints/last.pt"  # where configs/pretext.yaml writes it
    pretext_cfg = load_config("configs/pretext.yaml", [])
    assert pretext_cfg.run_dir == "runs/pretext" and class_names(pretext_cfg.data) == list(PRETEXT_CLASSES)
    pretext_dir = tmp_path / "pretext"
    assert train_main(["--config", "configs/pretext.yaml", "--run-dir", str(pretext_dir), "--device-map", "cpu",
                       *SMALL]) == 0
    pretext = read_checkpoint(pretext_dir / "checkpoints" / "last.pt")["generator"]

    # The experiment's G, built fresh as its config says, then loaded as the grid says.
    cfg = load_config(f"configs/{config}", model_overrides)
    torch.manual_seed(0)
    model = build_generator(cfg.model.generator, cfg.data.num_classes)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    report = load_weights(pretext_dir / "checkpoints" / "last.pt", model, role="generator", exclude=init["exclude"])
    state = model.state_dict()
    heads = [k for k in state if k.startswith(HEADS)]
    body = [k for k in state if not k.startswith(HEADS)]
    assert sorted(report.skipped) == sorted(heads) and any(k.startswith("encoder.") for k in body)
    assert all(torch.equal(state[k], pretext[k]) for k in body)  # encoder and decoder: the pretext's
    assert all(torch.equal(state[k], fresh[k]) for k in heads)  # heads: their fresh init
    trained = [k for k in heads if k in pretext and k.endswith("weight")]
    assert trained and all(not torch.equal(state[k], pretext[k]) for k in trained)

    # And a run of the experiment starts from it through init.generator (a tiny one).
    run = ["--config", f"configs/{config}", "--run-dir", str(tmp_path / "run"), "--device-map", "cpu", *SMALL, *small,
           *model_overrides, f"init.generator.path={pretext_dir / 'checkpoints' / 'last.pt'}",
           "init.generator.exclude=[" + ", ".join(init["exclude"]) + "]"]
    assert train_main(run) == 0
