"""The data path runs once, front to back, at a start of segadv-train (docs/architecture.md,
segadv/data): each split is listed once (the start's checks list it and hand the listing on), each
data section is checked once, each stream's batch is checked against its pool once, and the source
val split is built once even when it is evaluated beside the target's."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES
from data_builders import make_folder
import segadv.training.loop  # noqa: F401  (a start's modules, imported before the spy patches the names they import)
from segadv.cli.train import main as train_main
from segadv.data import batch_checks, config_checks, layouts
from segadv.data.streams import Stream
from segadv.methods.registry import METHODS
from segadv.training import checks

RESIZE = "[{name: Resize, height: 32, width: 32}]"


class DataPathSpy:
    """Counts, through a real start, each split listed (by root folder and split), each data
    section checked (by root folder) and each stream checked against its pool, before the run
    draws its first batch; listings after it are counted apart."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.listed: Counter = Counter()
        self.listed_later: Counter = Counter()
        self.checked: Counter = Counter()
        self.pools_checked: Counter = Counter()
        self.build_checked: Counter = Counter()  # the method's check_config, the accumulation check
        self.started = False
        lister, check, check_pools, draw = (layouts.LISTERS["folder"], config_checks.check_config,
                                            batch_checks.check_stream_pools, Stream.next)

        def listing(cfg, root, split):
            (self.listed_later if self.started else self.listed)[(Path(cfg.root).name, split)] += 1
            return lister(cfg, root, split)

        def checking(cfg):
            if not self.started:
                self.checked[Path(cfg.root).name] += 1
            return check(cfg)

        def checking_pools(streams, *args, **kwargs):
            if not self.started:
                self.pools_checked.update(spec.name for spec in streams)
            return check_pools(streams, *args, **kwargs)

        def drawing(stream):
            self.started = True
            return draw(stream)

        monkeypatch.setitem(layouts.LISTERS, "folder", listing)
        # Every module that imported the checks by name gets the counting ones.
        for module in [m for name, m in sys.modules.items() if name.startswith("segadv")]:
            for name, original, spy in (("check_config", check, checking),
                                        ("check_stream_pools", check_pools, checking_pools)):
                if getattr(module, name, None) is original:
                    monkeypatch.setattr(module, name, spy)
        monkeypatch.setattr(Stream, "next", drawing)
        accumulation = checks.check_accumulation

        def checking_accumulation(cfg, *args, **kwargs):
            self.build_checked["accumulation"] += 1
            return accumulation(cfg, *args, **kwargs)

        monkeypatch.setattr(checks, "check_accumulation", checking_accumulation)
        for cls in METHODS.values():
            method_check = cls.check_config

            def checking_method(klass, cfg, _check=method_check):
                self.build_checked[f"method {klass.name}"] += 1
                return _check.__func__(klass, cfg)

            monkeypatch.setattr(cls, "check_config", classmethod(checking_method))


def start(tmp_path, *overrides, device_map="g:cpu,d:cpu") -> Path:
    run = tmp_path / "run"
    code = train_main(["--run-dir", str(run), "--device-map", device_map, *TINY_OVERRIDES,
                       "train.max_steps=2", "train.eval_every=2", "checkpoint.every=2", "log.tensorboard=false",
                       *overrides])
    assert code == 0
    return run


def source(tmp_path, num_classes: int) -> list[str]:
    make_folder(tmp_path / "source", n_train=8, n_val=2, num_classes=num_classes, h=32, w=32)
    return ["data.kind=folder", f"data.root={tmp_path / 'source'}", f"data.num_classes={num_classes}",
            "data.val_transforms=[]"]


def test_a_start_lists_each_split_once_and_checks_the_data_once(tmp_path, monkeypatch):
    spy = DataPathSpy(monkeypatch)
    start(tmp_path, *source(tmp_path, 3))
    assert spy.started
    assert spy.listed == {("source", "train"): 1, ("source", "val"): 1}
    assert spy.listed_later == {}
    assert spy.checked == {"source": 1}
    assert spy.pools_checked == {"labeled": 1}
    assert spy.build_checked == {"accumulation": 1, "method supervised": 1}


def test_a_domain_adaptation_start_takes_the_same_path_for_its_target(tmp_path, monkeypatch):
    """With a target and train.eval_source: the source's and the target's splits each listed once,
    each section checked once, each stream against its pool once; val/* is the target's and
    val_source/* the source's, from the one source val split."""
    make_folder(tmp_path / "target", n_train=6, n_val=3, num_classes=5, h=32, w=32)
    target = (f"target_data={{kind: folder, root: {tmp_path / 'target'}, num_classes: 5, val_batch_size: 3, "
              f"num_workers: 0, train_transforms: {RESIZE}, val_transforms: {RESIZE}}}")
    spy = DataPathSpy(monkeypatch)
    run = start(tmp_path, *source(tmp_path, 5), f"data.train_transforms={RESIZE}", target,
                "method.name=adaptsegnet", "model.generator.aux_head=true", "train.eval_source=true",
                device_map="g:cpu,d:cpu,d_aux:cpu")
    assert spy.listed == {("source", "train"): 1, ("source", "val"): 1, ("target", "train"): 1, ("target", "val"): 1}
    assert spy.listed_later == {}
    assert spy.checked == {"source": 1, "target": 1}
    assert spy.pools_checked == {"source": 1, "target": 1}
    assert spy.build_checked == {"accumulation": 1, "method adaptsegnet": 1}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("val/mIoU" in r for r in records) and any("val_source/mIoU" in r for r in records)
