"""The ``[tracking]`` table: which experiment trackers a run logs to, the project and run they log under, MLflow's
tracking URI, and how often and how many of the learner's trajectories go to them as a sample table."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from urllib.parse import urlsplit

from forge.settings import Settings, SettingsError, setting

# Tracker name → the module its library installs (the ``tracking`` extra).
LIBRARIES = {"mlflow": "mlflow", "tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}
TRACKERS = tuple(LIBRARIES)
# The schemes of the tracking stores MLflow's client opens (a SQLAlchemy database may name its driver: mysql+pymysql).
MLFLOW_SCHEMES = ("", "file", "http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")


def check_mlflow_uri(uri: str) -> None:
    """ValueError unless ``uri`` is a tracking URI MLflow's client can open: a local path, file:, http(s) with a
    host, a database URL (sqlite with a path) or databricks."""
    if not uri.strip() or any(c.isspace() for c in uri):
        raise ValueError(f"{uri!r} is not a URI (no blanks allowed)")
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise ValueError(f"{uri!r} is malformed: {exc}") from None
    scheme = parts.scheme.split("+")[0]
    if scheme not in MLFLOW_SCHEMES:
        raise ValueError(f"{uri!r}: MLflow has no tracking store for scheme {parts.scheme!r} (one of "
                         f"{', '.join(s + ':' for s in MLFLOW_SCHEMES if s)} or a local path)")
    if scheme in ("http", "https") and not parts.hostname:
        raise ValueError(f"{uri!r} names no host")
    if scheme == "sqlite" and not parts.path.strip("/"):
        raise ValueError(f"{uri!r} names no database file (sqlite:///PATH)")


@dataclass(frozen=True, kw_only=True)
class TrackingConfig(Settings):
    trackers: tuple[str, ...] = setting((), flag="tracker", separator=",", choices=TRACKERS, metavar="NAMES",
                                        help="Log the run's settings, metrics and sample tables to these experiment "
                                             "trackers, comma-separated (pip install 'forge-rl[tracking]'); one that "
                                             "fails while the run goes on is dropped with a warning.")
    project: str = setting("forge", flag="tracking_project",
                           help="The W&B and trackio project, the MLflow experiment the run is logged under.")
    run_name: str | None = setting(None, flag="tracking_run_name",
                                   help="The run's name in the trackers [default: the run directory's name].")
    tags: tuple[str, ...] = setting((), flag="tracking_tags", separator=",", metavar="TAGS",
                                    help="Tags of the run in the trackers, comma-separated.")
    uri: str | None = setting(None, flag="tracking_uri", env="MLFLOW_TRACKING_URI", metavar="URI",
                              help="MLflow's tracking URI (http://HOST:PORT, sqlite:///PATH, a directory, ...) "
                                   "[default: MLFLOW_TRACKING_URI, else sqlite:///RUN_DIR/mlflow.db].")
    sample_every: int = setting(10, flag="sample_table_every", min=0,
                                help="Every this many learner steps, some of the step's trajectories as text (with "
                                     "their rewards, advantages and versions) to the learner's samples.jsonl and the "
                                     "trackers' sample table (0: never).")
    sample_size: int = setting(4, flag="sample_table_size", min=1,
                               help="Trajectories in each sample table.")

    def check(self) -> None:
        for name in self.trackers:
            if importlib.util.find_spec(LIBRARIES[name]) is None:
                raise SettingsError(f"{name} is not installed: pip install 'forge-rl[tracking]'", "--tracker")
        if "mlflow" in self.trackers and self.uri is not None:
            try:
                check_mlflow_uri(self.uri)
            except ValueError as exc:
                raise SettingsError(str(exc), "--tracking-uri") from None
