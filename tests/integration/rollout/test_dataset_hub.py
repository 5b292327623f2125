"""A run's tasks from a dataset named by Hugging Face id, against a stand-in Hub on a loopback port
(helpers/hub_server.py: huggingface_hub's real download code, no network): fetched into the cache with its splits,
read again offline from the cache with the Hub gone, and every way it cannot be had refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.hub_server import HubServer, hub_env

DATASET, GATED = "forge-test/sums", "forge-test/sums-gated"
TOKEN = "hf_dataset_token"
# Loads the run's tasks in a fresh process (huggingface_hub reads its variables when imported) and prints them.
LOAD = """
import json, sys
from forge.rollout.config import TasksConfig
from forge.rollout.tasks.source import TaskError, load_task_set
from forge.settings import build
config = build(TasksConfig, json.loads(sys.argv[1]))
try:
    tasks = load_task_set(train=None, dataset=config.dataset_spec(), eval_dataset=config.dataset_spec("test"))
except TaskError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
print(json.dumps({"train": [t["id"] for t in tasks.train], "eval": [t["id"] for t in tasks.eval],
                  "first": tasks.train[0]}))
"""


def write_dataset(root: Path, repo_id: str) -> None:
    """A dataset repository as the Hub holds one: parquet shards of a train and a test split under data/."""
    data = root / "datasets" / repo_id / "data"
    data.mkdir(parents=True)
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]
    pq.write_table(pa.Table.from_pylist(rows[:9]), data / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[9:]), data / "test-00000-of-00001.parquet")
    (root / "datasets" / repo_id / "README.md").write_text(f"# {repo_id}\n")


def load(dataset: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    values = {"dataset": dataset, "dataset_eval_split": "test", "dataset_columns": {"prompt": "question"},
              "verifier": "v.py:score"}
    return subprocess.run([sys.executable, "-c", LOAD, json.dumps(values)], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    write_dataset(root, DATASET)
    write_dataset(root, GATED)
    return root


def test_a_hub_dataset_reads_as_tasks_then_offline_from_the_cache(repos, tmp_path):
    home = tmp_path / "hf"
    with HubServer(repos, tmp_path / "server", gated=(GATED,), tokens=(TOKEN,)) as server:
        read = load(DATASET, hub_env(home, server.url))
        assert read.returncode == 0, read.stderr[-3000:]
        tasks = json.loads(read.stdout)
        assert tasks["train"] == [f"sums-train-{i}" for i in range(9)]
        assert tasks["eval"] == [f"sums-test-{i}" for i in range(3)]
        assert tasks["first"]["messages"] == [{"role": "user", "content": "What is 0 + 0?"}]
        assert tasks["first"]["answer"] == "0" and tasks["first"]["domain"] == "sums"
        fetched = [r["path"] for r in server.requests() if "/resolve/" in r["path"] and r["method"] == "GET"]
        assert any(path.endswith(".parquet") for path in fetched)

        gated = load(GATED, hub_env(home, server.url))
        assert gated.returncode == 2
        assert gated.stderr.strip().splitlines() == [
            f"dataset {GATED}: a gated dataset: accept its conditions on its page on the Hub ({server.url}), then "
            "set HF_TOKEN to a token of that account"]
        assert load(GATED, hub_env(home, server.url, HF_TOKEN=TOKEN)).returncode == 0

        unknown = load("forge-test/nothing", hub_env(home, server.url))
        assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
            f"dataset forge-test/nothing: no such dataset on the Hub ({server.url}) (if it is private, set HF_TOKEN "
            "to a token that may read it)"]

    offline = load(DATASET, hub_env(home, server.url, HF_HUB_OFFLINE="1"))       # the Hub is gone
    assert offline.returncode == 0, offline.stderr[-3000:]
    assert json.loads(offline.stdout)["train"] == tasks["train"]
    empty = load(DATASET, hub_env(tmp_path / "empty", server.url, HF_HUB_OFFLINE="1"))
    assert empty.returncode == 2 and "HF_HUB_OFFLINE forbids fetching it" in empty.stderr
    assert len(empty.stderr.strip().splitlines()) == 1
