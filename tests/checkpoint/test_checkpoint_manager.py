"""The checkpoint manager on its own: what is due, the best, retention, resume discovery, archiving."""

import json

import pytest
import torch

from segadv.checkpoint import CheckpointManager, read_checkpoint
from segadv.errors import UserError


class Weights:
    """A stand-in for a network or optimizer: one tensor that training changes."""

    def __init__(self, value: float = 0.0) -> None:
        self.value = torch.tensor([value])

    def state_dict(self):
        return {"w": self.value.clone()}

    def load_state_dict(self, state):
        self.value = state["w"].clone()


def manager(tmp_path, weights=None, **kwargs):
    kwargs.setdefault("every", 2)
    return CheckpointManager(tmp_path, {"generator": weights or Weights()}, config={"run": "test"}, **kwargs)


def names(tmp_path):
    return sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_file())


def test_due_every_n_steps_and_at_the_end(tmp_path):
    m = CheckpointManager(tmp_path, every=3)
    assert [s for s in range(1, 10) if m.due(s)] == [3, 6, 9]
    assert m.due(4, final=True) and not m.due(4)


def test_save_writes_last_always_and_step_files_on_multiples(tmp_path):
    weights = Weights()
    m = manager(tmp_path, weights)
    for step in (1, 2, 3):
        weights.value += 1
        m.save(step)
    assert names(tmp_path) == ["last.pt", "step_2.pt"]
    last, step_2 = read_checkpoint(tmp_path / "checkpoints" / "last.pt"), read_checkpoint(tmp_path / "checkpoints" / "step_2.pt")
    assert (last["step"], last["generator"]["w"].item(), last["config"]) == (3, 3.0, {"run": "test"})
    assert (step_2["step"], step_2["generator"]["w"].item(), step_2["format"]) == (2, 2.0, "segadv")


class Loads(Weights):
    """Weights that count the states loaded into them."""

    loads = 0

    def load_state_dict(self, state):
        self.loads += 1
        super().load_state_dict(state)


def test_read_back_restores_each_saved_checkpoint_as_a_resume_would(tmp_path, caplog):
    """train.smoke's check: every save read back into the states, which hold what they held."""
    weights = Loads(1.0)
    m = manager(tmp_path, weights, read_back=True)
    with caplog.at_level("INFO"):
        m.save(1)
    assert (weights.loads, weights.value.item(), m.step) == (1, 1.0, 1)
    assert "checkpoint read back: last.pt restores the run at step 1" in caplog.text
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"garbage")  # a file that would not resume the run
    with pytest.raises(UserError):
        m.read_back(tmp_path / "checkpoints" / "last.pt")
    plain = Loads()
    manager(tmp_path / "plain", plain).save(1)
    assert plain.loads == 0  # read back only where asked


def test_retention_keeps_the_newest_step_files(tmp_path):
    m = manager(tmp_path, every=1, keep_last=2)
    for step in range(1, 6):
        m.save(step)
    assert names(tmp_path) == ["last.pt", "step_4.pt", "step_5.pt"]


def test_best_is_kept_only_when_an_evaluation_beats_it(tmp_path):
    weights = Weights()
    m = manager(tmp_path, weights)
    for step, miou in ((1, 0.3), (2, 0.5), (3, 0.5), (4, 0.4)):
        weights.value += 1
        assert m.keep_if_best(step, miou) == (step in (1, 2))  # equal is not better: the first stays
    best = read_checkpoint(tmp_path / "checkpoints" / "best.pt")
    assert (best["step"], best["best"], best["generator"]["w"].item()) == (2, {"mIoU": 0.5, "step": 2}, 2.0)
    assert json.loads((tmp_path / "checkpoints" / "best.json").read_text()) == {"step": 2, "mIoU": 0.5}
    assert m.best == {"mIoU": 0.5, "step": 2}
    m.save(4)  # every checkpoint carries the best so far
    assert read_checkpoint(tmp_path / "checkpoints" / "last.pt")["best"] == {"mIoU": 0.5, "step": 2}


def test_best_by_a_label_free_score_in_its_direction_and_a_resume_that_chooses_otherwise(tmp_path):
    weights = Weights()
    m = manager(tmp_path, weights, best_by="proxy/entropy")  # lower is better
    for step, miou, entropy in ((1, 0.3, 0.5), (2, 0.6, 0.4), (3, 0.4, 0.2), (4, 0.7, 0.3), (5, 0.8, float("nan"))):
        weights.value += 1
        assert m.keep_if_best(step, miou, 0.9, {"proxy/entropy": entropy}) == (step in (1, 2, 3))
    record = json.loads((tmp_path / "checkpoints" / "best.json").read_text())
    assert record == {"step": 3, "mIoU": 0.4, "by": "proxy/entropy", "score": 0.2}
    assert read_checkpoint(tmp_path / "checkpoints" / "best.pt")["generator"]["w"].item() == 3.0
    m.save(4)
    by_snd = manager(tmp_path, Weights(), best_by="proxy/snd")  # higher is better
    by_snd.start("auto")
    assert by_snd.best is None  # chosen by another score: the next evaluation writes a new best.pt
    assert by_snd.keep_if_best(6, 0.1, None, {"proxy/snd": 1.0})
    assert not by_snd.keep_if_best(7, 0.9, None, {"proxy/snd": 0.5})


def test_resume_auto_restores_every_state_from_the_newest_file(tmp_path):
    weights = Weights()
    m = manager(tmp_path, weights)
    m.keep_if_best(2, 0.7)
    for step in (2, 3):
        weights.value += 1
        m.save(step)
    fresh = Weights(-1.0)
    resumed = manager(tmp_path, fresh)
    assert resumed.start("auto") == 3
    assert fresh.value.item() == 2.0 and resumed.best == {"mIoU": 0.7, "step": 2}
    assert names(tmp_path) == ["best.json", "best.pt", "last.pt", "step_2.pt"]  # nothing abandoned


def test_resume_auto_prefers_a_newer_step_file_and_skips_corrupt_files(tmp_path, caplog):
    m = manager(tmp_path)
    for step in (2, 4, 6):
        m.save(step)
    ckpt_dir = tmp_path / "checkpoints"
    (ckpt_dir / "last.pt").write_bytes((ckpt_dir / "step_2.pt").read_bytes())  # older than step_6.pt
    (ckpt_dir / "step_6.pt").write_bytes(b"cut short")
    path, ckpt = manager(tmp_path).newest_loadable()
    assert (path.name, ckpt["step"]) == ("step_4.pt", 4)
    assert "skipping" in caplog.text and "step_6.pt" in caplog.text


def test_resume_auto_in_an_empty_dir_starts_fresh(tmp_path):
    assert manager(tmp_path).start("auto") == 0


def test_a_fresh_start_archives_everything_and_a_rewind_archives_the_later_future(tmp_path):
    m = manager(tmp_path)
    for step in (2, 4, 6):
        m.save(step)
    m.keep_if_best(6, 0.9)
    ckpt_dir = tmp_path / "checkpoints"
    rewound = manager(tmp_path)
    assert rewound.start(str(ckpt_dir / "step_4.pt")) == 4
    assert names(tmp_path) == ["step_2.pt", "step_4.pt"]
    (archive,) = (ckpt_dir / "abandoned").iterdir()
    assert sorted(p.name for p in archive.iterdir()) == ["best.json", "best.pt", "last.pt", "step_6.pt"]
    assert rewound.best is None  # its best.pt was in the abandoned future

    assert manager(tmp_path).start(None) == 0  # a fresh start in the same dir abandons the rest
    assert names(tmp_path) == [] and len(list((ckpt_dir / "abandoned").iterdir())) == 2


def test_start_removes_temp_files_of_an_interrupted_write(tmp_path):
    m = manager(tmp_path)
    m.save(2)
    stale = tmp_path / "checkpoints" / ".last.pt.tmp-12345"
    stale.write_bytes(b"half a checkpoint")
    assert manager(tmp_path).start("auto") == 2
    assert not stale.exists()


def test_start_removes_only_the_temp_files_of_its_own_writes(tmp_path):
    """What only looks like a temp file (a folder, a link, a name segadv never writes) stays."""
    m = manager(tmp_path)
    m.save(2)
    ckpt_dir = tmp_path / "checkpoints"
    (ckpt_dir / ".step_2.pt.tmp-7").mkdir()
    (ckpt_dir / ".notes.txt.tmp-1").write_text("the user's")
    (ckpt_dir / ".best.pt.tmp-9").symlink_to(tmp_path / "elsewhere")
    assert manager(tmp_path).start("auto") == 2
    assert (ckpt_dir / ".step_2.pt.tmp-7").is_dir()
    assert (ckpt_dir / ".notes.txt.tmp-1").read_text() == "the user's"
    assert (ckpt_dir / ".best.pt.tmp-9").is_symlink()


def test_a_folder_or_link_named_like_a_step_file_is_never_moved_nor_removed(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    (ckpt_dir / "step_1.pt").mkdir()
    (ckpt_dir / "step_9.pt").mkdir()
    (ckpt_dir / "step_8.pt").symlink_to(tmp_path / "elsewhere")
    m = manager(tmp_path, every=2, keep_last=1)
    assert m.start("auto") == 0  # a fresh start: nothing of a run to abandon
    for step in (2, 4):
        m.save(step)  # retention keeps one step file of the run's
    assert (ckpt_dir / "step_1.pt").is_dir() and (ckpt_dir / "step_9.pt").is_dir()
    assert (ckpt_dir / "step_8.pt").is_symlink()
    assert not (ckpt_dir / "abandoned").exists()
    assert manager(tmp_path, every=2).start(str(ckpt_dir / "step_4.pt")) == 4  # abandons last.pt alone
    (archive,) = (ckpt_dir / "abandoned").iterdir()
    assert [p.name for p in archive.iterdir()] == ["last.pt"]
    assert (ckpt_dir / "step_9.pt").is_dir()


def test_resume_from_a_file_without_a_state_is_a_user_error(tmp_path):
    manager(tmp_path).save(2)
    ckpt_dir = tmp_path / "checkpoints"
    other = CheckpointManager(tmp_path, {"generator": Weights(), "discriminator": Weights()}, every=2)
    with pytest.raises(UserError, match="lacks discriminator"):
        other.load(str(ckpt_dir / "last.pt"))
    torch.save({"w": torch.zeros(1)}, ckpt_dir / "raw.pt")
    with pytest.raises(UserError, match="not a segadv training checkpoint"):
        manager(tmp_path).load(str(ckpt_dir / "raw.pt"))


def test_a_checkpoint_from_before_stream_positions_assumes_one_batch_a_step(tmp_path):
    from segadv.data.streams import Stream, Streams

    streams = Streams({name: Stream(name, loader=None) for name in ("labeled", "unlabeled")})
    m = CheckpointManager(tmp_path, {"data_streams": streams}, every=1)
    m.save(5)
    path = tmp_path / "checkpoints" / "last.pt"
    torch.save({**read_checkpoint(path), "data_streams": None}, path)
    assert m.load("auto") == path
    assert streams.state_dict() == {"labeled": {"batches": 5}, "unlabeled": {"batches": 5}}


@pytest.mark.parametrize("saved_by", [2, 4])
def test_a_checkpoint_of_another_world_size_is_refused_before_anything_loads(tmp_path, saved_by):
    """The data position and the RNGs are per process: 2 (or 4) -> 1 would see samples twice.
    Older files carry no world_size: their one-RNG-state-per-rank list says it."""
    weights = Weights(1.0)
    manager(tmp_path, weights).save(2)
    path = tmp_path / "checkpoints" / "last.pt"
    ckpt = read_checkpoint(path)
    assert ckpt["world_size"] == 1
    torch.save({**ckpt, "world_size": saved_by}, path)
    fresh = Weights(0.0)
    with pytest.raises(UserError, match=f"saved by a run of {saved_by} processes and this run has 1.*"
                                        f"--nproc-per-node {saved_by}.*init.generator.path="):
        manager(tmp_path, fresh).load("auto")
    assert fresh.value.item() == 0.0
    del ckpt["world_size"]
    torch.save({**ckpt, "rng": [{}] * saved_by}, path)
    with pytest.raises(UserError, match=f"saved by a run of {saved_by} processes"):
        manager(tmp_path, fresh).load(str(path))


def test_the_resume_note_names_the_newest_complete_checkpoint_of_any_kind(tmp_path):
    """A best.pt written after the last last.pt is where a failed run can go on from (by path:
    --resume auto picks last.pt and the step files)."""
    m = manager(tmp_path)
    assert m.resume_note() == "no checkpoint was written before it"
    m.keep_if_best(1, 0.5, 0.9)
    best = tmp_path / "checkpoints" / "best.pt"
    assert m.resume_note() == f"the last complete checkpoint is {best} (step 1; resume: --resume {best})"
    m.save(2)
    assert "last.pt (step 2; resume: --resume auto)" in m.resume_note()
    assert read_checkpoint(best)["evaluation"] == {"step": 1, "mIoU": 0.5, "pixel_acc": 0.9}


def test_a_resume_with_another_config_is_refused_naming_the_key_and_allowed_changes_pass(tmp_path):
    saved = {"data": {"kind": "folder", "batch_size": 8}, "train": {"max_steps": 10}}
    manager_with = lambda config: CheckpointManager(tmp_path, {"generator": Weights()}, every=2, config=config)
    manager_with(saved).save(2)
    with pytest.raises(UserError, match=r"data.kind differs from the checkpoint's \("
                                        r"\"folder\" then, \"synthetic\" now\).* resume with data.kind=\"folder\""):
        manager_with({**saved, "data": {"kind": "synthetic", "batch_size": 8}}).start("auto")
    assert manager_with({**saved, "train": {"max_steps": 20}}).start("auto") == 2  # a documented change
