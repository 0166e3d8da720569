"""Config loading: inheritance, overrides, error messages, round trips and atomic writes; shipped
configs by name and --list-configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import segadv.fsutil as fsutil
from segadv.config import (
    CONFIGS_DIR,
    DEFAULT_CONFIG_PATH,
    Config,
    config_from_dict,
    config_names,
    config_to_dict,
    dump_config,
    load_config,
)
from segadv.errors import UserError
from segadv.fsutil import atomic_write_bytes, atomic_write_text


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path | None, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(UserError) as info:
        load_config(path, overrides)
    return str(info.value)


# ----------------------------------------------------------------------------- defaults and files


def test_empty_file_gives_schema_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path / "empty.yaml", "# nothing\n")) == Config()


def test_embedded_default_loads() -> None:
    assert DEFAULT_CONFIG_PATH == CONFIGS_DIR / "default.yaml"
    assert DEFAULT_CONFIG_PATH.is_file()
    assert isinstance(load_config(None), Config)


def test_file_values_and_partial_optimizer_section(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.yaml",
        "train: {max_steps: 50}\noptim:\n  generator:\n    lr: 1e-3\n",
    )
    cfg = load_config(path)
    assert cfg.train.max_steps == 50
    assert cfg.train.eval_every == Config().train.eval_every
    # a partial optimizer mapping merges into the default (name/lr are required fields)
    assert cfg.optim.generator.lr == pytest.approx(1e-3)
    assert cfg.optim.generator.name == Config().optim.generator.name


def test_missing_file(tmp_path: Path) -> None:
    msg = load_error(tmp_path / "nope.yaml")
    assert "not found" in msg and "nope.yaml" in msg


def test_directory_is_not_a_config(tmp_path: Path) -> None:
    assert str(tmp_path.name) in load_error(tmp_path)


def test_yaml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "train:\n  max_steps: [1, 2\n")
    msg = load_error(path)
    assert "bad.yaml" in msg and "line" in msg and "column" in msg


def test_duplicate_key_rejected(tmp_path: Path) -> None:
    path = write(tmp_path / "dup.yaml", "train:\n  seed: 1\n  seed: 2\n")
    msg = load_error(path)
    assert "dup.yaml" in msg and "duplicate key 'seed'" in msg and "line 3" in msg


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    msg = load_error(write(tmp_path / "list.yaml", "- 1\n- 2\n"))
    assert "list.yaml" in msg and "mapping" in msg


# ----------------------------------------------------------------------------- inheritance


def test_single_base_relative_to_including_file(tmp_path: Path) -> None:
    write(tmp_path / "bases" / "base.yaml", "train: {max_steps: 10, seed: 3}\n")
    child = write(tmp_path / "exp" / "child.yaml", "_base_: ../bases/base.yaml\ntrain: {seed: 4}\n")
    cfg = load_config(child)
    assert (cfg.train.max_steps, cfg.train.seed) == (10, 4)


def test_base_list_merges_in_order_then_own_keys(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "train: {max_steps: 1, seed: 1}\ndata: {batch_size: 2}\n")
    write(tmp_path / "b.yaml", "train: {seed: 2}\n")
    child = write(tmp_path / "c.yaml", "_base_: [a.yaml, b.yaml]\ndata: {num_workers: 0}\n")
    cfg = load_config(child)
    assert (cfg.train.max_steps, cfg.train.seed) == (1, 2)
    assert (cfg.data.batch_size, cfg.data.num_workers) == (2, 0)


def test_recursive_bases_and_list_replacement(tmp_path: Path) -> None:
    write(tmp_path / "root.yaml", "data: {folder: {image_suffixes: [.png, .jpg]}, batch_size: 5}\n")
    write(tmp_path / "mid.yaml", "_base_: root.yaml\ndata: {folder: {image_suffixes: [.tif]}}\n")
    cfg = load_config(write(tmp_path / "leaf.yaml", "_base_: mid.yaml\n"))
    assert cfg.data.folder.image_suffixes == [".tif"]  # lists replace, never merge
    assert cfg.data.batch_size == 5


def test_delete_replaces_base_mapping(tmp_path: Path) -> None:
    write(tmp_path / "base.yaml", "optim:\n  generator: {name: sgd, lr: 0.1, weight_decay: 0.5}\n")
    child = write(
        tmp_path / "child.yaml",
        "_base_: base.yaml\noptim:\n  generator: {_delete_: true, name: adam, lr: 0.2}\n",
    )
    gen = load_config(child).optim.generator
    assert (gen.name, gen.lr) == ("adam", 0.2)
    # replaced, not merged: neither the base's nor the section default's 5e-4 survives
    assert gen.weight_decay == 0.0


def test_delete_false_merges(tmp_path: Path) -> None:
    write(tmp_path / "base.yaml", "train: {max_steps: 7}\n")
    child = write(tmp_path / "child.yaml", "_base_: base.yaml\ntrain: {_delete_: false, seed: 9}\n")
    cfg = load_config(child)
    assert (cfg.train.max_steps, cfg.train.seed) == (7, 9)


def test_base_cycle_is_user_error(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "_base_: b.yaml\n")
    write(tmp_path / "b.yaml", "_base_: a.yaml\n")
    msg = load_error(tmp_path / "a.yaml")
    assert "cyclic" in msg and "a.yaml" in msg and "b.yaml" in msg


def test_missing_base_names_both_files(tmp_path: Path) -> None:
    msg = load_error(write(tmp_path / "child.yaml", "_base_: gone.yaml\n"))
    assert "gone.yaml" in msg and "child.yaml" in msg


# ----------------------------------------------------------------------------- shipped configs by name

SHIPPED = ["adaptsegnet_gta5_cityscapes", "adaptsegnet_gta5_cityscapes_reference", "advent_gta5_cityscapes",
           "advent_gta5_cityscapes_reference", "advsemiseg_voc", "advsemiseg_voc_reference", "cityscapes",
           "dacs_gta5_cityscapes", "default", "dinov2_tiny", "dinov3_tiny", "folder", "folder_scratch", "gta5",
           "mean_teacher_dinov2_gta5_cityscapes", "mean_teacher_dinov2_voc", "mean_teacher_voc", "pretext", "s4gan_voc",
           "s4gan_voc_reference", "semi", "synthetic", "uda", "unimatch_v2_dinov2_cityscapes", "unimatch_v2_dinov2_voc",
           "unimatch_voc", "voc"]


def test_configs_dir_is_the_checkouts_configs() -> None:
    # PYTHONPATH on a checkout (segadv.configs does not import) and an editable install of it
    # both find <checkout>/configs; the wheel's segadv/configs is tests/integration/test_packaging.py's.
    assert CONFIGS_DIR == Path(__file__).resolve().parents[2] / "configs"
    assert config_names() == SHIPPED


def test_another_checkouts_configs_are_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """segadv imported from this checkout through PYTHONPATH while another checkout is installed
    editable: that install's finder answers segadv.configs with its own configs/."""
    from segadv.config import shipped

    monkeypatch.setattr(shipped.importlib.resources, "files", lambda name: tmp_path / "configs")
    assert shipped._configs_dir() == CONFIGS_DIR


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_name_is_its_file(name: str) -> None:
    assert load_config(name) == load_config(CONFIGS_DIR / f"{name}.yaml")


def test_an_existing_file_wins_over_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "semi", "train: {max_steps: 7}\n")
    assert load_config("semi").train.max_steps == 7


def test_base_by_name(tmp_path: Path) -> None:
    path = write(tmp_path / "mine.yaml", "_base_: semi\ntrain: {max_steps: 7}\n")
    assert load_config(path) == load_config("semi", ["train.max_steps=7"])


def test_unknown_name_lists_the_shipped_ones(tmp_path: Path) -> None:
    msg = load_error(Path("semii"))
    assert "unknown config 'semii'" in msg and ", ".join(SHIPPED) in msg
    msg = load_error(write(tmp_path / "child.yaml", "_base_: semii\n"))
    assert "child.yaml" in msg and "unknown config 'semii'" in msg and "semi, synthetic" in msg


def test_a_path_is_never_taken_for_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no configs/ here: configs/semi.yaml and semi.yaml are missing files
    for ref in ("semi.yaml", "configs/semi.yaml"):
        msg = load_error(Path(ref))
        assert "config file not found" in msg and ref in msg
        # the clone's path, run elsewhere (a wheel install): the shipped name is suggested
        assert "the shipped config of that name works from any directory: --config semi" in msg
    assert "shipped config" not in load_error(Path("configs/nothing_shipped.yaml"))


def _cli_mains():
    from segadv.cli.ckpt import main as ckpt_main
    from segadv.cli.data import main as data_main
    from segadv.cli.eval import main as eval_main
    from segadv.cli.export import main as export_main
    from segadv.cli.predict import main as predict_main
    from segadv.cli.train import main as train_main

    return {"segadv-train": (train_main, []), "segadv-eval": (eval_main, []),
            "segadv-export": (export_main, []), "segadv-predict": (predict_main, []),
            "segadv-data": (data_main, ["check"]), "segadv-ckpt": (ckpt_main, ["convert"])}


@pytest.mark.parametrize("cli", ["segadv-train", "segadv-eval", "segadv-export", "segadv-predict", "segadv-data",
                                 "segadv-ckpt"])
def test_every_config_taking_cli_lists_the_shipped_configs(cli: str, capsys: pytest.CaptureFixture) -> None:
    main, sub = _cli_mains()[cli]
    with pytest.raises(SystemExit) as info:
        main([*sub, "--list-configs"])
    assert info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == SHIPPED
    assert lines[SHIPPED.index("default")].split(None, 1)[1].startswith("The embedded default")


def test_train_with_an_unknown_name_exits_2_listing_names(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from segadv.cli.train import main as train_main

    assert train_main(["--config", "nope", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "unknown config 'nope'" in err and ", ".join(SHIPPED) in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- overrides


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    return write(tmp_path / "empty.yaml", "")


def test_overrides_parse_values(empty: Path) -> None:
    cfg = load_config(
        empty,
        [
            "train.max_steps=4",
            "optim.generator.lr=1e-3",
            "optim.discriminator.lr=2.5E-4",
            "train.deterministic=true",
            "data.mean=[0, 1, 0]",
            "device_map=g:0,d:0",
            "model.generator.encoder_weights=null",
            "run_dir=runs/x=y",
        ],
    )
    assert cfg.train.max_steps == 4
    assert isinstance(cfg.optim.generator.lr, float) and cfg.optim.generator.lr == 0.001
    assert cfg.optim.discriminator.lr == 2.5e-4
    assert cfg.train.deterministic is True
    assert cfg.data.mean == [0.0, 1.0, 0.0]
    assert cfg.device_map == "g:0,d:0"
    assert cfg.model.generator.encoder_weights is None
    assert cfg.run_dir == "runs/x=y"  # split on the first '=' only


def test_exponent_float_in_yaml_file(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path / "c.yaml", "loss: {lambda_adv: 1e-3}\n"))
    assert cfg.loss.lambda_adv == 0.001


def test_int_accepted_for_float_field(empty: Path) -> None:
    cfg = load_config(empty, ["optim.generator.lr=1"])
    assert cfg.optim.generator.lr == 1.0 and isinstance(cfg.optim.generator.lr, float)


def test_later_override_wins_and_beats_file(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "train: {seed: 1}\n")
    assert load_config(path, ["train.seed=2", "train.seed=3"]).train.seed == 3


def test_override_without_equals(empty: Path) -> None:
    msg = load_error(empty, ("train.max_steps",))
    assert "train.max_steps" in msg and "KEY=VALUE" in msg


def test_override_through_non_mapping(empty: Path) -> None:
    msg = load_error(empty, ("train.seed.x=1",))
    assert "train.seed" in msg and "not a mapping" in msg


def test_override_bad_yaml_value(empty: Path) -> None:
    assert "cannot parse" in load_error(empty, ("data.mean=[1,",))


# ----------------------------------------------------------------------------- validation messages


def test_unknown_nested_key_from_override_suggests(empty: Path) -> None:
    msg = load_error(empty, ("train.max_stpes=3",))
    assert msg.startswith("invalid config (")
    assert "+ overrides" in msg
    assert "train.max_stpes: unknown key; did you mean 'train.max_steps'?" in msg


def test_unknown_top_level_key_in_file_suggests(tmp_path: Path) -> None:
    msg = load_error(write(tmp_path / "c.yaml", "trian: {seed: 1}\n"))
    assert "c.yaml" in msg
    assert "trian: unknown key; did you mean 'train'?" in msg


def test_unknown_key_without_close_match_lists_valid_keys(empty: Path) -> None:
    msg = load_error(empty, ("checkpoint.zzz=1",))
    assert "checkpoint.zzz: unknown key" in msg and "every" in msg


def test_wrong_type_names_path_expected_and_got(empty: Path) -> None:
    msg = load_error(empty, ("data.batch_size=4x", "data.mean=[1, a]"))
    assert "data.batch_size: expected int, got str '4x'" in msg
    assert "data.mean[1]: expected float, got str 'a'" in msg


def test_all_problems_in_one_error(empty: Path) -> None:
    msg = load_error(empty, ("train.seed=1.5", "model.generator.arch=unet", "loss.lambda_adv=-1"))
    assert len(msg.splitlines()) == 4
    assert "train.seed: expected int, got float 1.5" in msg
    assert ("model.generator.arch: expected 'deeplabv3', 'deeplabv3plus', 'deeplabv3plus_unimatch', 'deeplabv2', "
            "'dinov2' or 'dinov3'" in msg)
    assert "loss.lambda_adv: must be greater than or equal to 0" in msg


# ----------------------------------------------------------------------------- round trip, dump


def test_dict_round_trip(empty: Path) -> None:
    cfg = load_config(empty, ["train.max_steps=3", "optim.generator.lr=1e-5"])
    data = config_to_dict(cfg)
    assert yaml.safe_load(yaml.safe_dump(data)) == data  # plain data
    assert config_from_dict(data) == cfg


def test_config_from_dict_errors_are_user_errors() -> None:
    expected = r"invalid config \(checkpoint x\.pt\):\n  train\.max_stpes: unknown key"
    with pytest.raises(UserError, match=expected):
        config_from_dict({"train": {"max_stpes": 1}}, source="checkpoint x.pt")


def test_dump_then_load_is_equal(tmp_path: Path, empty: Path) -> None:
    cfg = load_config(empty, ["optim.discriminator.lr=1e-7", "data.val_transforms=[{name: Blur}]"])
    out = tmp_path / "run" / "config.yaml"
    out.parent.mkdir()
    dump_config(cfg, out)
    assert load_config(out) == cfg
    assert [p.name for p in out.parent.iterdir()] == ["config.yaml"]


# ----------------------------------------------------------------------------- the method section


def test_method_section_errors_name_the_key(empty: Path) -> None:
    msg = load_error(empty, ("method.name=advsemi", "method.advsemiseg.semi_strat=3", "method.advsemisg.x=1",
                             "method.s4gan.threshold=2"))
    assert ("method.name: expected 'supervised', 'advsemiseg', 's4gan', 'adaptsegnet', 'advent', 'minent', "
            "'mean_teacher' or 'unimatch', got str 'advsemi'") in msg
    assert "method.advsemiseg.semi_strat: unknown key; did you mean 'method.advsemiseg.semi_start'?" in msg
    assert "method.advsemisg: unknown key; did you mean 'method.advsemiseg'?" in msg
    assert "method.s4gan.threshold: must be less than or equal to 1" in msg


def test_every_methods_section_is_kept_and_survives_a_round_trip(tmp_path: Path, empty: Path) -> None:
    import pickle

    cfg = load_config(empty, ["method.name=advent", "method.advent.target_batch_size=3",
                              "method.advsemiseg.semi_start=7"])
    data = config_to_dict(cfg)
    assert set(data["method"]) == {"name", "advsemiseg", "s4gan", "adaptsegnet", "advent", "minent", "mean_teacher",
                                   "unimatch"}
    assert cfg.method.advent.target_batch_size == 3 and cfg.method.advsemiseg.semi_start == 7
    assert config_from_dict(data) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # segadv-plan --measure hands it to a spawned process
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    cfg.method.name = "minent"  # assignment is validated like a file's value
    with pytest.raises(ValueError, match="'minent'"):
        cfg.method.name = "minnet"


def test_the_method_section_validates_without_importing_torch() -> None:
    """The methods' declarations are torch-free: a config (and --print-config) loads in a blink."""
    import subprocess
    import sys

    code = ("import sys; from segadv.config import load_config, config_to_dict\n"
            "cfg = load_config(None, ['method.name=advent', 'method.s4gan.threshold=0.5'])\n"
            "assert config_to_dict(cfg)['method']['s4gan']['threshold'] == 0.5\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ----------------------------------------------------------------------------- atomic writes


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old")
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_atomic_write_failure_keeps_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old")

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(fsutil.os, failing, boom)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    assert not any(p.name.startswith(".f.txt.tmp-") for p in tmp_path.iterdir())


@pytest.mark.parametrize("value", ["x", "[]", "[0, 2]", "[1.5]"])
def test_aspp_v2_rates_is_a_name_or_a_list_of_rates_in_one_message(empty: Path, value: str) -> None:
    msg = load_error(empty, (f"model.generator.aspp_v2_rates={value}",))
    assert len(msg.splitlines()) == 2
    assert "model.generator.aspp_v2_rates: expected 'paper', 'early_return' or a non-empty list of rates" in msg


def test_aspp_v2_rates_takes_names_and_lists(empty: Path) -> None:
    assert load_config(empty, ["model.generator.aspp_v2_rates=early_return"]).model.generator.aspp_v2_rates == \
        "early_return"
    assert load_config(empty, ["model.generator.aspp_v2_rates=[1, 2]"]).model.generator.aspp_v2_rates == [1, 2]
