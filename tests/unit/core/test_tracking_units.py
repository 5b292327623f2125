"""Experiment trackers (forge.tracking): the [tracking] settings refused at once for a tracker that is not one or an
MLflow URI its client cannot open; settings as plain JSON (summary.json's and the trackers' config); a tracker that
raises dropped with one warning while the others go on; TensorBoard's event files read back with TensorBoard's own
reader, an offline W&B run's records and trackio's store read back. (MLflow against a real server:
integration/core/test_tracking_mlflow.py.)"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from click.testing import CliRunner

from forge.app.up.cli import up
from forge.app.up.config import UpConfig
from forge.learner.cli import learner
from forge.learner.config import LearnerConfig
from forge.settings import SettingsError
from forge.tracking import Tracker, TrackingConfig, open_trackers, settings_json
from forge.tracking.config import check_mlflow_uri

from helpers.wandb_log import config as wandb_config
from helpers.wandb_log import history as wandb_history


class Recording(Tracker):
    """A tracker that keeps what it is given."""

    name = "recording"

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at, self.config, self.steps, self.tables, self.closed = fail_at, {}, [], [], False

    def log_config(self, config):
        self.config = dict(config)

    def log_metrics(self, step, metrics):
        if step == self.fail_at:
            raise ConnectionError(f"tracking server gone at step {step}\nsecond line")
        self.steps.append((step, dict(metrics)))

    def log_table(self, step, name, rows):
        self.tables.append((step, name, list(rows)))

    def close(self):
        self.closed = True


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "https://mlflow.example.com/path", "sqlite:///tmp/m.db",
                                 "postgresql+psycopg2://u:p@db:5432/mlflow", "file:///tmp/mlruns", "/tmp/mlruns",
                                 "databricks"])
def test_mlflow_uris_it_can_open_pass(uri):
    check_mlflow_uri(uri)


@pytest.mark.parametrize(("uri", "why"), [("ftp://host/x", "no tracking store for scheme 'ftp'"),
                                          ("http://", "names no host"), ("sqlite://", "names no database"),
                                          ("http://host:port", "malformed"), ("a uri", "no blanks")])
def test_mlflow_uris_it_cannot_open_are_refused_saying_why(uri, why):
    with pytest.raises(ValueError, match=why):
        check_mlflow_uri(uri)


def test_a_tracker_that_is_not_installed_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules["forge.tracking.config"].LIBRARIES, "wandb", "no_such_tracking_library")
    with pytest.raises(SettingsError, match=r"--tracker: wandb is not installed: pip install 'forge-rl\[tracking\]'"):
        TrackingConfig(trackers=("wandb",))
    with pytest.raises(SettingsError, match="must be one of"):
        TrackingConfig(trackers=("neptune",))


@pytest.mark.parametrize(("command", "args", "why"), [
    (learner, ["--tracker", "mlflow,bogus"], "'--tracker': must be one of mlflow, tensorboard, trackio, wandb"),
    (learner, ["--tracker", "mlflow", "--tracking-uri", "ftp://x/y"], "MLflow has no tracking store for scheme"),
    (up, ["--tracker", "tensorboard,mlflow", "--tracking-uri", "http://"], "'--tracking-uri': 'http://' names no host"),
])
def test_a_bad_tracker_or_uri_stops_the_command_before_anything_starts(tmp_path, command, args, why):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(command, [*args, "--run-dir", str(run_dir),
                                          *(["--pool", str(tmp_path / "pool"), "--create-pool"]
                                            if command is learner else [])])
    assert result.exit_code == 2, result.output
    assert why in result.output
    assert not run_dir.exists() and not (tmp_path / "pool").exists()       # nothing was started


def test_trackers_come_from_a_run_files_tracking_table_comma_separated_or_listed(tmp_path):
    seen = {}
    for text in ('trackers = "tensorboard, mlflow"', 'tracker = ["tensorboard", "mlflow"]'):
        run_file = tmp_path / "run.toml"
        run_file.write_text(f"[tracking]\n{text}\ntags = ['a', 'b']\nsample_every = 3\n")
        command = type(learner)("learner", LearnerConfig, "learner",
                                lambda config, text=text: seen.setdefault(text, config.tracking),
                                shared_tables=("tracking",))
        result = CliRunner().invoke(command, ["--config", str(run_file), "--pool", str(tmp_path)])
        assert result.exit_code == 0, result.output
    for tracking in seen.values():
        assert tracking.trackers == ("tensorboard", "mlflow") and tracking.tags == ("a", "b")
        assert tracking.sample_every == 3


def test_settings_are_plain_json_with_secrets_masked(tmp_path):
    config = LearnerConfig(pool_address="127.0.0.1:1", pool_api_key="very-secret", run_dir=tmp_path / "run")
    found = settings_json(config)
    assert json.loads(json.dumps(found)) == found
    assert found["run_dir"] == str(tmp_path / "run") and found["pool_api_key"] == "***"
    assert found["trainer"]["lr"] == 1e-5 and found["tracking"]["trackers"] == []
    assert found["loss"] and isinstance(found["window"], dict)
    up_config = UpConfig(run_dir=tmp_path).with_services(learner={"lr": 1e-4})
    text = json.dumps(settings_json(up_config))
    assert "services" not in settings_json(up_config)        # internal: each service's resolved settings instead
    assert "<class" not in text and "very-secret" not in json.dumps(found)
    assert settings_json(up_config)["driver"]["groups_in_flight"] == 6


def test_a_tracker_that_raises_is_dropped_with_one_warning_and_the_others_go_on(tmp_path, caplog):
    flaky, kept = Recording(fail_at=2), Recording()
    trackers = open_trackers(TrackingConfig(run_name="r", tags=("t",)), tmp_path, {"learner": {"lr": 0.1}},
                             openers={"flaky": lambda: flaky, "kept": lambda: kept})
    with caplog.at_level(logging.WARNING, logger="forge.tracking"):
        for step in range(1, 6):
            trackers.log_metrics(step, {"learner/loss": 1.0 / step})
        trackers.log_table(5, "samples", [{"domain": "qa", "text": "x"}])
        trackers.close()
    assert [step for step, _ in kept.steps] == [1, 2, 3, 4, 5] and kept.tables[0][:2] == (5, "samples")
    assert [step for step, _ in flaky.steps] == [1] and flaky.tables == [] and flaky.closed
    assert kept.config == {"run_name": "r", "run_dir": str(tmp_path.resolve()), "tags": ["t"],
                           "learner": {"lr": 0.1}}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["tracker flaky failed and is dropped for the rest of the run: tracking server gone at step 2"]
    assert trackers.names == ["kept"]


def test_tensorboard_event_files_hold_the_scalars_the_config_and_the_sample_table(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = open_trackers(TrackingConfig(trackers=("tensorboard",)), tmp_path / "run", {"up": {"minutes": 1.5}})
    for step in (1, 2, 3):
        trackers.log_metrics(step, {"learner/loss": 0.5 * step, "eval/reward/qa": 0.1 * step})
    trackers.log_table(3, "samples", [{"domain": "qa", "text": "a | b\nc", "advantage": 0.25}])
    trackers.close()
    logs = tmp_path / "run" / "tensorboard" / "run"
    events = EventAccumulator(str(logs), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("learner/loss")] == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert [e.step for e in events.Scalars("eval/reward/qa")] == [1, 2, 3]
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
             for tag in events.Tags()["tensors"]}
    config = json.loads("\n".join(line[4:] for line in texts["config/text_summary"][0][1].splitlines()))
    assert config["up"] == {"minutes": 1.5} and config["run_name"] == "run"
    step, table = texts["samples/text_summary"][0]
    assert step == 3 and "| domain | text | advantage |" in table and "a \\| b<br>c" in table


def test_an_offline_wandb_run_directory_holds_the_metrics_config_and_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = open_trackers(TrackingConfig(trackers=("wandb",), project="p", tags=("x",)), tmp_path / "run",
                             {"learner": {"trainer": {"lr": 0.001}}})
    for step in (1, 2):
        trackers.log_metrics(step, {"learner/loss": float(step)})
    trackers.log_table(2, "samples", [{"domain": "qa", "text": "hello"}])
    trackers.close()
    assert trackers.names == ["wandb"]
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    log = next(runs[0].glob("*.wandb"))
    rows = wandb_history(log)
    assert [row["learner/loss"] for row in rows] == [1.0, 2.0]
    assert rows[-1]["samples/_type"] == "table-file" and rows[-1]["samples/nrows"] == 1
    table = json.loads(next((runs[0] / "files" / "media" / "table").glob("samples_2_*.table.json")).read_text())
    assert table["columns"] == ["domain", "text"] and table["data"] == [["qa", "hello"]]
    assert wandb_config(log)["learner"] == {"trainer": {"lr": 0.001}}


TRACKIO_READ_BACK = """
import json, sys
from pathlib import Path
from forge.tracking import TrackingConfig, open_trackers
trackers = open_trackers(TrackingConfig(trackers=("trackio",), project="forge-test", run_name="r1"), Path(sys.argv[1]),
                         {"up": {"minutes": 2.0}})
for step in (1, 2, 3):
    trackers.log_metrics(step, {"learner/loss": float(step)})
trackers.close()
from trackio.sqlite_storage import SQLiteStorage
logs = SQLiteStorage.get_logs("forge-test", "r1")
config = SQLiteStorage.get_run_config("forge-test", "r1")
print(json.dumps({"names": trackers.names, "loss": [[r["step"], r["learner/loss"]] for r in logs
                  if "learner/loss" in r], "config": config}))
"""


def test_trackio_stores_the_run_locally(tmp_path, subprocess_env):
    subprocess_env.update(TRACKIO_DIR=str(tmp_path / "trackio"), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", TRACKIO_READ_BACK, str(tmp_path / "run")], env=subprocess_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["names"] == ["trackio"]
    assert found["loss"] == [[1, 1.0], [2, 2.0], [3, 3.0]]
    assert found["config"]["up"] == {"minutes": 2.0}
    assert (tmp_path / "trackio" / "forge-test.db").exists()


def test_mlflow_names_keep_what_mlflow_takes():
    from forge.tracking.mlflow_tracker import _name

    assert _name("eval/reward/math+code") == "eval/reward/math_code"
    assert _name("services.actor-0.engine.kv_cache_bytes") == "services.actor-0.engine.kv_cache_bytes"
