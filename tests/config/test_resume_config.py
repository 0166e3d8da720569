"""What a resume may change (segadv/config/resume.py): a key added to the schema after a run was
saved counts as its default, so a later release resumes the run; a real change is still refused."""

import pytest

from segadv.config import Config, config_to_dict
from segadv.config.resume import check_resumed_config
from segadv.errors import UserError


def saved_before(key: str) -> dict:
    """The current defaults as a config written before ``key`` (dotted) existed."""
    config = config_to_dict(Config())
    *path, leaf = key.split(".")
    section = config
    for part in path:
        section = section[part]
    del section[leaf]
    return config


def test_a_key_the_saved_config_lacks_counts_as_its_default(tmp_path):
    now = config_to_dict(Config())
    check_resumed_config(saved_before("model.generator.layout"), now, tmp_path / "last.pt")


def test_a_key_the_saved_config_lacks_set_to_another_value_is_refused(tmp_path):
    now = config_to_dict(Config())
    now["model"]["generator"]["layout"] = "caffe"
    with pytest.raises(UserError, match="model.generator.layout differs"):
        check_resumed_config(saved_before("model.generator.layout"), now, tmp_path / "last.pt")


def test_a_key_added_inside_a_section_the_saved_config_holds_counts_as_its_default(tmp_path):
    """A run with a target saved before data.normalization existed: its target_data section lacks
    the key, which the schema reads as its default."""
    from segadv.config import load_config

    now = config_to_dict(load_config("uda"))
    saved = config_to_dict(load_config("uda"))
    del saved["target_data"]["normalization"], saved["target_data"]["val_input_size"]
    check_resumed_config(saved, now, tmp_path / "last.pt")
    now["target_data"]["normalization"] = "caffe_bgr"
    with pytest.raises(UserError, match="target_data.normalization differs"):
        check_resumed_config(saved, now, tmp_path / "last.pt")


def test_null_defaults_are_compared_by_the_values_they_stand_for(tmp_path):
    # a null stream batch size is data.batch_size, as a null lambda_adv is its method's default
    from segadv.config import load_config

    base = ["method.name=mean_teacher", "data.batch_size=2"]
    saved = config_to_dict(load_config(None, base))
    assert saved["method"]["mean_teacher"]["unlabeled_batch_size"] is None
    check_resumed_config(saved, config_to_dict(load_config(None, [*base, "method.mean_teacher.unlabeled_batch_size=2"])),
                         tmp_path / "last.pt")
    check_resumed_config(saved, config_to_dict(load_config(None, [*base, "loss.lambda_adv=0"])), tmp_path / "last.pt")
    with pytest.raises(UserError, match=r"method.mean_teacher.unlabeled_batch_size differs .*\(2 then, 4 now\)"):
        check_resumed_config(saved, config_to_dict(load_config(None, [*base, "method.mean_teacher.unlabeled_batch_size=4"])),
                             tmp_path / "last.pt")


def test_the_test_split_may_change_at_resume_training_never_reads_it(tmp_path):
    from segadv.config import load_config

    saved = config_to_dict(load_config("uda"))
    now = config_to_dict(load_config("uda", ["data.test=test", "data.synthetic.test_size=7", "target_data.test=test",
                                             "data.folder.test={images: a, masks: b}"]))
    check_resumed_config(saved, now, tmp_path / "last.pt")
    now["data"]["synthetic"]["val_size"] = 7  # the val split is the run's: refused as before
    with pytest.raises(UserError, match="data.synthetic.val_size differs"):
        check_resumed_config(saved, now, tmp_path / "last.pt")


def test_poly_lag_is_not_changed_at_resume(tmp_path):
    """It moves every later step's lr: a run saved before it existed resumes at 0, its default, only."""
    now = config_to_dict(Config())
    check_resumed_config(saved_before("optim.generator.poly_lag"), now, tmp_path / "last.pt")
    now["optim"]["generator"]["poly_lag"] = 1
    with pytest.raises(UserError, match="optim.generator.poly_lag differs"):
        check_resumed_config(saved_before("optim.generator.poly_lag"), now, tmp_path / "last.pt")
