"""W&B and MLflow beside TensorBoard (segadv/monitor/trackers.py): a tiny CPU run with both on
(W&B offline, MLflow's file store in the run dir), stopped and resumed, logs the scalars
metrics.jsonl holds at the same steps, read back through each library's own records (the offline
run's ``.wandb`` file, MLflow's client), and the resume continues the same tracker run. A tracker
whose package is missing is exit 2 at the start, naming the key and the extra."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES
from segadv.cli import train as train_cli
from segadv.errors import UserError
from segadv.monitor import trackers
from segadv.monitor.trackers import STATE_FILE, Trackers, mlflow_name
from segadv.monitor.writer import NullWriter, open_writer
from segadv.training.run_dir import check_start

BOTH = ["log.wandb.enabled=true", "log.mlflow.enabled=true", "log.wandb.tags=[tiny]", "log.mlflow.experiment=tiny"]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A tiny run with both trackers on, stopped at step 2 (its checkpoint) and resumed to step 4."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from segadv.config import load_config
    from segadv.training.loop import train

    home = tmp_path_factory.mktemp("home")
    run_dir = tmp_path_factory.mktemp("tracked") / "run"
    with pytest.MonkeyPatch.context() as mp:
        # the libraries' own folders in a temp dir (nothing under ~), and the file-store opt-in that
        # segadv sets for MLflow's store taken back after the module
        for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(variable, str(home / variable.lower()))
        for variable in ("WANDB_MODE", "WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
            mp.delenv(variable, raising=False)

        def cfg():
            config = load_config(None, [*TINY_OVERRIDES, *BOTH])
            config.run_dir, config.device_map = str(run_dir), "g:cpu,d:cpu"
            return config

        first = train(cfg(), stop_at=2)
        state_after_first = json.loads((run_dir / STATE_FILE).read_text())
        second = train(cfg(), resume="auto")
        yield run_dir, first, second, state_after_first
        import wandb

        if hasattr(wandb, "teardown"):
            wandb.teardown()  # ends wandb's service process with the module


def jsonl_values(run_dir: Path, key: str) -> dict[int, float]:
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return {record["step"]: record[key] for record in records if key in record}


# ------------------------------------------------------------------ W&B


def wandb_records(path: Path) -> list:
    """The records of an offline run's ``.wandb`` file: wandb's own protobuf ``Record`` messages in
    the LevelDB log layout wandb writes them in (a 7-byte file header, 32 KiB blocks, each chunk
    with a 7-byte header: checksum, length, type full/first/middle/last). wandb ships no reader of
    its own; the messages are parsed by its generated classes."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:  # zeroes to the block's end
            pos += left
            continue
        payload = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            records.append(Record.FromString(pending))
            pending = b""
    return records


def wandb_history(run_file: Path) -> list[dict]:
    rows = []
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def test_wandb_offline_run_holds_the_scalars_and_the_resume_continues_its_id(tracked_run):
    run_dir, first, second, state = tracked_run
    assert (first.step, second.step) == (2, 4)
    run_id = state["wandb"]["id"]
    assert json.loads((run_dir / STATE_FILE).read_text())["wandb"] == {"id": run_id}
    attempts = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2 and all(path.name.endswith(f"-{run_id}") for path in attempts)  # one run, two attempts
    files = [path / f"run-{run_id}.wandb" for path in attempts]
    run_records = [r for f in files for r in wandb_records(f) if r.WhichOneof("record_type") == "run"]
    assert [r.run.run_id for r in run_records] == [run_id] * 2

    logged = {}
    for number, run_file in enumerate(files):
        for row in wandb_history(run_file):
            for key in ("train/loss_seg", "train/loss_d", "val/mIoU"):
                if key in row:
                    logged.setdefault(key, {})[(number, row["step"])] = row[key]
    # the first attempt logged steps 2, the resumed one step 4: each value as metrics.jsonl has it
    for key in ("train/loss_seg", "train/loss_d", "val/mIoU"):
        expected = jsonl_values(run_dir, key)
        assert sorted(expected) == [2, 4]
        assert logged[key] == {(0, 2): pytest.approx(expected[2], rel=1e-12),
                               (1, 4): pytest.approx(expected[4], rel=1e-12)}

    config = {}  # the run record's config, then any config record after it
    for record in wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            update = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in update})
    assert config["train"]["max_steps"] == 4 and config["log"]["wandb"]["tags"] == ["tiny"]
    panels = list((attempts[0] / "files" / "media" / "images").rglob("*.png"))
    assert any("input_gt_pred" in path.name for path in panels)


# ------------------------------------------------------------------ MLflow


def test_mlflow_file_store_holds_the_scalars_params_and_the_resume_continues_its_run(tracked_run):
    from mlflow.tracking import MlflowClient

    run_dir, first, second, state = tracked_run
    run_id = state["mlflow"]["run_id"]
    assert json.loads((run_dir / STATE_FILE).read_text())["mlflow"] == {"run_id": run_id, "tracking_uri": None}
    client = MlflowClient((run_dir / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("tiny")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [run_id]  # the resume continued it: one run
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["train.max_steps"] == "4" and run.data.params["log.wandb.tags"] == '["tiny"]'
    for key in ("train/loss_seg", "train/loss_d", "val/mIoU", "val/best_mIoU"):
        history = {metric.step: metric.value for metric in client.get_metric_history(run_id, key)}
        expected = jsonl_values(run_dir, key)
        assert sorted(history) == sorted(expected) == [2, 4]
        assert history == {step: pytest.approx(value, rel=1e-12) for step, value in expected.items()}
    artifacts = {item.path for item in client.list_artifacts(run_id)}
    assert "config.yaml" in artifacts and "images" in artifacts
    images = [item.path for item in client.list_artifacts(run_id, "images")]  # key and step in the name
    assert any(re.search(r"input_gt_pred[%+]step[%+]4[%+]", path) for path in images)


def test_mlflow_names_keep_allowed_characters_and_replace_the_rest():
    assert mlflow_name("val/IoU/traffic light") == "val/IoU/traffic light"
    assert mlflow_name("val/IoU/t-shirt (2)") == "val/IoU/t-shirt _2_"
    assert mlflow_name("val/IoU/..") == "val/IoU/_" and mlflow_name("val/IoU/") == "val/IoU/_"


# ------------------------------------------------------------------ refusals and failures


@pytest.mark.parametrize("key", ["wandb", "mlflow"])
def test_a_tracker_whose_package_is_missing_is_exit_2_naming_the_key_and_the_extra(key, tmp_path, monkeypatch,
                                                                                   capsys):
    monkeypatch.setitem(sys.modules, key, None)  # `import wandb` fails as where it is not installed
    run_dir = tmp_path / "run"
    code = train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES,
                           f"log.{key}.enabled=true"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"log.{key}.enabled=true needs the {key} package" in err and f"pip install 'segadv[{key}]'" in err
    assert "Traceback" not in err and not run_dir.exists()  # refused before anything was written


def test_a_missing_package_is_named_where_the_tracker_opens_too(tmp_path, monkeypatch, tiny_cfg):
    """Where the start's check is not run (the import fails as it opens): the same message."""
    monkeypatch.setitem(sys.modules, "mlflow", None)
    tiny_cfg.log.mlflow.enabled = True
    with pytest.raises(UserError, match=r"log\.mlflow\.enabled=true needs the mlflow package.*segadv\[mlflow\]"):
        open_writer(tmp_path, tensorboard=False, is_main=True, cfg=tiny_cfg)
    assert list(tmp_path.iterdir()) == []


def test_ranks_other_than_0_open_no_tracker(tmp_path, monkeypatch, tiny_cfg):
    monkeypatch.setitem(sys.modules, "wandb", None)  # would be refused if it were opened
    tiny_cfg.log.wandb.enabled = True
    assert isinstance(open_writer(tmp_path, tensorboard=True, is_main=False, cfg=tiny_cfg), NullWriter)
    assert list(tmp_path.iterdir()) == []


def test_a_tracker_that_fails_to_start_fails_the_start_naming_its_key_and_leaves_nothing(tmp_path, monkeypatch,
                                                                                       capsys):
    wandb = pytest.importorskip("wandb")

    def refused(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refused)
    run_dir = tmp_path / "run"
    code = train_cli.main(["--run-dir", str(run_dir), "--device-map", "cpu", *TINY_OVERRIDES,
                           "log.wandb.enabled=true", "log.wandb.mode=online"])
    assert code == 2
    err = capsys.readouterr().err
    assert "log.wandb: wandb.init failed (UsageError: api_key not configured (no-tty))" in err
    assert not run_dir.exists()  # the failed start removed what it wrote


def test_a_run_dir_holding_trackers_json_is_a_run(tmp_path):
    (tmp_path / STATE_FILE).write_text("{}\n")
    with pytest.raises(UserError, match=r"already holds a run \(trackers\.json\)"):
        check_start(tmp_path, resume=None)


class Failing:
    key = "mlflow"

    def __init__(self) -> None:
        self.calls, self.closed = 0, []

    def scalars(self, step, values):
        self.calls += 1
        raise ConnectionError("the tracking server went away")

    def close(self, outcome):
        self.closed.append(outcome)


class Recording:
    key = "wandb"

    def __init__(self) -> None:
        self.logged, self.closed = [], []

    def scalars(self, step, values):
        self.logged.append((step, dict(values)))

    def close(self, outcome):
        self.closed.append(outcome)


def test_a_tracker_failing_mid_run_is_given_up_with_one_warning_and_the_others_go_on(caplog):
    failing, recording = Failing(), Recording()
    opened = Trackers([failing, recording])
    with caplog.at_level(logging.WARNING, logger=trackers.__name__):
        opened.scalars(2, {"train/loss_seg": 1.5})
        opened.scalars(4, {"train/loss_seg": 1.25})
    opened.close("finished")
    assert failing.calls == 1 and failing.closed == ["failed"]
    assert recording.logged == [(2, {"train/loss_seg": 1.5}), (4, {"train/loss_seg": 1.25})]
    assert recording.closed == ["finished"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        "log.mlflow: logging scalars failed (ConnectionError: the tracking server went away); it logs nothing more")
