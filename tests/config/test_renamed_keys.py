"""One name for G's adversarial weight across methods (issue 50): ``loss.lambda_adv``, null by
default, meaning each method's reference default (declared on its class, read through
``Method.adversarial_weight``); the old names (``method.adaptsegnet.lambda_adv_main``, ...) still
read, in a file and as overrides, with a note in the log (segadv/config/renamed.py); a run saved
before the rename resumes and compares equal to the same run started now."""

from __future__ import annotations

import copy
import logging

import pytest
import yaml

from segadv.cli import train as train_cli
from segadv.config import config_from_dict, config_to_dict, load_config
from segadv.config.loading import config_yaml
from segadv.config.renamed import RENAMED_KEYS, apply_renamed_keys
from segadv.config.resume import as_the_schema_reads, check_resumed_config, flatten
from segadv.errors import UserError
from segadv.experiment.runs import read_run_config
from segadv.methods import method_class
from segadv.training.run_dir import resume_config

from conftest import TINY_OVERRIDES
from helpers import TARGET_DATA, UDA_OVERRIDES

NOTES = "segadv.config.renamed"

# method -> what a null loss.lambda_adv is for it (the references' weights; 0: no term, no D)
DEFAULTS = {"supervised": 0.01, "advsemiseg": 0.01, "adaptsegnet": 0.001, "advent": 0.001, "mean_teacher": 0.0,
            "minent": 0.0, "s4gan": 0.0}
# each old key and the method whose section held it
OLD_KEYS = {"adaptsegnet": "method.adaptsegnet.lambda_adv_main", "advent": "method.advent.lambda_adv_main",
            "minent": "method.minent.lambda_adv_main", "mean_teacher": "method.mean_teacher.lambda_adv"}


def method_overrides(name: str) -> list[str]:
    return [f"method.name={name}"] + (["model.discriminator.kind=image"] if name == "s4gan" else [])


def weight(cfg) -> float:
    return method_class(cfg.method.name).adversarial_weight(cfg)


def notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == NOTES]


# ---------------------------------------------------------------------------- the one key, its defaults


@pytest.mark.parametrize("name", DEFAULTS)
def test_null_is_each_methods_reference_default(name):
    cfg = load_config(None, method_overrides(name))
    assert cfg.loss.lambda_adv is None
    assert weight(cfg) == DEFAULTS[name]
    assert method_class(name).resolve_adversarial_weight(None) == DEFAULTS[name]


def test_the_mean_teacher_builds_d_only_with_a_weight_above_0():
    cls = method_class("mean_teacher")
    off = load_config(None, ["method.name=mean_teacher"])
    on = load_config(None, ["method.name=mean_teacher", "loss.lambda_adv=0.01"])
    assert cls.networks(off) == ("generator", "teacher") and not cls.passes_generator_loss_through_discriminator(off)
    assert cls.networks(on) == ("generator", "teacher", "discriminator")
    assert [s.name for s in cls.data_streams(on)] == ["labeled", "unlabeled", "gt"]


def test_a_given_weight_is_read_by_every_method_that_has_the_term():
    for name in ("supervised", "advsemiseg", "adaptsegnet", "advent", "mean_teacher"):
        assert weight(load_config(None, [*method_overrides(name), "loss.lambda_adv=0.25"])) == 0.25


@pytest.mark.parametrize("value", ["0.01", "1"])
def test_minent_refuses_a_weight_above_0_naming_the_key_and_why(value, capsys):
    with pytest.raises(UserError, match=r"loss\.lambda_adv: .*the minent method trains no D: it has no adversarial "
                                        r"term"):
        load_config(None, ["method.name=minent", f"loss.lambda_adv={value}"])
    assert weight(load_config(None, ["method.name=minent", "loss.lambda_adv=0"])) == 0.0  # 0 is what it trains
    assert train_cli.main(["method.name=minent", f"loss.lambda_adv={value}", "--print-config"]) == 2
    assert "loss.lambda_adv" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "0.1"])
def test_s4gan_refuses_any_weight_naming_its_feature_matching_key(value):
    with pytest.raises(UserError, match=r"loss\.lambda_adv: .*s4gan.*method\.s4gan\.lambda_fm"):
        load_config(None, [*method_overrides("s4gan"), f"loss.lambda_adv={value}"])


def test_a_refused_weight_set_after_loading_is_refused_when_the_run_is_checked():
    cfg = load_config(None, ["method.name=minent"])
    cfg.loss.lambda_adv = 0.5
    with pytest.raises(UserError, match=r"loss\.lambda_adv"):
        method_class("minent").check_config(cfg)


def test_print_config_says_what_null_is_for_the_method(capsys):
    assert train_cli.main(["--config", "uda", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "  lambda_adv: null  # null: the adaptsegnet method's default, 0.001\n" in out
    assert yaml.safe_load(out)["loss"]["lambda_adv"] is None  # a comment: still the YAML config.yaml holds
    assert train_cli.main(["--config", "uda", "method.name=mean_teacher", "--print-config"]) == 0
    assert "lambda_adv: null  # null: the mean_teacher method's default, 0\n" in capsys.readouterr().out
    s4gan = config_yaml(load_config(None, method_overrides("s4gan")))
    assert "lambda_adv: null  # null: the s4gan method has no term" in s4gan and "method.s4gan.lambda_fm" in s4gan
    assert "#" not in config_yaml(load_config(None, ["loss.lambda_adv=0.02"])).split("adv_warmup_steps")[0][-40:]


# ---------------------------------------------------------------------------- the old names


@pytest.mark.parametrize("name", OLD_KEYS)
def test_an_old_name_as_an_override_moves_to_loss_lambda_adv_with_a_note(name, caplog):
    old = OLD_KEYS[name]
    with caplog.at_level(logging.WARNING, logger=NOTES):
        cfg = load_config(None, [f"method.name={name}", f"{old}=0"])
    assert cfg.loss.lambda_adv == 0 and weight(cfg) == 0.0
    said = notes(caplog)
    assert len(said) == 1 and old in said[0] and "is now loss.lambda_adv" in said[0]


@pytest.mark.parametrize("name", OLD_KEYS)
def test_an_old_name_in_a_config_file_moves_with_a_note(name, tmp_path, caplog):
    section, key = OLD_KEYS[name].split(".")[1:]
    value = 0.0 if name == "minent" else 0.003
    file = tmp_path / "old.yaml"
    file.write_text(yaml.safe_dump({"method": {"name": name, section: {key: value}}}))
    with caplog.at_level(logging.WARNING, logger=NOTES):
        cfg = load_config(file)
    assert cfg.loss.lambda_adv == value
    assert getattr(cfg.method, section).model_dump().get(key) is None  # no such setting any more
    said = notes(caplog)
    assert len(said) == 1 and OLD_KEYS[name] in said[0] and "loss.lambda_adv" in said[0]


def test_the_issues_command_line_reads_the_old_name(capsys, caplog):
    with caplog.at_level(logging.WARNING, logger=NOTES):
        assert train_cli.main(["--config", "uda", "method.adaptsegnet.lambda_adv_main=0", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["loss"]["lambda_adv"] == 0
    assert any("method.adaptsegnet.lambda_adv_main is now loss.lambda_adv" in n for n in notes(caplog))


def test_another_methods_old_key_is_dropped_with_the_same_note(caplog):
    with caplog.at_level(logging.WARNING, logger=NOTES):
        cfg = load_config("uda", ["method.mean_teacher.lambda_adv=0.5", "method.advent.lambda_adv_main=0.2"])
    assert cfg.method.name == "adaptsegnet" and cfg.loss.lambda_adv is None and weight(cfg) == 0.001
    said = notes(caplog)
    assert len(said) == 2 and all("is now loss.lambda_adv" in n and "dropped" in n for n in said)
    assert any("method.mean_teacher.lambda_adv" in n for n in said)


def test_an_old_and_the_new_key_with_different_values_are_refused_naming_both(capsys):
    with pytest.raises(UserError, match=r"method\.adaptsegnet\.lambda_adv_main \(0\.002\) and loss\.lambda_adv "
                                        r"\(0\.005\)"):
        load_config("uda", ["method.adaptsegnet.lambda_adv_main=0.002", "loss.lambda_adv=0.005"])
    assert train_cli.main(["--config", "uda", "loss.lambda_adv=0.005", "method.adaptsegnet.lambda_adv_main=0.002",
                           "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "method.adaptsegnet.lambda_adv_main" in err and "loss.lambda_adv" in err
    # the same value twice says one thing
    assert load_config("uda", ["method.adaptsegnet.lambda_adv_main=0.002", "loss.lambda_adv=0.002"]).loss.lambda_adv \
        == 0.002


def test_each_file_and_the_command_line_is_a_layer_the_later_one_wins(tmp_path, caplog):
    """A config of the old pattern (configs/mean_teacher_voc.yaml before the rename: its base's
    loss.lambda_adv, AdvSemiSeg's 0.01, under the mean teacher's own key at 0) reads as written: the
    file's old key over its base's new one. Both in one file, or both on the command line, with
    different values, are refused."""
    old_pattern = tmp_path / "mine.yaml"
    old_pattern.write_text("_base_: advsemiseg_voc\nmethod: {name: mean_teacher, mean_teacher: {lambda_adv: 0.0}}\n")
    with caplog.at_level(logging.WARNING, logger=NOTES):
        cfg = load_config(old_pattern)
    assert load_config("advsemiseg_voc").loss.lambda_adv == 0.01
    assert cfg.loss.lambda_adv == 0.0 and method_class("mean_teacher").networks(cfg) == ("generator", "teacher")
    said = notes(caplog)
    assert len(said) == 1 and "mine.yaml: method.mean_teacher.lambda_adv is now loss.lambda_adv" in said[0]
    # the command line over the file, in either name
    assert load_config(old_pattern, ["loss.lambda_adv=0.005"]).loss.lambda_adv == 0.005
    newer = tmp_path / "newer.yaml"
    newer.write_text("_base_: advsemiseg_voc\nmethod: {name: mean_teacher}\nloss: {lambda_adv: 0.02}\n")
    assert load_config(newer, ["method.mean_teacher.lambda_adv=0.03"]).loss.lambda_adv == 0.03
    both = tmp_path / "both.yaml"
    both.write_text("method: {name: mean_teacher, mean_teacher: {lambda_adv: 0.03}}\nloss: {lambda_adv: 0.02}\n")
    with pytest.raises(UserError, match=r"both\.yaml: method\.mean_teacher\.lambda_adv \(0\.03\) and loss\.lambda_adv "
                                        r"\(0\.02\)"):
        load_config(both)


def test_an_old_minent_weight_above_0_is_refused_as_the_new_key_is():
    with pytest.raises(UserError, match=r"loss\.lambda_adv: 1: the minent method"):
        load_config(None, ["method.name=minent", "method.minent.lambda_adv_main=1"])


def test_the_table_names_old_keys_the_schema_no_longer_has_and_new_keys_it_has():
    keys = flatten(config_to_dict(load_config(None)))
    for entry in RENAMED_KEYS:
        assert entry.old not in keys and entry.new in keys
        assert entry.method is None or entry.old.startswith(f"method.{entry.method}.")


# ---------------------------------------------------------------------------- configs saved before the rename


def old_style(cfg, weights=None, loss_lambda_adv=0.01) -> dict:
    """``cfg`` as segadv saved it before the rename: every key explicit, loss.lambda_adv at its old
    schema default (read by supervised and advsemiseg only) and each adaptation method's main weight
    and the mean teacher's in their own sections, at their old defaults unless ``weights`` says."""
    weights = {"adaptsegnet": 0.001, "advent": 0.001, "minent": 0.0, "mean_teacher": 0.0, **(weights or {})}
    data = copy.deepcopy(config_to_dict(cfg))
    data["loss"]["lambda_adv"] = loss_lambda_adv
    for name, key in OLD_KEYS.items():
        section, field = key.split(".")[1:]
        data["method"][section][field] = weights[name]
    return data


@pytest.mark.parametrize("name, old_weights, loss_lambda_adv, expected", [
    ("adaptsegnet", {}, 0.01, 0.001),  # loss.lambda_adv was saved, and unused: the old key wins
    ("adaptsegnet", {"adaptsegnet": 0.0}, 0.01, 0.0),  # the control row
    ("advent", {"advent": 0.002}, 0.01, 0.002),
    ("minent", {}, 0.01, 0.0),
    ("mean_teacher", {"mean_teacher": 0.001}, 0.01, 0.001),
    ("mean_teacher", {}, 0.01, 0.0),
    ("s4gan", {}, 0.01, 0.0),  # disregarded: s4gan never read it
    ("supervised", {}, 0.05, 0.05),  # read before the rename too: kept
    ("advsemiseg", {}, 0.0, 0.0),
])
def test_a_config_saved_before_the_rename_reads_as_it_trained(name, old_weights, loss_lambda_adv, expected, caplog):
    overrides = [*method_overrides(name)] + ([TARGET_DATA] if name in ("adaptsegnet", "advent", "minent") else [])
    saved = old_style(load_config(None, overrides), old_weights, loss_lambda_adv)
    with caplog.at_level(logging.DEBUG, logger=NOTES):
        cfg = config_from_dict(saved, source="an old checkpoint's config")
    assert weight(cfg) == expected
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == NOTES)  # read at each resume: quiet


@pytest.mark.parametrize("name", ["supervised", "advsemiseg", "adaptsegnet", "advent", "minent", "mean_teacher",
                                  "s4gan"])
def test_an_old_saved_config_compares_equal_to_the_same_run_started_now(name):
    now = load_config(None, method_overrides(name))  # loss.lambda_adv null: the method's default
    saved = old_style(now, loss_lambda_adv=0.01)
    assert as_the_schema_reads(saved) == as_the_schema_reads(config_to_dict(now))
    check_resumed_config(saved, config_to_dict(now), checkpoint="old.pt")  # no difference: resumes
    # a run that wrote the default out compares equal too
    explicit = config_to_dict(load_config(None, [*method_overrides(name),
                                                 *([f"loss.lambda_adv={DEFAULTS[name]}"] if name != "s4gan" else [])]))
    check_resumed_config(saved, explicit, checkpoint="old.pt")


def test_an_old_saved_config_with_another_weight_is_refused_at_resume_naming_loss_lambda_adv():
    now = load_config("uda")
    saved = old_style(now, {"adaptsegnet": 0.002})
    with pytest.raises(UserError, match=r"loss\.lambda_adv differs from the checkpoint's \(0\.002 then, 0\.001 now\)"):
        check_resumed_config(saved, config_to_dict(now), checkpoint="old.pt")


def test_the_keys_a_resume_compares_have_no_old_name_left():
    saved = old_style(load_config("uda"))
    read = flatten(as_the_schema_reads(saved))
    assert not any(entry.old in read for entry in RENAMED_KEYS)
    assert set(read) == set(flatten(config_to_dict(load_config("uda"))))


def test_an_old_run_dirs_config_yaml_resumes_and_reads_in_a_table(tmp_path, caplog):
    """A run dir whose config.yaml the old code wrote: a resume without --config reads it (its old
    keys as saved: no conflict with the saved, unused loss.lambda_adv), and a grid's table reads
    the weight it trained with."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = old_style(load_config("uda"), {"adaptsegnet": 0.0})
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    with caplog.at_level(logging.WARNING, logger=NOTES):
        cfg = resume_config(run_dir, "auto", [])
    assert (cfg.method.name, cfg.loss.lambda_adv) == ("adaptsegnet", 0.0)
    assert notes(caplog) == []  # a saved config is no user's mistake
    flat = read_run_config(run_dir)
    assert flat["loss.lambda_adv"] == 0.0 and not any(entry.old in flat for entry in RENAMED_KEYS)


def test_a_new_run_dirs_config_yaml_reads_in_a_table_at_its_methods_weight(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(config_yaml(load_config("uda")))
    assert read_run_config(run_dir)["loss.lambda_adv"] == 0.001


def test_a_saved_config_keeps_a_weight_written_after_the_rename():
    """Saved by this release (no old key in it): its loss.lambda_adv is what the user gave."""
    saved = config_to_dict(load_config("uda", ["loss.lambda_adv=0.004"]))
    assert apply_renamed_keys(saved, saved=True) == saved
    assert weight(config_from_dict(saved)) == 0.004


# ---------------------------------------------------------------------------- a run with an old override


@pytest.mark.slow  # two whole CLI trainings
def test_a_run_with_the_old_name_trains_and_saves_the_new_one(tmp_path, caplog):
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger=NOTES):
        code = train_cli.main(["--run-dir", str(run), "--device-map", "cpu", *UDA_OVERRIDES,
                               "method.adaptsegnet.lambda_adv_main=0.002", "train.max_steps=1", "train.eval_every=1",
                               "checkpoint.every=1", "log.tensorboard=false"])
    assert code == 0
    assert any("method.adaptsegnet.lambda_adv_main is now loss.lambda_adv" in n for n in notes(caplog))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["loss"]["lambda_adv"] == 0.002 and "lambda_adv_main" not in saved["method"]["adaptsegnet"]
    # resumed with the old name again: the same weight, so the same run
    assert train_cli.main(["--run-dir", str(run), "--device-map", "cpu", "--resume", "auto", "train.max_steps=2",
                           "method.adaptsegnet.lambda_adv_main=0.002"]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["max_steps"] == 2


def test_tiny_overrides_leave_the_weight_at_the_methods_default():
    assert weight(load_config(None, [*TINY_OVERRIDES, "method.name=adaptsegnet", TARGET_DATA])) == 0.001
