"""W&B and MLflow beside TensorBoard (``log.wandb``, ``log.mlflow``; docs/training.md "W&B and
MLflow"): the scalars metrics.jsonl gets, the image panels and the resolved config, each through its
library's own client. Only rank 0 opens them (segadv/monitor/writer.py ``open_writer``).

A tracker run is the segadv run's: its id is kept in ``RUN/trackers.json`` and a resume continues
it (W&B: the same run id, ``resume="allow"``; MLflow: the same run, set running again). Neither
library can take back what an interrupted attempt logged after its checkpoint, as metrics.jsonl and
TensorBoard do: those steps appear twice there. A library that is not installed is refused at the
start (:func:`check_installed`, exit 2 naming the key and the extra); one that fails mid-run is
given up with a warning and the run goes on (metrics.jsonl and TensorBoard hold every scalar).

The libraries are imported only where a tracker is on: importing either takes a second or more.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import re
import secrets
import string
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol

import numpy as np

from segadv.errors import UserError, WriteFailed
from segadv.fsutil import atomic_write_text
from segadv.readback import read_json

log = logging.getLogger(__name__)

STATE_FILE = "trackers.json"  # each tracker's run id, for a resume to continue (the run dir's file)
WANDB_DIR = "wandb"  # wandb.init(dir=RUN) writes RUN/wandb/
MLRUNS_DIR = "mlruns"  # the default MLflow store, file:RUN/mlruns

# config key under log -> (the module imported, the pyproject.toml extra that installs it)
TRACKERS = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


class Tracker(Protocol):
    key: str  # "wandb" / "mlflow": log.<key>, its entry in trackers.json

    def state(self) -> dict[str, Any]: ...  # what a resume needs to continue the run

    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...

    def image(self, step: int, tag: str, image_hwc: np.ndarray) -> None: ...

    def close(self, outcome: str) -> None: ...  # outcome: "finished", "failed" or "killed"


def enabled(log_cfg: Any) -> list[str]:
    """The trackers ``log_cfg`` (the config's ``log`` section) turns on, as their keys."""
    return [key for key in TRACKERS if getattr(log_cfg, key).enabled]


def missing_message(key: str) -> str:
    module, extra = TRACKERS[key]
    return (f"log.{key}.enabled=true needs the {module} package, which is not installed: "
            f"pip install 'segadv[{extra}]' (or set log.{key}.enabled=false)")


def check_installed(log_cfg: Any) -> None:
    """At the start, before anything slow or written (every rank alike): each tracker turned on is
    installed, else a UserError naming its key and the extra. Nothing is imported here."""
    for key in enabled(log_cfg):
        module = TRACKERS[key][0]
        try:
            found = importlib.util.find_spec(module) is not None
        except ValueError:  # in sys.modules without a spec: imported already
            found = True
        if not found:
            raise UserError(missing_message(key))


def import_tracker(key: str, *submodules: str) -> list[Any]:
    """The library of tracker ``key`` and its ``submodules`` (``mlflow.tracking``); a UserError
    naming the key where one cannot be imported (not installed, or an install without that part)."""
    module, extra = TRACKERS[key]
    imported = []
    for name in (module, *submodules):
        try:
            imported.append(importlib.import_module(name))
        except ImportError as err:
            if isinstance(err, ModuleNotFoundError) and err.name in (module, None) and name == module:
                raise UserError(missing_message(key)) from None
            raise UserError(f"log.{key}.enabled=true: {name} does not import ({type(err).__name__}: {err}): "
                            f"pip install --upgrade 'segadv[{extra}]'") from None
    return imported


# ------------------------------------------------------------------ the run dir's record of them


def read_state(run_dir: Path) -> dict[str, Any]:
    """``trackers.json``'s entries ({} without one). One that cannot be read is warned about and
    the trackers start new runs: it holds no training state."""
    path = run_dir / STATE_FILE
    try:
        data = read_json(path, cap=1 << 20)
    except FileNotFoundError:
        return {}
    except UserError as err:
        log.warning("%s: the trackers start new runs", err)
        return {}
    if not isinstance(data, dict):
        log.warning("%s is not a JSON object: the trackers start new runs", path)
        return {}
    return data


def write_state(run_dir: Path, state: Mapping[str, Any]) -> None:
    atomic_write_text(run_dir / STATE_FILE, json.dumps(state, indent=2, sort_keys=True) + "\n")


class Trackers:
    """The open trackers as the metric writer calls them. A call that raises gives that tracker
    up for the rest of the attempt, with one warning: the run goes on (a tracking server that
    stops answering must not end a training whose scalars metrics.jsonl and TensorBoard hold)."""

    def __init__(self, opened: list[Tracker]) -> None:
        self.opened = list(opened)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._each("logging scalars", lambda tracker: tracker.scalars(step, values))

    def image(self, step: int, tag: str, image_chw_uint8: Any) -> None:
        """``image_chw_uint8``: a uint8 CHW tensor (the writer's), handed on as an HWC array."""
        if self.opened:
            hwc = np.ascontiguousarray(image_chw_uint8.detach().cpu().numpy().transpose(1, 2, 0))
            self._each(f"logging image {tag}", lambda tracker: tracker.image(step, tag, hwc))

    def close(self, outcome: str = "finished") -> None:
        opened, self.opened = self.opened, []
        for tracker in opened:
            try:
                tracker.close(outcome)
            except Exception as err:  # the library's own failure: the run's outcome stands
                log.warning("log.%s: closing its run failed (%s: %s)", tracker.key, type(err).__name__, err)

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.opened):
            try:
                call(tracker)
            except Exception as err:  # the library's own failure, whatever its type
                log.warning("log.%s: %s failed (%s: %s); it logs nothing more in this attempt (metrics.jsonl and "
                            "TensorBoard go on)", tracker.key, what, type(err).__name__, err)
                self.opened.remove(tracker)
                try:
                    tracker.close("failed")
                except Exception:
                    pass


def open_trackers(cfg: Any, run_dir: Path, resume_step: Optional[int]) -> Trackers | None:
    """Rank 0's trackers for the run in ``run_dir`` (None: none turned on). ``resume_step`` not
    None: a resume, which continues the tracker runs ``trackers.json`` names. Each library's
    failure to start its run is a UserError naming its key (a failed start)."""
    keys = enabled(cfg.log)
    if not keys:
        return None
    earlier = read_state(run_dir) if resume_step is not None else {}
    opened: list[Tracker] = []
    try:
        for key in keys:
            opener = {"wandb": WandbTracker.open, "mlflow": MlflowTracker.open}[key]
            entry = earlier.get(key)
            opened.append(opener(cfg, run_dir, entry if isinstance(entry, dict) else {}, resume_step))
        write_state(run_dir, {**earlier, **{tracker.key: tracker.state() for tracker in opened}})
    except BaseException:
        Trackers(opened).close("failed")
        raise
    return Trackers(opened)


def _new_id() -> str:
    """A W&B run id: 8 of [a-z0-9], as wandb's own."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value) is not None


# ------------------------------------------------------------------ W&B


class WandbTracker:
    """A W&B run (``wandb.init``): the config as its config, each scalar at its step against the
    metric ``step`` (``define_metric``, as Lightning's WandbLogger does), so that a resumed
    attempt's steps are plotted where they belong whatever W&B's own row counter says."""

    key = "wandb"

    def __init__(self, wandb: Any, run: Any) -> None:
        self.wandb, self.run = wandb, run

    @classmethod
    def open(cls, cfg: Any, run_dir: Path, earlier: Mapping[str, Any], resume_step: Optional[int]) -> "WandbTracker":
        from segadv.config import config_to_dict

        wandb, = import_tracker("wandb")
        section = cfg.log.wandb
        run_id = earlier.get("id") if _valid_id(earlier.get("id")) else _new_id()
        # W&B's resume is a server's: offline, each attempt is a new offline-run-* folder of the same
        # id, which `wandb sync` uploads in order as one run.
        resume = "allow" if section.mode == "online" else None
        try:
            run = wandb.init(project=section.project, entity=section.entity, name=section.name or run_dir.name,
                             tags=list(section.tags) or None, dir=os.path.abspath(run_dir), mode=section.mode,
                             id=run_id, resume=resume, config=config_to_dict(cfg),
                             settings=wandb.Settings(console="off", silent=True))
            run.define_metric("step")
            run.define_metric("*", step_metric="step")
        except Exception as err:  # the library's own errors (no login, no network) are of many types
            raise UserError(f"log.wandb: wandb.init failed ({type(err).__name__}: {err})") from None
        where = (f"offline in {Path(run.dir).parent} (upload: wandb sync {Path(run.dir).parent.parent}/offline-run-*)"
                 if section.mode == "offline" else getattr(run, "url", None) or "online")
        continued = f", continued at step {resume_step}" if run_id == earlier.get("id") else ""
        log.info("W&B run %s%s: %s", run_id, continued, where)
        return cls(wandb, run)

    def state(self) -> dict[str, Any]:
        return {"id": self.run.id}

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log({"step": step, **values})

    def image(self, step: int, tag: str, image_hwc: np.ndarray) -> None:
        self.run.log({"step": step, tag: self.wandb.Image(image_hwc)})

    def close(self, outcome: str) -> None:
        self.run.finish(exit_code=0 if outcome == "finished" else 1)


# ------------------------------------------------------------------ MLflow

# MLflow's run status per outcome of an attempt (a stop by a signal finishes the attempt normally).
MLFLOW_STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}


def mlflow_name(tag: str) -> str:
    """``tag`` as an MLflow metric or image key: the characters MLflow refuses (it allows letters,
    digits, ``_ - . /`` and spaces; a class name may hold others) become ``_``, and so does a path
    part MLflow would read as a folder (``..``)."""
    cleaned = re.sub(r"[^\w.\-/ ]", "_", tag)
    return "/".join(part if part not in ("", ".", "..") else "_" for part in cleaned.split("/"))


def param_value(value: Any, limit: int) -> str:
    """A config value as an MLflow param (a string of at most ``limit`` characters; a longer one,
    a long class list, is cut: config.yaml, the run's artifact, has it whole)."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def is_file_store(uri: str) -> bool:
    from urllib.parse import urlparse

    return urlparse(uri).scheme in ("", "file")


class MlflowTracker:
    """An MLflow run through ``MlflowClient``: the flattened config as params (MLflow keeps a run's
    params as first logged), the resolved config as the artifact ``config.yaml`` (each attempt's),
    each scalar as a metric at its step, the panels as images (``log_image`` with a key and step)."""

    key = "mlflow"

    def __init__(self, client: Any, run_id: str, uri_key: Optional[str], entities: Any) -> None:
        self.client, self.run_id, self.uri_key, self.entities = client, run_id, uri_key, entities

    @classmethod
    def open(cls, cfg: Any, run_dir: Path, earlier: Mapping[str, Any], resume_step: Optional[int]) -> "MlflowTracker":
        _, entities, exceptions, tracking = import_tracker("mlflow", "mlflow.entities", "mlflow.exceptions",
                                                            "mlflow.tracking")
        MlflowException, MlflowClient = exceptions.MlflowException, tracking.MlflowClient

        section = cfg.log.mlflow
        uri = section.tracking_uri or Path(os.path.abspath(run_dir / MLRUNS_DIR)).as_uri()
        if is_file_store(uri):
            # Recent MLflow releases refuse the file store unless this is set ("maintenance mode");
            # it is the store mlflow-skinny writes without a database. A user's own setting is kept.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        what = (f"log.mlflow.tracking_uri={section.tracking_uri}" if section.tracking_uri
                else f"log.mlflow (the store {uri})")
        try:
            client = MlflowClient(tracking_uri=uri)
            run_id = cls._earlier_run(client, earlier, section.tracking_uri)
            if run_id is None:
                run_id = cls._new_run(client, section, run_dir)
            else:
                client.update_run(run_id, status="RUNNING")
            tracker = cls(client, run_id, section.tracking_uri, entities)
            tracker._log_config(cfg, resume_step if run_id == earlier.get("run_id") else None)
        except MlflowException as err:
            message = getattr(err, "message", None) or str(err)
            raise UserError(f"{what}: MLflow refused the run ({type(err).__name__}: {message})") from None
        except OSError as err:  # the store's files (the run dir's own store: a full disk, no permission)
            if isinstance(err, WriteFailed):
                raise
            raise WriteFailed(err.filename or uri, err) from None
        continued = f", continued at step {resume_step}" if run_id == earlier.get("run_id") else ""
        log.info("MLflow run %s%s: %s", run_id, continued, uri)
        return tracker

    @staticmethod
    def _earlier_run(client: Any, earlier: Mapping[str, Any], uri_key: Optional[str]) -> Optional[str]:
        """The run an earlier attempt logged to, where it is in the store this attempt logs to."""
        from mlflow.exceptions import MlflowException

        run_id = earlier.get("run_id")
        if not _valid_id(run_id) or earlier.get("tracking_uri") != uri_key:
            if _valid_id(run_id):
                log.info("log.mlflow.tracking_uri changed since the earlier attempt: a new MLflow run")
            return None
        try:
            run = client.get_run(run_id)
        except MlflowException:
            log.warning("log.mlflow: the earlier attempt's MLflow run %s is not in the store any more: a new run",
                        run_id)
            return None
        if getattr(run.info, "lifecycle_stage", "active") != "active":
            log.warning("log.mlflow: the earlier attempt's MLflow run %s was deleted: a new run", run_id)
            return None
        return run_id

    @staticmethod
    def _new_run(client: Any, section: Any, run_dir: Path) -> str:
        experiment = client.get_experiment_by_name(section.experiment)
        if experiment is None:
            experiment_id = client.create_experiment(section.experiment)
        elif experiment.lifecycle_stage != "active":
            raise UserError(f"log.mlflow.experiment={section.experiment}: the experiment is deleted in that store: "
                            "restore it (mlflow experiments restore) or name another")
        else:
            experiment_id = experiment.experiment_id
        run = client.create_run(experiment_id, run_name=section.run_name or run_dir.name,
                                tags={"segadv_run_dir": os.path.abspath(run_dir)})
        return run.info.run_id

    def _log_config(self, cfg: Any, resumed_at: Optional[int]) -> None:
        """The flattened config as params and config.yaml as an artifact. MLflow refuses to change
        a param, so a resumed run logs only keys it lacks and names the ones this attempt changed."""
        from mlflow.utils import validation

        from segadv.config import flat_config
        from segadv.config.loading import config_yaml

        limit = getattr(validation, "MAX_PARAM_VAL_LENGTH", 500)
        params = {key: param_value(value, limit) for key, value in flat_config(cfg).items()}
        kept = self.client.get_run(self.run_id).data.params if resumed_at is not None else {}
        changed = sorted(key for key, value in params.items() if key in kept and kept[key] != value)
        if changed:
            log.info("log.mlflow: the run keeps its params as first logged; this attempt (from step %d) changed %s "
                     "(its config.yaml artifact is this attempt's)", resumed_at, ", ".join(changed))
        new = [self.entities.Param(key, value) for key, value in params.items() if key not in kept]
        if new:
            self.client.log_batch(self.run_id, params=new)
        self.client.log_text(self.run_id, config_yaml(cfg), "config.yaml")

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "tracking_uri": self.uri_key}

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self.entities.Metric(mlflow_name(tag), float(value), now, step) for tag, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def image(self, step: int, tag: str, image_hwc: np.ndarray) -> None:
        self.client.log_image(self.run_id, image_hwc, key=mlflow_name(tag), step=step)

    def close(self, outcome: str) -> None:
        self.client.set_terminated(self.run_id, status=MLFLOW_STATUS.get(outcome, "FAILED"))
