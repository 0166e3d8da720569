"""segadv-eval: evaluate a generator checkpoint on the configured val split, or score a folder of
predicted masks against its ground truth.

    segadv-eval --checkpoint FILE|DIR|RUN_DIR [--config FILE] [--device DEV] [--json] [--show-dir DIR] [key=value ...]
    segadv-eval --predictions DIR [--config FILE] [--json] [key=value ...]

Without ``--config`` the config saved in the checkpoint is used (overrides apply on top); a raw
state dict needs one; an smp ``save_pretrained`` directory describes G itself
(segadv/checkpoint/inference.py); a run dir means its best checkpoint
(segadv/checkpoint/run_checkpoint.py). ``--json``: one object, per-class IoU by class name (null
for a class neither predicted nor in the ground truth) and the confusion matrix.

``--show-dir DIR`` writes each val image's predicted mask (a palette PNG, as segadv-predict writes
them: segadv/data/masks.py) and an overlay, under segadv-predict's rules for its --output: no input
is replaced, and a folder holding files segadv-eval did not write is refused unless --overwrite.
``--predictions DIR`` scores masks already made (AdaptSegNet's compute_iou.py): one PNG per val
image, named by its stem, palette or single-channel, of its ground truth's size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from segadv.cli.args import HelpFormatter, add_config_arguments, docs_epilog, parse_args, path_argument
from segadv.errors import UserError, cli_entry

SOFTWARE = "segadv-eval"  # the mark --show-dir's files carry (segadv/data/masks.py): its own may be replaced
OVERLAY_DIR = "overlay"
OVERLAY_ALPHA = 0.5  # segadv-predict's default
SHOWN = 5  # files named in one message


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="segadv-eval", formatter_class=HelpFormatter,
                                     epilog=docs_epilog("inference.md"),
                                     description="Evaluate a generator checkpoint on its config's val split: "
                                                 "mIoU, per-class IoU and pixel accuracy.")
    parser.add_argument("--checkpoint", type=path_argument, help="segadv checkpoint (e.g. RUN/checkpoints/last.pt), "
                        "a run dir (its best checkpoint), raw state dict (needs --config) or smp save_pretrained "
                        "directory")
    parser.add_argument("--predictions", type=path_argument, metavar="DIR",
                        help="instead of --checkpoint: score a folder of predicted masks (one <val image stem>.png "
                             "each, palette or single-channel, class ids) against the config's val split")
    add_config_arguments(parser, "default: the one saved in the checkpoint (with --predictions: default)")
    parser.add_argument("--show-dir", type=path_argument, metavar="DIR",
                        help="write each val image's predicted mask (DIR/<stem>.png, a palette PNG) and overlay "
                             "(DIR/overlay/<stem>.png)")
    parser.add_argument("--overwrite", action="store_true",
                        help="let --show-dir write into a folder holding files segadv-eval did not write (an input "
                             "is still never replaced)")
    parser.add_argument("--device", help="cpu, cuda:N or N (default: cuda:0 if available, else cpu)")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    parser.add_argument("--network", choices=("student", "teacher"),
                        help="of a mean_teacher run's checkpoint: the student (G, default: the network the run scored "
                             "as val/mIoU) or its EMA teacher")
    parser.add_argument("--trust-checkpoint", action="store_true", help="allow pickled code (off: weights only)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. data.root=/data/VOC2012 "
                             "(the keys: segadv-train --help-config)")
    return parser


def sample_stems(dataset: Any) -> list[str]:
    """The file stem of each val sample's image, in the dataset's order (an index for generated
    data): the names --show-dir writes and --predictions reads. Two images with one stem: exit 2."""
    samples = getattr(dataset, "samples", None)
    stems = [Path(s.image).stem for s in samples] if samples is not None else [f"{i:05d}" for i in range(len(dataset))]
    seen: dict[str, int] = {}
    for i, stem in enumerate(stems):
        if stem in seen:
            raise UserError(f"two val images share the stem {stem!r} ({samples[seen[stem]].image}, {samples[i].image}): "
                            "their masks would have one name")
        seen[stem] = i
    return stems


def input_files(dataset: Any) -> list[tuple[str, str]]:
    """The val split's files, as inputs nothing may replace."""
    return [(what, str(path)) for s in getattr(dataset, "samples", ())
            for what, path in (("val image", s.image), ("val mask", s.mask)) if path is not None]


def check_show_dir(out_dir: Path, stems: Sequence[str], inputs: Sequence[tuple[str, str]], overwrite: bool) -> None:
    """segadv-predict's rules for its --output (docs/inference.md): no written file is an input,
    and a folder holding files segadv-eval did not write is refused unless ``overwrite``."""
    from segadv.data.masks import foreign_files
    from segadv.fsutil import check_output, refuse_overwriting

    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--show-dir {out_dir} exists and is not a folder")
    targets = [t for stem in stems for t in (out_dir / f"{stem}.png", out_dir / OVERLAY_DIR / f"{stem}.png")]
    for target in targets:  # a device, FIFO or socket among them: refused before any is written
        check_output(target, "mask")
    refuse_overwriting([("--show-dir", out_dir), *(("mask", t) for t in targets)], inputs)
    if overwrite:
        return
    foreign = foreign_files([out_dir, out_dir / OVERLAY_DIR], SOFTWARE, "--show-dir")
    if foreign:
        shown = ", ".join(map(str, foreign[:SHOWN])) + (f", ... ({len(foreign)} in all)" if len(foreign) > SHOWN else "")
        raise UserError(f"--show-dir {out_dir} holds files segadv-eval did not write ({shown}); masks written there "
                        "could replace them: choose an empty or new folder, or pass --overwrite")


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


class ShowDirWriter:
    """Writes each scored val image's mask and overlay as evaluate()'s ``sink`` receives them; the
    batches come from :meth:`batches`, one sample each, so the k-th prediction is the k-th sample
    handed out (the loader's same-size grouping would reorder them)."""

    def __init__(self, dataset: Any, stems: Sequence[str], out_dir: Path, num_classes: int, normalization: Any) -> None:
        from segadv.data.palette import palette

        self.dataset, self.stems, self.out_dir, self.normalization = dataset, stems, out_dir, normalization
        self.palette = palette(num_classes)
        self.pending: list[tuple[int, Any]] = []  # (index, image) handed out, not yet written
        self.left_out: list[Any] = []  # samples that failed to load (data.on_error=skip)
        self.written = 0

    def batches(self):
        for i in range(len(self.dataset)):
            item = self.dataset[i]
            if item is None:  # left out under data.on_error=skip, never replaced by another
                self.left_out.append(self.dataset.problem(i))
                continue
            image, label = item
            self.pending.append((i, image))
            yield image[None], label[None]

    def __call__(self, labels: Any, preds: Any) -> None:
        import torch
        from PIL import Image

        from segadv.data.masks import overlay_png, palette_png
        from segadv.fsutil import atomic_write_bytes
        from segadv.monitor.images import denormalize

        for pred in preds:
            i, image = self.pending.pop(0)
            ids = pred.to("cpu", torch.uint8).numpy()
            picture = denormalize(image, self.normalization).permute(1, 2, 0).numpy()
            if picture.shape[:2] != ids.shape:  # scored at another size than G's input: the picture follows
                picture = np.asarray(Image.fromarray(picture).resize(ids.shape[::-1], Image.BILINEAR))
            stem = self.stems[i]
            atomic_write_bytes(self.out_dir / f"{stem}.png", palette_png(ids, self.palette, SOFTWARE))
            atomic_write_bytes(self.out_dir / OVERLAY_DIR / f"{stem}.png",
                               overlay_png(picture, ids, self.palette, OVERLAY_ALPHA, SOFTWARE))
            self.written += 1


@cli_entry
def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    if (args.checkpoint is None) == (args.predictions is None):
        raise UserError("name one of --checkpoint (a model to evaluate) and --predictions (a folder of masks to score)")
    if args.predictions is not None and (args.show_dir or args.network or args.device):
        raise UserError("--predictions scores masks already made: --show-dir, --network and --device need --checkpoint")
    # torch and the data pipeline load here, once --help has had its answer
    from segadv.data import class_names
    from segadv.data.files import absent_classes_note
    from segadv.training.process import setup_logging

    setup_logging()
    if args.predictions is not None:
        from segadv.config import load_config
        from segadv.data.bundle import build_val_dataset

        cfg = load_config(args.config, args.overrides)
        val_data = cfg.target_data if cfg.target_data is not None else cfg.data
        dataset = build_val_dataset(val_data)
        result = score_predictions(Path(args.predictions), dataset, cfg.data.num_classes)
        header = {"predictions": args.predictions}
        line = f"predictions: {args.predictions}"
        skipped: list[Any] = []
    else:
        result, header, line, skipped, cfg, val_data = evaluate_checkpoint(args)
    names = class_names(val_data)
    metrics = result.metrics
    absent = absent_classes_note(names, result.absent_classes, val_data.ignore_index, "val")
    if args.json:
        print(json.dumps({**header, "mIoU": metrics["mIoU"], "pixel_acc": metrics["pixel_acc"],
                          "iou": {name: (iou if iou == iou else None) for name, iou in zip(names, metrics["iou"])},
                          "skipped": len(skipped), "absent_classes": [names[i] for i in result.absent_classes],
                          "confusion_matrix": {"classes": names, "rows": result.matrix.tolist()}}))
        return 0
    print(f"{line}; val split of {'target_data' if cfg.target_data is not None else 'data'}")
    print(f"mIoU       {metrics['mIoU']:.4f}")
    print(f"pixel acc  {metrics['pixel_acc']:.4f}")
    for name, iou in zip(names, metrics["iou"]):
        print(f"  IoU {name:<14} {iou:.4f}")
    if skipped:
        print(f"skipped    {len(skipped)} val sample{'' if len(skipped) == 1 else 's'} left out of the scores "
              "(data.on_error=skip):")
        for problem in skipped:
            print(f"  {problem.message}")
    if absent:
        print(f"note       {absent}")
    if args.show_dir:
        print(f"wrote      {header['show_dir_written']} mask(s) to {args.show_dir} "
              f"(+ overlays in {Path(args.show_dir) / OVERLAY_DIR})")
    return 0


def evaluate_checkpoint(args: argparse.Namespace) -> tuple[Any, dict[str, Any], str, list[Any], Any, Any]:
    """G's evaluation on the val split, writing --show-dir's files on the way."""
    from segadv.checkpoint.inference import load_generator
    from segadv.data import build_val_loader
    from segadv.data.loaders import left_out
    from segadv.engine.evaluate import evaluate
    from segadv.fsutil import make_dir
    from segadv.monitor.progress import evaluation_progress
    from segadv.parallel import activate, parse_device_map

    device_map = parse_device_map(None if args.device is None else f"g:{args.device}")
    activate(device_map)
    loaded = load_generator(args.checkpoint, args.config, args.overrides, trusted=args.trust_checkpoint,
                            network=args.network)
    checkpoint = str(loaded.checkpoint)
    cfg, generator = loaded.cfg, loaded.model.to(device_map.generator)
    # The split training measured val/* on: the target's with domain adaptation, else data's.
    val_data = cfg.target_data if cfg.target_data is not None else cfg.data
    val_loader = build_val_loader(val_data, seed=cfg.train.seed, pin_memory=False)  # no train split needed
    batches, writer = val_loader, None
    if args.show_dir:
        out_dir, dataset = Path(args.show_dir), val_loader.dataset
        stems = sample_stems(dataset)
        inputs = [("the checkpoint", checkpoint), *input_files(dataset)]
        if args.config:
            inputs.append(("--config", args.config))
        check_show_dir(out_dir, stems, inputs, args.overwrite)
        make_dir(out_dir)
        make_dir(out_dir / OVERLAY_DIR)
        writer = ShowDirWriter(dataset, stems, out_dir, cfg.data.num_classes, val_data.input_normalization)
        batches = writer.batches()
    result = evaluate(generator, batches, device_map.generator, cfg.data.num_classes, track=evaluation_progress,
                      sink=writer)
    skipped = left_out(val_loader) + (writer.left_out if writer is not None else [])
    header: dict[str, Any] = {"checkpoint": checkpoint, "step": loaded.step}
    if writer is not None:
        header["show_dir"], header["show_dir_written"] = args.show_dir, writer.written
    step = "" if loaded.step is None else f", step {loaded.step}"
    return result, header, f"checkpoint: {checkpoint} ({loaded.kind}{step})", skipped, cfg, val_data


if __name__ == "__main__":
    sys.exit(main())
