"""segadv/training/loop.py's ``train`` called as a library (no command around it): the stop signals
are segadv's from before the start's first write to the return."""

from __future__ import annotations

import signal

import pytest

from segadv import signals
from segadv.errors import UserError
from segadv.training import loop, run_dir as rundir


def test_train_as_a_library_answers_the_stop_signals_from_its_first_write(tiny_cfg, monkeypatch):
    seen = []

    def check_writable(run_dir):  # the start's first write: the run dir's write probe
        seen.append({sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS})
        raise UserError("stopped here")

    monkeypatch.setattr(rundir, "check_writable", check_writable)
    before = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    with pytest.raises(UserError, match="stopped here"):
        loop.train(tiny_cfg)
    assert seen == [{sig: signals._dispatch for sig in signals.STOP_SIGNALS}]
    assert {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS} == before  # put back at the return


def test_a_run_never_lists_nor_generates_the_test_split(tmp_path, monkeypatch, one_torch_thread):
    """``data.test`` is segadv-eval --split test's alone: a run lists train and val only (the folder
    layout's test/ folder is not even there) and generates no sample of the synthetic test split."""
    from conftest import TINY_OVERRIDES
    from data_builders import make_folder
    from segadv.config import load_config
    from segadv.data import bundle, layouts

    listed, generated = [], []
    folder = layouts.LISTERS["folder"]
    monkeypatch.setitem(layouts.LISTERS, "folder", lambda cfg, root, split: listed.append(split) or folder(cfg, root, split))

    class Generated(bundle.SyntheticShapes):
        def __init__(self, split, *args, **kwargs):
            generated.append(split)
            super().__init__(split, *args, **kwargs)

    monkeypatch.setattr(bundle, "SyntheticShapes", Generated)
    make_folder(tmp_path / "data", n_train=4, n_val=2, num_classes=3)
    resize = "[{name: Resize, height: 32, width: 32}]"
    runs = {"folder": [f"data.root={tmp_path / 'data'}", "data.kind=folder", "data.num_classes=3",
                       f"data.train_transforms={resize}", f"data.val_transforms={resize}"], "synthetic": []}
    for name, overrides in runs.items():
        cfg = load_config(None, [*TINY_OVERRIDES, *overrides, "data.test=test", "train.max_steps=2",
                                 "log.tensorboard=false"])
        cfg.run_dir, cfg.device_map = str(tmp_path / name), "cpu"
        assert loop.train(cfg).step == 2
    assert sorted(set(listed)) == ["train", "val"] and sorted(set(generated)) == ["train", "val"]
