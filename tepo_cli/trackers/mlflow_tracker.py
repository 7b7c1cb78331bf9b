"""MLflow: a run in a SQLite store at `<run dir>/mlflow/mlflow.db` (artifacts beside it); view
with `mlflow ui --backend-store-uri sqlite:///<run dir>/mlflow/mlflow.db` (the viewer is in the full
`mlflow` package; the `mlflow` extra installs the client, mlflow-skinny). MLflow 3 refuses its
file store (`./mlruns`, "maintenance mode") unless told otherwise, hence SQLite.
`MLFLOW_TRACKING_URI`, when set, sends the run to that server instead (experiment:
`MLFLOW_EXPERIMENT_NAME`, default `tepo`).

The run's id is kept in `<run dir>/mlflow/run_id`: a resumed run logs into the same MLflow run.
The config is logged once, as params (MLflow refuses a param whose value changes)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from tepo_cli.trackers.tracker import Outcome, read_id, run_name, save_id

NAME = "mlflow"
REQUIRES = "mlflow"

_STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_PARAMS_PER_BATCH = 100  # MLflow's limit for one log_batch call
_PARAM_LENGTH = 6000  # ... and for one param's value


class MLflowTracker:
    def __init__(self) -> None:
        self._client: Any = None
        self._run_id = ""

    def start(self, run_dir: Path, config: dict[str, Any], resume: int | None) -> None:
        from mlflow.tracking import MlflowClient

        # Its INFO lines ("Creating initial MLflow database tables...") would crowd the console.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
        store = run_dir.resolve() / NAME
        store.mkdir(parents=True, exist_ok=True)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{store / 'mlflow.db'}"
        self._client = MlflowClient(tracking_uri=uri)
        saved = read_id(store / "run_id")
        if saved is not None and self._exists(saved):
            self._run_id = saved
            self._client.update_run(saved, status="RUNNING")
            return
        experiment = self._experiment(store, local=uri.startswith("sqlite:///"))
        tags = {"mlflow.source.git.commit": str(config.get("git_commit", ""))}
        run = self._client.create_run(experiment, run_name=run_name(run_dir), tags=tags)
        self._run_id = run.info.run_id
        save_id(store / "run_id", self._run_id)
        self._log_params(config)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def close(self, outcome: Outcome) -> None:
        self._client.set_terminated(self._run_id, status=_STATUS[outcome])

    def _exists(self, run_id: str) -> bool:
        """False when the store no longer holds the saved run (deleted, or another server)."""
        from mlflow.exceptions import MlflowException

        try:
            self._client.get_run(run_id)
        except MlflowException:
            return False
        return True

    def _experiment(self, store: Path, local: bool) -> str:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "tepo"
        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        artifacts = (store / "artifacts").as_uri() if local else None
        return self._client.create_experiment(name, artifact_location=artifacts)

    def _log_params(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)[:_PARAM_LENGTH]) for key, value in config.items()]
        for first in range(0, len(params), _PARAMS_PER_BATCH):
            batch = params[first : first + _PARAMS_PER_BATCH]
            self._client.log_batch(self._run_id, params=batch)


def build() -> MLflowTracker:
    return MLflowTracker()
