"""trackio: a local-first run in the project, stored in trackio's SQLite database (``TRACKIO_DIR``, by default in the
Hugging Face cache) and shown by ``trackio show``; its run opens with the settings, which it takes only then."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trackio

from forge.tracking.base import Tracker
from forge.tracking.config import TrackingConfig


class TrackioTracker(Tracker):
    name = "trackio"

    def __init__(self, config: TrackingConfig, run_dir: Path, run_name: str) -> None:
        self.project, self.run_name, self.tags = config.project, run_name, list(config.tags)
        self.run: Any = None

    def _opened(self, config: Mapping[str, Any] | None = None) -> Any:
        if self.run is None:
            self.run = trackio.init(project=self.project, name=self.run_name,
                                    config={"tags": self.tags, **(config or {})}, embed=False,
                                    auto_log_cpu=False, auto_log_gpu=False)
        return self.run

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._opened(config)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._opened().log(dict(metrics), step=step)

    def log_table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = list(rows[0])
        table = trackio.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
        self._opened().log({name: table}, step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
