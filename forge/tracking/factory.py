"""The one place that picks trackers: from the ``[tracking]`` settings, the run's trackers, each opened in its own
thread by its module (imported there, so a library is loaded only when its tracker is used)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from forge.tracking.base import Tracker
from forge.tracking.config import TrackingConfig
from forge.tracking.fanout import Trackers

# Tracker name → (module, class) implementing it.
MODULES = {"mlflow": ("forge.tracking.mlflow_tracker", "MlflowTracker"),
           "tensorboard": ("forge.tracking.tensorboard_tracker", "TensorboardTracker"),
           "trackio": ("forge.tracking.trackio_tracker", "TrackioTracker"),
           "wandb": ("forge.tracking.wandb_tracker", "WandbTracker")}


def _open(name: str, config: TrackingConfig, run_dir: Path, run_name: str) -> Tracker:
    module, cls = MODULES[name]
    return getattr(importlib.import_module(module), cls)(config, run_dir, run_name)


def open_trackers(config: TrackingConfig, run_dir: Path, run_config: Mapping[str, Any] | None = None,
                  suffix: str = "", openers: Mapping[str, Callable[[], Tracker]] | None = None) -> Trackers:
    """The trackers ``config`` names for the run in ``run_dir`` (named ``--tracking-run-name``, else the directory's
    name, with ``suffix``), their runs given ``run_config`` (its settings as JSON) with the run directory and tags.
    ``openers`` adds trackers of one's own by name (a test's)."""
    run_dir = Path(run_dir).resolve()
    run_name = (config.run_name or run_dir.name) + suffix
    found: dict[str, Callable[[], Tracker]] = {name: partial(_open, name, config, run_dir, run_name)
                                               for name in config.trackers}
    found.update(openers or {})
    trackers = Trackers(found)
    trackers.log_config({"run_name": run_name, "run_dir": str(run_dir), "tags": list(config.tags),
                         **(run_config or {})})
    return trackers
