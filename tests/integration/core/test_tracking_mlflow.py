"""forge-learner logging to a real MLflow tracking server (``mlflow server`` on a free loopback port, a SQLite store
and an artifact directory of the test's own): the run holds every step's loss, the settings as params and as
config.json, the sample tables as artifacts, and ends FINISHED; and when the server is killed mid-run, training goes
on to its last step with one warning saying the tracker was dropped."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from forge.checkpoints import load_model
from forge.pool import Pool

from conftest import script
from helpers.learner_runs import fill_from, write_tiny_pool
from helpers.mlflow_server import MlflowServer
from helpers.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
MlflowClient = pytest.importorskip("mlflow").MlflowClient
STEPS = 4


@pytest.fixture
def server(tmp_path, subprocess_env):
    started = MlflowServer(tmp_path, subprocess_env)
    yield started
    started.kill()


def learner(tmp_path: Path, uri: str, env: dict[str, str], *extra: str) -> subprocess.Popen:
    env = {**env, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
    return subprocess.Popen(
        [script("forge-learner"), "--pool", str(tmp_path / "pool"), "--run-dir", str(tmp_path / "run"), "--model",
         "tiny", "--no-publish", "--device", "cpu", "--batch-groups", "2", "--window", "4", "--min-groups", "2",
         "--max-steps", str(STEPS), "--tracker", "mlflow", "--tracking-uri", uri, "--tracking-project", "forge-test",
         "--tracking-run-name", "r1", "--tracking-tags", "ci,tiny", "--sample-table-every", "2",
         "--sample-table-size", "2", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def the_run(uri: str):
    runs = MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("forge-test").experiment_id], "attributes.run_name = 'r1'")
    assert len(runs) == 1
    return runs[0]


def test_the_learner_logs_its_run_to_an_mlflow_server(tmp_path, server, subprocess_env):
    write_tiny_pool(tmp_path / "pool", groups=2 * STEPS, calls=2)
    proc = learner(tmp_path, server.uri, subprocess_env)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]
    assert "tracker mlflow failed" not in output

    client = MlflowClient(server.uri)
    run = the_run(server.uri)
    assert run.info.status == "FINISHED"
    loss = client.get_metric_history(run.info.run_id, "learner/loss")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sorted((m.step, m.value) for m in loss) == [(r["step"], pytest.approx(r["loss"])) for r in records]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "learner/reward/qa")) == [1, 2, 3, 4]
    params = run.data.params
    assert params["learner.trainer.max_steps"] == "4" and params["learner.tracking.trackers"] == '["mlflow"]'
    assert params["learner.run_dir"] == str(tmp_path / "run") and params["run_name"] == "r1"
    assert run.data.tags["tag.ci"] == "true" and run.data.tags["run_dir"] == str((tmp_path / "run").resolve())
    artifacts = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "downloaded")))
    config = json.loads((artifacts / "config.json").read_text())
    assert config["learner"]["window"]["batch_groups"] == 2 and config["tags"] == ["ci", "tiny"]
    tables = sorted((artifacts / "samples").glob("*.json"))
    assert [t.name for t in tables] == ["step-0000002.json", "step-0000004.json"]
    table = json.loads(tables[0].read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert len(rows) == 2 and all(row["step"] == 2 and row["text"] and row["calls"] == 2 for row in rows)


def test_training_goes_on_when_the_mlflow_server_dies_mid_run(tmp_path, server, subprocess_env):
    write_tiny_pool(tmp_path / "pool", groups=STEPS, calls=1)        # two steps' worth, the rest comes later
    proc = learner(tmp_path, server.uri, subprocess_env)
    metrics = tmp_path / "run" / "metrics.jsonl"
    client = MlflowClient(server.uri)

    def logged_two_steps() -> bool:
        if not metrics.exists() or len(metrics.read_text().splitlines()) < 2:
            return False
        try:
            return len(client.get_metric_history(the_run(server.uri).info.run_id, "learner/loss")) >= 2
        except Exception:
            return False

    wait_for(logged_two_steps, "the server to hold two steps", timeout_s=600, watched=[proc], interval_s=0.5)
    server.kill()
    with Pool(tmp_path / "pool") as pool:           # the learner trains on while the server is gone
        fill_from(pool, load_model("tiny")[0], groups=STEPS, group_size=2, seed=1)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4]
    warnings = [line for line in output.splitlines() if "tracker mlflow" in line]
    assert len(warnings) == 1 and "failed and is dropped for the rest of the run" in warnings[0], output[-4000:]
