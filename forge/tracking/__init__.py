"""Experiment trackers (W&B, MLflow, TensorBoard, trackio): a run's settings, its metrics step by step and tables of
sampled trajectories, logged to whichever trackers the ``[tracking]`` table names. ``Tracker`` is the one interface,
one module per library implements it, ``open_trackers`` picks them, and ``Trackers`` keeps a failing tracker from
ever stopping the run. The libraries are the ``tracking`` extra, imported only when their tracker is used."""

from forge.tracking.base import Tracker
from forge.tracking.config import TRACKERS, TrackingConfig
from forge.tracking.factory import open_trackers
from forge.tracking.fanout import Trackers
from forge.tracking.jsonable import plain, settings_json

__all__ = ["TRACKERS", "Tracker", "Trackers", "TrackingConfig", "open_trackers", "plain", "settings_json"]
