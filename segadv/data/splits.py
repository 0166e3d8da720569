"""The labeled / unlabeled split of the training set, for semi-supervised training.

``data.labeled_fraction`` picks a seeded random subset (``data.labeled_seed``; the same ids
every run on the same data); ``data.labeled_list`` names the labeled ids in a file. Everything
else in the training split is the unlabeled pool, whose masks are never read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from segadv.config.schema import DataConfig
from segadv.data.files import Problem, display, read_id_list, shown_id
from segadv.data.layouts import resolve
from segadv.errors import UserError


def split_labeled(
    ids: Sequence[str], cfg: DataConfig, root: Optional[Path]
) -> tuple[list[int], list[int], list[Problem], dict]:
    """``(labeled indices, unlabeled indices, problems, record)`` over ``ids`` (train order).

    A list-file id that is not in the training split is a problem naming the list file. The
    record is what ``RUN/data_split.json`` holds.
    """
    record: dict = {
        "labeled_fraction": cfg.labeled_fraction,
        "labeled_list": cfg.labeled_list,
        "labeled_seed": cfg.labeled_seed,
    }
    n = len(ids)
    problems: list[Problem] = []
    if cfg.labeled_list is not None:
        if cfg.labeled_fraction != 1.0:
            raise UserError("data.labeled_list and data.labeled_fraction: set one of them, not both")
        path = resolve(root, cfg.labeled_list) if root is not None else Path(cfg.labeled_list).expanduser()
        wanted = read_id_list(path, "data.labeled_list")
        position = {sample_id: i for i, sample_id in enumerate(ids)}
        for sample_id in wanted:
            if sample_id not in position:
                problems.append(Problem(
                    "train", sample_id, (str(path),),
                    f"{display(path)} names id {shown_id(sample_id)}, which is not in the train split",
                ))
        chosen = set(position[i] for i in wanted if i in position)
        labeled = sorted(chosen)
    elif cfg.labeled_fraction < 1.0 and n:
        k = max(1, int(round(cfg.labeled_fraction * n)))
        order = np.random.default_rng(cfg.labeled_seed).permutation(n)
        labeled = sorted(int(i) for i in order[:k])
    else:
        labeled = list(range(n))
    in_labeled = set(labeled)
    unlabeled = [i for i in range(n) if i not in in_labeled]
    record["labeled"] = [ids[i] for i in labeled]
    record["unlabeled"] = [ids[i] for i in unlabeled]
    return labeled, unlabeled, problems, record
