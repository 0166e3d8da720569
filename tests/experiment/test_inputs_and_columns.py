"""Fast checks of segadv-experiment without training: ``run`` and ``run --dry-run`` refuse a grid
whose runs would miss a file or a data folder at their start (every problem named with its rows,
before any run), and ``table`` shows only the config keys that differ between the runs that read
them, compactly."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from segadv.cli import experiment
from segadv.config import dump_config, load_config
from segadv.errors import UserError
from segadv.experiment import launcher
from segadv.experiment.grid import load_grid
from segadv.experiment.table import WIDTH, compact
from segadv.methods import method_class
from segadv.monitor.status import RunStatus, Score
from segadv.training.preflight import check_files, missing_files

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = str(ROOT / "configs" / "default.yaml")


@pytest.fixture
def no_runs(monkeypatch):
    monkeypatch.setattr(launcher, "run_trainer", lambda *a, **k: pytest.fail("nothing may run"))


def write_grid(path, rows, seeds=(0,), **extra):
    path.write_text(yaml.safe_dump({"name": "t", "seeds": list(seeds), "rows": rows, **extra}, sort_keys=False))
    return path


def finished(run_dir, overrides=()):
    """A run dir as a finished run of ``default.yaml`` with ``overrides`` leaves it."""
    run_dir.mkdir(parents=True)
    dump_config(load_config(DEFAULT, list(overrides)), run_dir / "config.yaml")
    score = Score(step=4, mIoU=0.5, pixel_acc=0.9)
    (run_dir / "status.json").write_text(RunStatus(
        outcome="finished", step=4, max_steps=4, start_step=0, final=score, best=score, exit_code=0, wall_s=1.0,
        total_wall_s=1.0, started_at="2026-11-27T00:00:00+00:00", segadv_version="test").model_dump_json())


# ------------------------------------------------------------------ run: the inputs, checked first



def refusals(grid, capsys):
    """``segadv-experiment run`` with and without --dry-run, each refused (exit 2, nothing on
    stdout, no traceback): the lines of its message, for each."""
    for extra in (["--dry-run"], []):
        assert experiment.main(["run", str(grid), "--out", "out", *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "Traceback" not in captured.err
        yield captured.err.splitlines()

def test_every_missing_input_is_named_with_its_rows_before_any_run(tmp_path, monkeypatch, capsys, no_runs):
    """A warm start every row reads (common_overrides), a data root, a target's root and local
    encoder weights, all missing: --dry-run and run both exit 2 naming each (key, path, rows), and
    nothing is written."""
    monkeypatch.chdir(tmp_path)
    pretext = "runs/pretext/checkpoints/last.pt"
    grid = write_grid(tmp_path / "grid.yaml", seeds=[0, 1], common_overrides=[f"init.generator.path={pretext}"], rows=[
        {"name": "source only", "config": DEFAULT, "overrides": ["loss.lambda_adv=0"]},
        {"name": "own images", "config": "folder", "overrides": ["data.root=mine",
                                                                 "model.generator.encoder_weights=weights/enc.pth"]},
        {"name": "adapted", "config": "uda", "overrides": ["target_data.kind=folder", "target_data.num_classes=5",
                                                           "target_data.root=target"]},
    ])
    for lines in refusals(grid, capsys):
        assert lines[0] == "error: grid t: 4 problem(s) their runs' starts would refuse, so no run was started:"
        assert lines[1:] == [
            f"every row (3): init.generator.path: checkpoint not found: {pretext}",
            "row 'own images': model.generator.encoder_weights: file not found: weights/enc.pth",
            "row 'own images': data.root: mine does not exist",
            "row 'adapted': target_data: data.root: target does not exist",
        ]
        assert not (tmp_path / "out").exists()


def test_every_row_goes_through_its_trainers_start_checks_before_any_run(tmp_path, monkeypatch, capsys, no_runs):
    """Rows whose configs load and whose files are there, but whose trainer's start refuses them
    (segadv/training/preflight.py check_config and check_data, the functions segadv-train runs):
    a DINOv2 row at 50 px, UniMatch with a target, a device map with an empty stage, a label-free
    early-stop score on a supervised run. --dry-run and run both exit 2 naming every row's problem
    at once; nothing is written; the row that is fine is not named."""
    from segadv.parallel import parse_device_map
    from segadv.training.preflight import check_config

    monkeypatch.chdir(tmp_path)
    rows = [
        {"name": "dinov2 at 50 px", "config": "dinov2_tiny",
         "overrides": ["data.synthetic.image_size=50", "target_data.synthetic.image_size=50"]},
        {"name": "unimatch adapted", "config": "semi", "overrides": ["method.name=unimatch",
                                                                     "target_data={kind: synthetic}"]},
        {"name": "split on the cpu", "config": DEFAULT, "overrides": ["device_map=g:cpu//cpu"]},
        {"name": "proxy watched", "config": DEFAULT, "overrides": ["method.name=supervised",
                                                                   "train.early_stop.monitor=proxy/entropy"]},
        {"name": "fine", "config": DEFAULT},
    ]
    grid = write_grid(tmp_path / "grid.yaml", rows=rows)
    for lines in refusals(grid, capsys):
        assert lines[0] == "error: grid t: 4 problem(s) their runs' starts would refuse, so no run was started:"
        assert [line.partition(": ")[0] for line in lines[1:]] == [
            "row 'dinov2 at 50 px'", "row 'unimatch adapted'", "row 'split on the cpu'", "row 'proxy watched'"]
        assert "row 'dinov2 at 50 px': data.synthetic.image_size=50: 50x50 is not a multiple of DINOv2's patch " \
               "size 14" in lines[1]
        assert "row 'unimatch adapted': target_data: method unimatch is semi-supervised" in lines[2]
        assert "row 'split on the cpu': device map 'g:cpu//cpu': g:cpu//cpu has an empty stage" in lines[3]
        assert "row 'proxy watched': train.early_stop.monitor: proxy/entropy is a label-free score" in lines[4]
        assert not (tmp_path / "out").exists()
    # The trainer's own start says the same, from the same function.
    cfg = load_config(DEFAULT, rows[3]["overrides"])
    with pytest.raises(UserError) as err:
        check_config(cfg, parse_device_map(cfg.device_map))
    assert f"row 'proxy watched': {err.value}" in lines[4]


def test_what_the_build_would_refuse_from_the_config_alone_is_a_start_check_too(tmp_path, monkeypatch, capsys, no_runs):
    """An encoder smp does not have, a poly horizon short of train.max_steps, layer_decay on an arch
    that numbers no layers: each found at start, before a network is built, so the dry run names
    them as the trainer's start would."""
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path / "grid.yaml", rows=[
        {"name": "typo", "config": DEFAULT, "overrides": ["model.generator.encoder=resnet19"]},
        {"name": "short", "config": DEFAULT, "overrides": ["train.max_steps=10", "optim.discriminator.poly_horizon=5"]},
        {"name": "decay", "config": DEFAULT, "overrides": ["optim.generator.layer_decay=0.5"]}])
    assert experiment.main(["run", str(grid), "--out", "out", "--dry-run"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].startswith("row 'typo': model.generator.encoder: 'resnet19' is not one of "
                               "segmentation-models-pytorch's") and "did you mean 'resnet18'" in lines[1]
    assert lines[2] == ("row 'short': optim.discriminator.poly_horizon: 5 is short of train.max_steps 10 (the steps "
                        "after it would train at lr 0); give at least max_steps, or null")
    assert lines[3] == ("row 'decay': optim.generator.layer_decay=0.5: arch deeplabv3plus numbers no encoder layers; "
                        "leave it at 1.0")
    assert not (tmp_path / "out").exists()


def test_with_its_inputs_there_the_dry_run_prints_commands_a_shell_takes(tmp_path, monkeypatch, capsys, no_runs):
    monkeypatch.chdir(tmp_path)
    checkpoint = tmp_path / "runs" / "pretext" / "checkpoints" / "last.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")  # a start only checks that it is there; loading it comes later
    grid = write_grid(tmp_path / "grid.yaml", rows=[{"name": "warm", "config": DEFAULT, "overrides": [
        f"init.generator.path={checkpoint}", "init.generator.exclude=[segmentation_head.*]"]}])
    assert experiment.main(["run", str(grid), "--out", "out", "--dry-run"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    label, _, command = line.partition(": ")
    assert label == "warm, seed 0"
    spec = launcher.RunSpec.of(load_grid(grid), load_grid(grid).rows[0], 0, Path("out"))
    assert shlex.split(command) == spec.command()  # the exclude's brackets quoted, as a shell needs them
    assert "'init.generator.exclude=[segmentation_head.*]'" in command
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_an_earlier_row_writes_is_not_missing(tmp_path, monkeypatch, capsys, no_runs):
    monkeypatch.chdir(tmp_path)
    made = "out/pretext/seed0/checkpoints/last.pt"
    rows = [{"name": "pretext", "config": DEFAULT},
            {"name": "warm", "config": DEFAULT, "overrides": [f"init.generator.path={made}"]}]
    assert experiment.main(["run", str(write_grid(tmp_path / "grid.yaml", rows)), "--out", "out", "--dry-run"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    # ... but a row before it does not write it when it comes after, or when that run is done
    grid = write_grid(tmp_path / "grid.yaml", rows[::-1])
    assert experiment.main(["run", str(grid), "--out", "out", "--dry-run"]) == 2
    assert f"row 'warm': init.generator.path: checkpoint not found: {made}" in capsys.readouterr().err
    finished(tmp_path / "out" / "pretext" / "seed0")
    assert experiment.main(["run", str(write_grid(tmp_path / "grid.yaml", rows)), "--out", "out", "--dry-run"]) == 2
    assert f"row 'warm': init.generator.path: checkpoint not found: {made}" in capsys.readouterr().err


def test_rows_whose_runs_are_all_done_are_not_checked(tmp_path, monkeypatch, capsys, no_runs):
    """A finished run never runs again, so the files it started from may be gone: its row is
    not refused for them; a row with a run still to run is ("every row still to run")."""
    monkeypatch.chdir(tmp_path)
    gone = "runs/pretext/checkpoints/last.pt"
    rows = [{"name": "a", "config": DEFAULT}, {"name": "b", "config": DEFAULT, "overrides": ["loss.lambda_adv=0"]},
            {"name": "c", "config": DEFAULT, "overrides": ["loss.lambda_adv=0.5"]}]
    grid = write_grid(tmp_path / "grid.yaml", rows, common_overrides=[f"init.generator.path={gone}"])
    finished(tmp_path / "out" / "a" / "seed0", [f"init.generator.path={gone}"])
    assert experiment.main(["run", str(grid), "--out", "out", "--dry-run"]) == 2
    assert f"every row still to run (2): init.generator.path: checkpoint not found: {gone}" in capsys.readouterr().err
    for row in rows[1:]:
        finished(tmp_path / "out" / row["name"] / "seed0", [*row["overrides"], f"init.generator.path={gone}"])
    assert experiment.main(["run", str(grid), "--out", "out", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == ["a, seed 0: done", "b, seed 0: done", "c, seed 0: done"]


def test_a_row_that_does_not_load_and_a_missing_file_are_named_together(tmp_path, monkeypatch, capsys, no_runs):
    monkeypatch.chdir(tmp_path)
    grid = write_grid(tmp_path / "grid.yaml", rows=[
        {"name": "typo", "config": DEFAULT, "overrides": ["train.max_stpes=3"]},
        {"name": "warm", "config": DEFAULT, "overrides": ["init.discriminator.path=d.pt"]}])
    assert experiment.main(["run", str(grid), "--out", "out"]) == 2
    err = capsys.readouterr().err
    assert "grid t: 1 row(s) do not load and 1 problem(s) their runs' starts would refuse" in err
    assert "row 'typo': invalid config" in err
    assert "row 'warm': init.discriminator.path: checkpoint not found: d.pt" in err


def test_the_trainers_start_names_every_missing_weights_file(tmp_path):
    """The one check segadv-train's start and the grid share (training/preflight.py): each file."""
    cfg = load_config(DEFAULT, [f"init.generator.path={tmp_path / 'g.pt'}",
                                f"init.discriminator.path={tmp_path / 'd.pt'}",
                                f"model.generator.encoder_weights={tmp_path / 'enc.pth'}"])
    method = method_class(cfg.method.name)
    missing = missing_files(cfg, str(tmp_path / "resume.pt"), method)
    assert [(m.key, m.path) for m in missing] == [
        ("model.generator.encoder_weights", str(tmp_path / "enc.pth")), ("init.generator.path", str(tmp_path / "g.pt")),
        ("init.discriminator.path", str(tmp_path / "d.pt")), ("--resume", str(tmp_path / "resume.pt"))]
    with pytest.raises(UserError, match="checkpoint not found") as info:
        check_files(cfg, None, method)
    assert str(tmp_path / "g.pt") in str(info.value) and str(tmp_path / "d.pt") in str(info.value)
    (tmp_path / "g.pt").write_bytes(b"")
    assert [m.key for m in missing_files(cfg, "auto", method)] == ["model.generator.encoder_weights",
                                                                   "init.discriminator.path"]


# ------------------------------------------------------------------ table: the columns that differ


def run_dir(root, name, config, *overrides, miou=0.5):
    """A finished run's dir, its config.yaml as a run of ``config`` with ``overrides`` writes it."""
    path = root / name
    path.mkdir()
    dump_config(load_config(config, list(overrides)), path / "config.yaml")
    score = Score(step=8, mIoU=miou, pixel_acc=0.9)
    (path / "status.json").write_text(RunStatus(
        outcome="finished", step=8, max_steps=8, start_step=0, final=score, best=score, exit_code=0, wall_s=30.0,
        total_wall_s=30.0, started_at="2026-11-27T00:00:00+00:00", segadv_version="test").model_dump_json())
    return path


def table(capsys, *runs):
    assert experiment.main(["table", *map(str, runs)]) == 0
    markdown = capsys.readouterr().out
    assert experiment.main(["table", *map(str, runs), "--json"]) == 0
    return markdown, json.loads(capsys.readouterr().out)


def test_an_adaptation_run_beside_supervised_ones_differs_in_few_columns(tmp_path, capsys):
    """The target is one column (null where a run has none); another method's settings are no
    column where one run reads them; transform lists are short and readable; the metrics stay."""
    adapted = run_dir(tmp_path, "adapted", "uda", "method.name=mean_teacher", miou=0.61234)
    ce = run_dir(tmp_path, "ce", "semi", "method.name=supervised")
    semi = run_dir(tmp_path, "semi", "semi")  # advsemiseg, which reads method.advsemiseg.*
    markdown, data = table(capsys, adapted, ce, semi)
    keys = data["differing_keys"]
    assert keys == ["model.generator.aux_head", "data.synthetic.image_size", "data.synthetic.train_size",
                    "data.synthetic.val_size", "data.labeled_fraction", "data.train_transforms", "target_data",
                    "loss.lambda_adv", "loss.adv_warmup_steps", "method.name"]
    lines = markdown.splitlines()
    metrics = "| run | outcome | steps | final mIoU (step) | best mIoU (step) | wall | "
    assert lines[0] == metrics + " | ".join(keys) + " |"
    head = f"| {adapted} | finished | 8/8 | 0.6123 (8) | 0.6123 (8) | 30 s | true | 64 | 4000 | 200 | 1.0 | "
    # the transform lists by their steps' names (one is too wide whole), the target cut to WIDTH
    assert lines[2].startswith(head + "[HorizontalFlip] | {kind: synthetic, root: null, synthetic: {image_size: ")
    assert lines[2].endswith("… | 0.0 | 0 | mean_teacher |")
    assert lines[3] == (f"| {ce} | finished | 8/8 | 0.5000 (8) | 0.5000 (8) | 30 s | false | 80 | 8000 | 500 | 0.005 | "
                        "[HorizontalFlip, RandomRotate90, RandomBrightnessContrast] | null | 0.01 | 100 | supervised |")
    assert lines[4].endswith("| [HorizontalFlip, RandomRotate90, RandomBrightnessContrast] | null | 0.01 | 100 | "
                             "advsemiseg |")
    assert all(len(cell) <= WIDTH for line in lines[2:5] for cell in line.split(" | ")[6:])
    # --json: every value whole
    adapted_json, ce_json, _ = data["runs"]
    assert adapted_json["config"]["target_data"]["synthetic"]["domain"] == "target"
    assert ce_json["config"]["target_data"] is None
    assert ce_json["config"]["data.train_transforms"][2] == {
        "name": "RandomBrightnessContrast", "brightness_limit": 0.2, "contrast_limit": 0.2, "p": 0.5}


def test_a_methods_settings_differ_between_the_runs_of_that_method(tmp_path, capsys):
    a = run_dir(tmp_path, "a", DEFAULT, "method.name=advsemiseg", "method.advsemiseg.lambda_semi=0.5")
    b = run_dir(tmp_path, "b", DEFAULT, "method.name=advsemiseg")
    c = run_dir(tmp_path, "c", DEFAULT, "method.name=supervised", "method.advsemiseg.lambda_semi=0.7")
    markdown, data = table(capsys, a, b, c)
    assert data["differing_keys"] == ["method.name", "method.advsemiseg.lambda_semi"]
    assert [line.split(" | ")[-2:] for line in markdown.splitlines()[2:5]] == [
        ["advsemiseg", "0.5 |"], ["advsemiseg", "0.1 |"], ["supervised", "- |"]]
    assert "- in a config column: the run does not read that key" in markdown
    # the supervised run alone beside one advsemiseg run: the setting is no difference
    assert table(capsys, b, c)[1]["differing_keys"] == ["method.name"]


def test_a_section_null_in_some_runs_is_one_column_and_its_keys_compared_where_set(tmp_path, capsys):
    cold = run_dir(tmp_path, "cold", DEFAULT)
    warm = run_dir(tmp_path, "warm", DEFAULT, "init.generator.path=runs/pretext/checkpoints/last.pt",
                   "init.generator.exclude=[segmentation_head.*]")
    other = run_dir(tmp_path, "other", DEFAULT, "init.generator.path=runs/other/checkpoints/last.pt",
                    "init.generator.exclude=[segmentation_head.*]")
    markdown, data = table(capsys, cold, warm)
    assert data["differing_keys"] == ["init.generator"]
    assert [run["config"]["init.generator"] for run in data["runs"]] == [
        None, {"path": "runs/pretext/checkpoints/last.pt", "exclude": ["segmentation_head.*"]}]
    assert markdown.splitlines()[2].endswith("| null |")
    assert markdown.splitlines()[3].endswith(
        "| {path: runs/pretext/checkpoints/last.pt, exclude: [segmenta… |")
    assert table(capsys, cold, warm, other)[1]["differing_keys"] == ["init.generator", "init.generator.path"]


def test_values_cut_to_the_width_stay_told_apart(tmp_path, capsys):
    """Two transform lists alike in their first WIDTH characters: cut, they would look the same, so
    the column shows the steps' names; alike in their names too, whole."""
    steps = "[{name: HorizontalFlip, p: 0.5}, {name: RandomRotate90, p: 1.0}, {name: GaussNoise, p: %s}]"
    a = run_dir(tmp_path, "a", DEFAULT, "data.train_transforms=" + steps % 0.5)
    b = run_dir(tmp_path, "b", DEFAULT, "data.train_transforms=" + steps % 0.25)
    lines = table(capsys, a, b)[0].splitlines()
    assert lines[2].endswith("| [{name: HorizontalFlip, p: 0.5}, {name: RandomRotate90, p: 1.0}, {name: GaussNoise, "
                             "p: 0.5}] |")
    assert lines[3].endswith("p: 0.25}] |")
    c = run_dir(tmp_path, "c", DEFAULT, "data.train_transforms=[{name: HorizontalFlip, p: 0.5}, "
                                        "{name: RandomRotate90, p: 1.0}, {name: ColorJitter, p: 0.5}]")
    lines = table(capsys, a, c)[0].splitlines()
    assert lines[2].endswith("| [HorizontalFlip, RandomRotate90, GaussNoise] |")
    assert lines[3].endswith("| [HorizontalFlip, RandomRotate90, ColorJitter] |")


@pytest.mark.parametrize("value, text", [
    (None, "null"), (True, "true"), (1e-05, "1e-05"), (0.001, "0.001"), ("a  b\nc", "a b c"),
    ([0.5, 0.5, 0.5], "[0.5, 0.5, 0.5]"), ({"path": "x.pt", "exclude": []}, "{path: x.pt, exclude: []}"),
])
def test_compact_values(value, text):
    assert compact(value) == text
