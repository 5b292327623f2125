"""MLflow: a run in the experiment named by the project, on the tracking server or store of ``--tracking-uri`` (else
``MLFLOW_TRACKING_URI``, else a SQLite store in the run directory): settings as params (dotted keys) and as
config.json, metrics by step, sample tables as JSON artifacts under samples/."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus

from forge.tracking.base import Tracker
from forge.tracking.config import TrackingConfig
from forge.tracking.jsonable import flat

PARAMS_PER_CALL = 100           # MLflow's limit on the params of one log_batch
PARAM_CHARS = 6000              # and on a param value's length
NOT_IN_NAMES = re.compile(r"[^\w.\- :/]")      # what MLflow refuses in a metric's or param's name


def _name(key: str) -> str:
    """``key`` as MLflow takes a name (a team's domain may hold any character)."""
    return NOT_IN_NAMES.sub("_", key)


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, config: TrackingConfig, run_dir: Path, run_name: str) -> None:
        # The setting reads MLFLOW_TRACKING_URI itself (its env), so None here means neither was given.
        run_dir.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=config.uri or f"sqlite:///{run_dir / 'mlflow.db'}")
        experiment = self.client.get_experiment_by_name(config.project)
        # A store of the run's own keeps its artifacts beside it; a server decides where its artifacts go.
        artifacts = None if config.uri else (run_dir / "mlartifacts").as_uri()
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
            config.project, artifact_location=artifacts)
        tags = {"run_dir": str(run_dir), **{f"tag.{tag}": "true" for tag in config.tags}}
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id

    def log_config(self, config: Mapping[str, Any]) -> None:
        params = [Param(_name(key), (value if isinstance(value, str) else json.dumps(value))[:PARAM_CHARS])
                  for key, value in flat(config).items()]
        for start in range(0, len(params), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[start:start + PARAMS_PER_CALL])
        self.client.log_dict(self.run_id, dict(config), "config.json")

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(_name(key), float(value), now, step)
                                                    for key, value in metrics.items()])

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = list(rows[0])
        self.client.log_table(self.run_id, {c: [row.get(c) for row in rows] for c in columns},
                              f"{name}/step-{step:07d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))
