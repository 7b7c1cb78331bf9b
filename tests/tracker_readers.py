"""Each experiment tracker's records read back with that library's own reader, as
{key: [(step, value), ...]} in logged order, and the config it recorded; and when the tracker
tests run: each library is the optional `trackers` extra (`make install-trackers`), so without
it they skip, unless TEPO_REQUIRE_TRACKERS=1 (CI) makes them fail."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tepo_cli.trackers.tracker import run_name

Series = dict[str, list[tuple[int, float]]]
TRACKERS = ("tensorboard", "mlflow", "wandb", "trackio")
REQUIRED = os.environ.get("TEPO_REQUIRE_TRACKERS") == "1"


def needs(*libraries: str) -> pytest.MarkDecorator:
    missing = [name for name in libraries if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(
        bool(missing) and not REQUIRED,
        reason=f"{', '.join(missing)} not installed (make install-trackers)",
    )


def go_offline(monkeypatch: pytest.MonkeyPatch, base: Path) -> None:
    """No tracker reaches a server: W&B offline, no user stores or credentials."""
    for name in ("WANDB_API_KEY", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "TRACKIO_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("NETRC", str(base / "no-netrc"))


def as_stored(tracker: str, value: float) -> float:
    """TensorBoard keeps float32; the others the float64 logged."""
    return float(np.float32(value)) if tracker == "tensorboard" else value


def read_back(tracker: str, run_dir: Path, trackio_dir: Path) -> Series:
    if tracker == "tensorboard":
        return tensorboard_scalars(run_dir)
    if tracker == "mlflow":
        return mlflow_scalars(run_dir)
    if tracker == "wandb":
        return wandb_scalars(run_dir)
    return trackio_scalars(trackio_dir, run_name(run_dir))


def tensorboard_scalars(run_dir: Path) -> Series:
    """What TensorBoard shows: its EventAccumulator, which applies a resumed run's purge."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def tensorboard_hparams(run_dir: Path) -> dict[str, Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    start = data.session_start_info.hparams
    return {key: getattr(value, value.WhichOneof("kind")) for key, value in start.items()}


def mlflow_client(run_dir: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlflow' / 'mlflow.db'}")


def mlflow_run(run_dir: Path) -> Any:
    """The one MLflow run of the store (a resumed run must not have made a second)."""
    client = mlflow_client(run_dir)
    (experiment,) = client.search_experiments(filter_string="name = 'tepo'")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == (run_dir / "mlflow" / "run_id").read_text().strip()
    return run


def mlflow_scalars(run_dir: Path) -> Series:
    client, run = mlflow_client(run_dir), mlflow_run(run_dir)
    return {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
    }


def wandb_records(run_dir: Path, wait_s: float = 30.0) -> list[Any]:
    """Every record of the run's offline .wandb files, oldest process first (wandb's own
    LevelDB-log reader and protobuf records). wandb-core may still be writing a file when
    `finish()` has returned (seen on a loaded machine: a resumed run's steps missing): each file
    is read once it holds its run's exit record, the last thing `finish()` writes, waiting up to
    `wait_s` seconds (after that, what is there)."""
    deadline = time.monotonic() + wait_s
    while True:
        files = [_wandb_file_records(path) for path in _wandb_files(run_dir)]
        finished = all(any(r.WhichOneof("record_type") == "exit" for r in f) for f in files)
        if finished or time.monotonic() > deadline:
            return [record for file_records in files for record in file_records]
        time.sleep(0.2)


def _wandb_files(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def _wandb_file_records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal.datastore import DataStore

    records = []
    store = DataStore()
    store.open_for_scan(str(path))
    while (data := store.scan_data()) is not None:
        records.append(wandb_internal_pb2.Record.FromString(data))
    return records


def wandb_scalars(run_dir: Path) -> Series:
    series: Series = {}
    for record in wandb_records(run_dir):
        if record.WhichOneof("record_type") != "history":
            continue
        for item in record.history.item:
            key = _wandb_key(item)
            if not key.startswith("_"):  # W&B's own _step, _runtime, _timestamp
                value = json.loads(item.value_json)
                series.setdefault(key, []).append((record.history.step.num, value))
    return series


def wandb_runs(run_dir: Path) -> list[Any]:
    return [r.run for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "run"]


def wandb_config(run_dir: Path) -> dict[str, Any]:
    (first, *_) = wandb_runs(run_dir)
    return {_wandb_key(item): json.loads(item.value_json) for item in first.config.update}


def _wandb_key(item: Any) -> str:
    """wandb-core writes a plain key as a one-part `nested_key`, the Python SDK as `key`."""
    return item.key or ".".join(item.nested_key)


_TRACKIO_READ = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
project, name = sys.argv[1:]
print(json.dumps({"logs": SQLiteStorage.get_logs(project, name),
                  "runs": SQLiteStorage.get_runs(project),
                  "config": SQLiteStorage.get_run_config(project, name)}))
"""


def trackio_store(store: Path, run: str) -> dict[str, Any]:
    """trackio's SQLiteStorage reading `store`: in a fresh process, since trackio takes its
    directory (TRACKIO_DIR) once, at import."""
    env = dict(os.environ, TRACKIO_DIR=str(store))
    done = subprocess.run(
        [sys.executable, "-c", _TRACKIO_READ, "tepo", run],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def trackio_scalars(store: Path, run: str) -> Series:
    series: Series = {}
    for row in trackio_store(store, run)["logs"]:
        for key, value in row.items():
            if key not in ("step", "timestamp"):
                series.setdefault(key, []).append((row["step"], value))
    return series


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
