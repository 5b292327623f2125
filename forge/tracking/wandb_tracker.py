"""Weights & Biases: a run in the project, its files under RUN_DIR/wandb; online where W&B is reachable and logged
in, or with ``WANDB_MODE=offline`` a local run directory that ``wandb sync`` uploads later."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import wandb

from forge.tracking.base import Tracker
from forge.tracking.config import TrackingConfig


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, config: TrackingConfig, run_dir: Path, run_name: str) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        # Several runs of one process (forge up --run a --run b) each get a run of their own.
        # Forge's own logs stay in the run directory: W&B does not capture this process's console.
        self.run = wandb.init(project=config.project, name=run_name, tags=list(config.tags), dir=str(run_dir),
                              reinit="create_new", settings=wandb.Settings(console="off"))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = list(rows[0])
        table = wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
        self.run.log({name: table}, step=step)

    def close(self) -> None:
        self.run.finish()
