"""checkpoint.keep_best on the checkpoint manager: the K best evaluations by checkpoint.best_by,
each a file named with its step and score, the ones pushed out removed (only the run's own), and
the ranking across resumes and rewinds. best.pt keeps its meaning throughout. A real run:
tests/training/test_early_stop.py."""

import json
import logging

import pytest
import torch

from segadv.checkpoint import CheckpointManager, read_checkpoint
from segadv.checkpoint.manager import listed, ranked_name


class Weights:
    """A network's stand-in: one tensor, set to the step it was saved at."""

    def __init__(self) -> None:
        self.value = torch.tensor([0.0])

    def state_dict(self):
        return {"w": self.value.clone()}

    def load_state_dict(self, state):
        self.value = state["w"].clone()


def manager(tmp_path, weights=None, **kwargs):
    kwargs.setdefault("every", 100)
    return CheckpointManager(tmp_path, {"generator": weights or Weights()}, config={"run": "test"}, **kwargs)


def files(tmp_path):
    return sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_file())


def evaluate(m, weights, scores, **proxies_of):
    """Each (step, score) evaluated in turn, the weights set to the step first."""
    for step, score in scores:
        weights.value = torch.tensor([float(step)])
        if proxies_of:
            m.keep_if_best(step, 0.5, None, {name: value[step] for name, value in proxies_of.items()})
        else:
            m.keep_if_best(step, score)


def ckpt(tmp_path, name):
    return read_checkpoint(tmp_path / "checkpoints" / name)


def test_names_say_the_step_the_score_and_its_value():
    assert ranked_name(500, "val/mIoU", 0.81234) == "best_step_500_mIoU_0.8123.pt"
    assert ranked_name(40, "proxy/flip_agreement", 0.9) == "best_step_40_flip_agreement_0.9000.pt"
    assert listed({"step": 500, "score": 0.8123, "mIoU": 0.8, "file": "best_step_500_mIoU_0.8123.pt"})
    # A ranking entry that is not keep_best's own name (a path above all) is never taken for one.
    for name in ("../best_step_1_mIoU_0.1000.pt", "best_step_1_mIoU_0.1000.pt/x", "last.pt", "best.pt"):
        assert not listed({"step": 1, "score": 0.1, "mIoU": 0.1, "file": name})


def test_without_keep_best_only_best_pt_is_written_as_before(tmp_path):
    weights = Weights()
    m = manager(tmp_path, weights)
    evaluate(m, weights, [(1, 0.3), (2, 0.5), (3, 0.4)])
    m.save(3)
    assert files(tmp_path) == ["best.json", "best.pt", "last.pt"]
    assert ckpt(tmp_path, "last.pt")["best_kept"] is None


def test_the_k_best_are_kept_named_with_step_and_score_and_the_rest_removed(tmp_path, caplog):
    weights = Weights()
    m = manager(tmp_path, weights, keep_best=2)
    with caplog.at_level(logging.INFO):
        evaluate(m, weights, [(1, 0.3), (2, 0.5)])
        assert files(tmp_path) == ["best.json", "best.pt", "best_step_1_mIoU_0.3000.pt", "best_step_2_mIoU_0.5000.pt"]
        evaluate(m, weights, [(3, 0.4)])  # second best: pushes step 1 out, best.pt stays step 2's
        assert files(tmp_path) == ["best.json", "best.pt", "best_step_2_mIoU_0.5000.pt", "best_step_3_mIoU_0.4000.pt"]
        evaluate(m, weights, [(4, 0.4), (5, 0.35)])  # equal to the worst kept, then below it: nothing written
        assert files(tmp_path)[2:] == ["best_step_2_mIoU_0.5000.pt", "best_step_3_mIoU_0.4000.pt"]
        evaluate(m, weights, [(6, 0.6)])
    assert files(tmp_path) == ["best.json", "best.pt", "best_step_2_mIoU_0.5000.pt", "best_step_6_mIoU_0.6000.pt"]
    # Each file is the state at its evaluation; best.pt and best.json still name the single best.
    for name, step in (("best_step_2_mIoU_0.5000.pt", 2), ("best_step_6_mIoU_0.6000.pt", 6), ("best.pt", 6)):
        assert (ckpt(tmp_path, name)["step"], ckpt(tmp_path, name)["generator"]["w"].item()) == (step, float(step))
    assert json.loads((tmp_path / "checkpoints" / "best.json").read_text()) == {"step": 6, "mIoU": 0.6}
    assert [(e["step"], e["score"], e["file"]) for e in m.kept["files"]] == \
        [(6, 0.6, "best_step_6_mIoU_0.6000.pt"), (2, 0.5, "best_step_2_mIoU_0.5000.pt")]
    assert ckpt(tmp_path, "best_step_6_mIoU_0.6000.pt")["best_kept"] == m.kept  # the file lists itself
    assert "retention (checkpoint.keep_best=2): removed best_step_1_mIoU_0.3000.pt" in caplog.text
    assert "val/mIoU 0.4000 at step 3 is the 2nd best of the run (checkpoint.keep_best=2): " \
           "best_step_3_mIoU_0.4000.pt" in caplog.text
    assert "best val mIoU so far (0.6000 at step 6): best_step_6_mIoU_0.6000.pt, best.pt" in caplog.text


def test_a_label_free_score_ranks_in_its_direction(tmp_path):
    weights = Weights()
    m = manager(tmp_path, weights, keep_best=2, best_by="proxy/entropy")  # lower is better
    entropy = {1: 0.5, 2: 0.2, 3: float("nan"), 4: 0.3, 5: 0.4}
    evaluate(m, weights, [(step, None) for step in entropy], **{"proxy/entropy": entropy})
    assert files(tmp_path) == ["best.json", "best.pt", "best_step_2_entropy_0.2000.pt", "best_step_4_entropy_0.3000.pt"]
    assert ckpt(tmp_path, "best.pt")["step"] == 2


def test_only_files_the_run_wrote_are_removed(tmp_path):
    """A file of the same pattern that the ranking does not list (copied in by hand) stays."""
    (tmp_path / "checkpoints").mkdir()
    mine = tmp_path / "checkpoints" / "best_step_9_mIoU_0.1000.pt"
    mine.write_bytes(b"the user's")
    weights = Weights()
    m = manager(tmp_path, weights, keep_best=1)
    evaluate(m, weights, [(1, 0.3), (2, 0.5)])
    assert files(tmp_path) == ["best.json", "best.pt", "best_step_2_mIoU_0.5000.pt", "best_step_9_mIoU_0.1000.pt"]
    assert mine.read_bytes() == b"the user's"


def test_a_resume_keeps_the_ranking(tmp_path):
    weights = Weights()
    m = manager(tmp_path, weights, keep_best=2)
    evaluate(m, weights, [(2, 0.5), (4, 0.7)])
    m.save(4)
    again = Weights()
    resumed = manager(tmp_path, again, keep_best=2)
    assert resumed.start("auto") == 4
    assert [e["step"] for e in resumed.kept["files"]] == [4, 2]
    evaluate(resumed, again, [(6, 0.6)])  # beats step 2's 0.5, not step 4's 0.7
    assert files(tmp_path) == ["best.json", "best.pt", "best_step_4_mIoU_0.7000.pt", "best_step_6_mIoU_0.6000.pt",
                               "last.pt"]
    assert ckpt(tmp_path, "best.pt")["step"] == 4


def test_a_lower_keep_best_at_a_resume_removes_the_files_beyond_it_after_the_next_checkpoint(tmp_path):
    weights = Weights()
    m = manager(tmp_path, weights, keep_best=3)
    evaluate(m, weights, [(1, 0.3), (2, 0.5), (3, 0.4)])
    m.save(3)
    resumed = manager(tmp_path, Weights(), keep_best=1)
    resumed.start("auto")
    assert len(files(tmp_path)) == 6  # a start removes nothing
    resumed.keep_if_best(4, 0.1)  # enters nothing: the ranking shrinks, the files wait for a checkpoint
    assert len(files(tmp_path)) == 6
    resumed.save(4)
    assert files(tmp_path) == ["best.json", "best.pt", "best_step_2_mIoU_0.5000.pt", "last.pt"]
    assert ckpt(tmp_path, "last.pt")["best_kept"]["files"][0]["file"] == "best_step_2_mIoU_0.5000.pt"


def test_a_rewind_abandons_the_later_files_and_ranks_without_those_gone(tmp_path, caplog):
    weights = Weights()
    m = manager(tmp_path, weights, keep_best=2, every=2)
    evaluate(m, weights, [(2, 0.3)])
    m.save(2)
    evaluate(m, weights, [(4, 0.5)])
    m.save(4)
    evaluate(m, weights, [(6, 0.6)])  # pushes step 2's file out
    m.save(6)
    rewound = manager(tmp_path, Weights(), keep_best=2, every=2)
    with caplog.at_level(logging.WARNING):
        assert rewound.start(str(tmp_path / "checkpoints" / "step_4.pt")) == 4
    (archive,) = (tmp_path / "checkpoints" / "abandoned").iterdir()
    assert "best_step_6_mIoU_0.6000.pt" in {p.name for p in archive.iterdir()}
    assert files(tmp_path) == ["best_step_4_mIoU_0.5000.pt", "step_2.pt", "step_4.pt"]
    # step_4.pt listed steps 4 and 2; step 2's file was removed by the abandoned future.
    assert [e["step"] for e in rewound.kept["files"]] == [4]
    assert "best_step_2_mIoU_0.3000.pt, ranked among the best by the checkpoint resumed from, is not in" in caplog.text


def test_a_start_moves_only_the_ranked_files_the_run_wrote(tmp_path, caplog):
    """A file or folder named like keep_best's that no checkpoint of the run lists (the user's,
    another run's) is never moved: left where it is and named once."""
    weights = Weights()
    m = manager(tmp_path, weights, keep_best=2, every=2)
    evaluate(m, weights, [(2, 0.3)])
    m.save(2)
    evaluate(m, weights, [(4, 0.5)])  # the abandoned future's file: moved
    ckpt_dir = tmp_path / "checkpoints"
    (ckpt_dir / "best_step_5_val_mIoU_0.9999.pt").write_bytes(b"the user's")
    (ckpt_dir / "best_step_6_mIoU_0.9000.pt").mkdir()
    (ckpt_dir / "best_step_7_mIoU_0.8000.pt").symlink_to(ckpt_dir / "best_step_4_mIoU_0.5000.pt")
    other = CheckpointManager(tmp_path / "other", {"generator": Weights()}, config={"run": "another"}, every=2,
                              keep_best=1)
    other.keep_if_best(8, 0.7)  # a ranked file of another run, copied in
    (tmp_path / "other" / "checkpoints" / "best_step_8_mIoU_0.7000.pt").rename(ckpt_dir / "best_step_8_mIoU_0.7000.pt")
    rewound = manager(tmp_path, Weights(), keep_best=2, every=2)
    with caplog.at_level(logging.WARNING):
        assert rewound.start(str(ckpt_dir / "step_2.pt")) == 2
    (archive,) = (ckpt_dir / "abandoned").iterdir()
    assert sorted(p.name for p in archive.iterdir()) == ["best.json", "best.pt", "best_step_4_mIoU_0.5000.pt",
                                                         "last.pt"]
    assert (ckpt_dir / "best_step_5_val_mIoU_0.9999.pt").read_bytes() == b"the user's"
    assert (ckpt_dir / "best_step_6_mIoU_0.9000.pt").is_dir()
    assert (ckpt_dir / "best_step_7_mIoU_0.8000.pt").is_symlink()
    assert (ckpt_dir / "best_step_8_mIoU_0.7000.pt").is_file()
    [warning] = [r.getMessage() for r in caplog.records if "named like checkpoint.keep_best" in r.getMessage()]
    assert warning.startswith("best_step_8_mIoU_0.7000.pt, best_step_7_mIoU_0.8000.pt, best_step_6_mIoU_0.9000.pt, "
                              "best_step_5_val_mIoU_0.9999.pt in ")
    assert warning.endswith("left as they are")


def test_resume_auto_in_a_dir_of_only_a_users_ranked_file_moves_nothing(tmp_path, caplog):
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    (ckpt_dir / "best_step_5_val_mIoU_0.9999.pt").write_bytes(b"the user's")
    with caplog.at_level(logging.WARNING):
        assert manager(tmp_path, keep_best=2).start("auto") == 0
    assert files(tmp_path) == ["best_step_5_val_mIoU_0.9999.pt"]
    assert not (ckpt_dir / "abandoned").exists()
    assert "best_step_5_val_mIoU_0.9999.pt in " in caplog.text


def test_a_ranking_by_another_score_leaves_its_files_and_starts_over(tmp_path, caplog):
    weights = Weights()
    m = manager(tmp_path, weights, keep_best=1)
    evaluate(m, weights, [(2, 0.5)])
    m.save(2)
    by_snd = manager(tmp_path, Weights(), keep_best=1, best_by="proxy/snd")
    with caplog.at_level(logging.WARNING):
        by_snd.start("auto")
    assert by_snd.kept == {"by": "proxy/snd", "files": []}
    assert "ranked by val/mIoU, this run ranks by proxy/snd" in caplog.text
    by_snd.keep_if_best(4, 0.1, None, {"proxy/snd": 2.0})
    assert files(tmp_path) == ["best.json", "best.pt", "best_step_2_mIoU_0.5000.pt", "best_step_4_snd_2.0000.pt",
                               "last.pt"]


@pytest.mark.parametrize("keep_best", [None, 2])
def test_a_checkpoint_written_before_keep_best_resumes(tmp_path, keep_best):
    m = manager(tmp_path)
    m.save(2)
    state = ckpt(tmp_path, "last.pt")
    del state["best_kept"]
    torch.save(state, tmp_path / "checkpoints" / "last.pt")
    resumed = manager(tmp_path, keep_best=keep_best)
    assert resumed.start("auto") == 2
    assert resumed.kept == (None if keep_best is None else {"by": "val/mIoU", "files": []})


def test_the_resume_note_names_a_ranked_file_by_path(tmp_path):
    m = manager(tmp_path, keep_best=2)
    m.keep_if_best(1, 0.5)
    m.keep_if_best(2, 0.4)  # ranked, not the best: the newest complete checkpoint
    ranked = tmp_path / "checkpoints" / "best_step_2_mIoU_0.4000.pt"
    assert m.resume_note().endswith(f"(step 2; resume: --resume {ranked})")


def test_the_room_check_counts_the_kept_files(tmp_path, monkeypatch):
    m = manager(tmp_path, keep_best=4, keep_last=1)
    (tmp_path / "checkpoints").mkdir()
    usage = type("Usage", (), {"free": 0})()
    monkeypatch.setattr("segadv.checkpoint.manager.shutil.disk_usage", lambda _: usage)
    problem = m._too_small(1 << 20, 10)
    assert "8 files of about 1.0 MiB (1 step_<N>.pt kept by checkpoint.keep_last=1, last.pt, best.pt, " \
           "4 best_step_<N>_*.pt kept by checkpoint.keep_best, one temp file)" in problem
    assert "lower checkpoint.keep_best" in problem
