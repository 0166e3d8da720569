"""segadv-eval's scores: a checkpoint's G evaluated on its config's val split (the target's under
domain adaptation) or its test split (``data.test``), or a folder of predicted masks scored against
that split's ground truth (AdaptSegNet's compute_iou.py). Both splits are scored alike: the val
pipeline, G's precision, the same metrics. torch loads when a score is computed."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from segadv.errors import UserError
from segadv.inference.precision import Precision, evaluation_precision
from segadv.inference.show_dir import (OVERLAY_DIR, SHOWN, ShowDirWriter, check_show_dir, input_files, input_folders,
                                      sample_stems)

log = logging.getLogger(__name__)


@dataclass
class Scored:
    """One evaluation: its scores (an ``EvalResult``), what the JSON report starts with, the line
    naming what was scored, the samples left out, the config, the data section scored and the
    precision G ran in."""

    result: Any
    header: dict[str, Any]
    line: str
    skipped: list[Any]
    cfg: Any
    val_data: Any
    precision: Precision | None = None  # G's, for a checkpoint (None: predictions scored)
    split: str = "val"  # the split scored: val or test (data.test's)

    @property
    def section(self) -> str:
        """The config section whose split was scored (:func:`scored_section`)."""
        return scored_section(self.cfg)


SPLITS = ("val", "test")  # what segadv-eval --split takes


def scored_section(cfg: Any) -> str:
    """The config section whose splits segadv-eval scores: the one training measured val/* on,
    the target's (``target_data``) under domain adaptation, else ``data``."""
    return "target_data" if cfg.target_data is not None else "data"


def scored_data(cfg: Any, split: str) -> Any:
    """The data section whose ``split`` (val or test) is scored (:func:`scored_section`). A test
    split the config does not name is a UserError naming the key."""
    section = scored_section(cfg)
    data = getattr(cfg, section)
    if split == "test" and data.test is None:
        raise UserError(f"--split test: the config has no test split ({section}.test is null): name the split to score "
                        f"as the test set with {section}.test=<split> (docs/datasets.md), or score the val split")
    return data


def read_prediction(path: Path, num_classes: int) -> np.ndarray:
    """A predicted mask's class ids: a palette or single-channel PNG (exit 2 naming it otherwise)."""
    from segadv.data.images import ImageProblem, open_image

    try:
        with open_image(path) as img:
            if img.mode not in ("P", "L", "I;16", "I"):
                raise UserError(f"predicted mask {path} is a {img.mode} image: a mask is a palette or single-channel "
                                "PNG whose values are class ids")
            ids = np.asarray(img)
    except ImageProblem as err:
        raise UserError(f"cannot read predicted mask {path}: {err}") from None
    if ids.size and int(ids.max()) >= num_classes:
        raise UserError(f"predicted mask {path} holds the value {int(ids.max())}, not a class id "
                        f"0..{num_classes - 1}")
    return ids


def score_predictions(pred_dir: Path, dataset: Any, num_classes: int) -> Any:
    """The confusion matrix of the masks in ``pred_dir`` against ``dataset``'s ground truth, read
    as training reads it (label mapping included) at its own size (no val transform)."""
    import torch

    from segadv.engine.evaluate import ConfusionMatrix, EvalResult
    from segadv.fsutil import list_dir

    if not pred_dir.is_dir():
        raise UserError(f"--predictions {pred_dir} is not a folder")
    stems = sample_stems(dataset)
    found = {p.stem: p for p in list_dir(pred_dir, "--predictions")
             if p.suffix.lower() == ".png" and not p.name.startswith(".") and p.is_file()}
    missing = [s for s in stems if s not in found]
    extra = sorted(set(found) - set(stems))
    for what, names in (("no prediction for", [f"{s}.png" for s in missing]),
                        ("predictions for no val image:", [found[s].name for s in extra])):
        if names:
            more = f", ... ({len(names)} in all)" if len(names) > SHOWN else ""
            raise UserError(f"--predictions {pred_dir}: {what} {', '.join(names[:SHOWN])}{more} "
                            f"(one <stem>.png per val image, {len(stems)} in all)")
    confmat = ConfusionMatrix(num_classes)
    for i, stem in enumerate(stems):
        _, label = dataset.raw(i)
        pred = read_prediction(found[stem], num_classes)
        if pred.shape != label.shape:
            raise UserError(f"predicted mask {found[stem]} is {pred.shape[1]}x{pred.shape[0]}, its ground truth "
                            f"{label.shape[1]}x{label.shape[0]} (width x height): predict at the image's size")
        confmat.update(torch.from_numpy(label.astype(np.int64)), torch.from_numpy(pred.astype(np.int64)))
    return EvalResult(confmat)


def score_prediction_folder(predictions: str, config: str | None, overrides: Sequence[str],
                            split: str = "val") -> Scored:
    """The masks in ``predictions`` scored against the config's ``split`` (val or test)."""
    from segadv.config import load_config
    from segadv.data.bundle import build_val_dataset

    cfg = load_config(config, overrides)
    val_data = scored_data(cfg, split)
    dataset = build_val_dataset(val_data, split=split)
    result = score_predictions(Path(predictions), dataset, cfg.data.num_classes)
    return Scored(result, {"predictions": predictions, "split": split}, f"predictions: {predictions}", [], cfg,
                  val_data, split=split)


def evaluate_checkpoint(checkpoint_path: str, config: str | None, overrides: Sequence[str], *, device: str | None = None,
                        trusted: bool = False, network: str | None = None, show_dir: str | None = None,
                        overwrite: bool = False, split: str = "val") -> Scored:
    """G's evaluation on ``split`` (val or test), writing ``show_dir``'s files on the way."""
    from segadv.checkpoint.inference import load_generator
    from segadv.data import build_val_loader
    from segadv.data.loaders import left_out
    from segadv.engine.evaluate import evaluate
    from segadv.fsutil import make_dir
    from segadv.monitor.progress import evaluation_progress
    from segadv.parallel import activate, parse_device_map

    device_map = parse_device_map(None if device is None else f"g:{device}")
    activate(device_map)
    loaded = load_generator(checkpoint_path, config, overrides, trusted=trusted, network=network)
    checkpoint = str(loaded.checkpoint)
    cfg, generator = loaded.cfg, loaded.model.to(device_map.generator)
    val_data = scored_data(cfg, split)
    val_loader = build_val_loader(val_data, seed=cfg.train.seed, pin_memory=False, split=split)  # no train split needed
    # G's forward as the run's evaluations ran it: a bf16 run scored in float32 scores a little otherwise
    precision = evaluation_precision(cfg, loaded.network, device_map.generator)
    log.info("precision: %s (%s)%s", precision.name, precision.why,
             "" if precision.name == "float32" else
             f"; {precision.key}=false scores in float32")
    batches, writer = val_loader, None
    if show_dir:
        out_dir, dataset = Path(show_dir), val_loader.dataset
        stems = sample_stems(dataset)
        inputs = [("the checkpoint", checkpoint), *input_files(dataset)]
        if config:
            inputs.append(("--config", config))
        folders = input_folders([("data", cfg.data), ("target_data", cfg.target_data)], dataset)
        check_show_dir(out_dir, stems, inputs, overwrite, folders)
        make_dir(out_dir)
        make_dir(out_dir / OVERLAY_DIR)
        writer = ShowDirWriter(dataset, stems, out_dir, cfg.data.num_classes, val_data.input_normalization)
        batches = writer.batches()
    result = evaluate(generator, batches, device_map.generator, cfg.data.num_classes, autocast=precision.autocast,
                      track=evaluation_progress, sink=writer, resize_to_multiple=val_data.val_resize_to_multiple)
    skipped = left_out(val_loader) + (writer.left_out if writer is not None else [])
    # which of the checkpoint's networks was scored: the student (G) or, --network teacher, its EMA teacher
    header: dict[str, Any] = {"checkpoint": checkpoint, "step": loaded.step, "network": loaded.network,
                              "split": split, "precision": precision.name}
    if writer is not None:
        header["show_dir"], header["show_dir_written"] = show_dir, writer.written
    step = "" if loaded.step is None else f", step {loaded.step}"
    return Scored(result, header, f"checkpoint: {checkpoint} ({loaded.kind}{step})", skipped, cfg, val_data,
                  precision, split)
