"""segadv-eval --show-dir: each val image's predicted mask (a palette PNG, as segadv-predict writes
them: segadv/data/masks.py) and its overlay, under segadv-predict's rules for its --output: no
input is replaced, and a folder holding files segadv-eval did not write is refused unless
``overwrite``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from segadv.errors import UserError

SOFTWARE = "segadv-eval"  # the mark --show-dir's files carry (segadv/data/masks.py): its own may be replaced
OVERLAY_DIR = "overlay"
OVERLAY_ALPHA = 0.5  # segadv-predict's default
SHOWN = 5  # files named in one message


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
    """The scored split's files (val's or test's), as inputs nothing may replace."""
    split = getattr(dataset, "split", "val")
    return [(what, str(path)) for s in getattr(dataset, "samples", ())
            for what, path in ((f"{split} image", s.image), (f"{split} mask", s.mask)) if path is not None]


def input_folders(data_sections: Sequence[tuple[str, Any]], dataset: Any) -> list[tuple[str, str]]:
    """The folders the run reads: each data section's root (``(key, section)``: data, target_data)
    and the folder of each val image and mask."""
    folders = [(f"{key}.root", str(section.root)) for key, section in data_sections
               if section is not None and section.root]
    parents = dict.fromkeys(str(Path(path).parent) for _, path in input_files(dataset))
    split = getattr(dataset, "split", "val")
    return folders + [(f"the {split} split's folder", parent) for parent in parents]


def check_show_dir(out_dir: Path, stems: Sequence[str], inputs: Sequence[tuple[str, str]], overwrite: bool,
                   folders: Sequence[tuple[str, str]] = ()) -> None:
    """segadv-predict's rules for its --output (docs/inference.md): no written file is an input,
    and a folder holding files segadv-eval did not write is refused unless ``overwrite``; nor is
    ``out_dir`` one of the input ``folders`` (a data root), inside one, or holding one."""
    from segadv.data.masks import foreign_files
    from segadv.fsutil import check_output, refuse_folder_overlap, refuse_overwriting

    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--show-dir {out_dir} exists and is not a folder")
    targets = [t for stem in stems for t in (out_dir / f"{stem}.png", out_dir / OVERLAY_DIR / f"{stem}.png")]
    for target in targets:  # a device, FIFO or socket among them: refused before any is written
        check_output(target, "mask")
    refuse_overwriting([("--show-dir", out_dir), *(("mask", t) for t in targets)], inputs)
    refuse_folder_overlap("--show-dir", out_dir, folders)
    if overwrite:
        return
    foreign = foreign_files([out_dir, out_dir / OVERLAY_DIR], SOFTWARE, "--show-dir")
    if foreign:
        shown = ", ".join(map(str, foreign[:SHOWN])) + (f", ... ({len(foreign)} in all)" if len(foreign) > SHOWN else "")
        raise UserError(f"--show-dir {out_dir} holds files segadv-eval did not write ({shown}); masks written there "
                        "could replace them: choose an empty or new folder, or pass --overwrite")


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
