"""``forge up --model org/name`` against a stand-in Hub (helpers/hub_server.py): the run fetches the model once,
before any service starts (the Hub serves one snapshot's files, once each), trains a step on it, and runs again with
``HF_HUB_OFFLINE=1`` from the cache with the Hub gone. Its services are given the id and ``HF_HUB_OFFLINE=1``: they
read the cache only. Steps, not minutes: the outcome does not depend on the machine's speed."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import huggingface_hub.constants
import pytest

from forge.app.up.config import UpConfig
from forge.app.up.plan import Plan
from forge.rollout.config import ModelChoice

from conftest import script
from helpers.hub_server import HubServer, hub_env, write_model_repo

pytestmark = pytest.mark.xdist_group("serial")      # a forge up run (conftest.SERIAL)

MODEL = "org/tiny-random"
# As short as a run goes: one domain, one held-out task read once, short calls, one group of two a step.
SHORT = ("--steps", "1", "--minutes", "20", "--domains", "reasoning", "--eval-size", "1", "--eval-samples", "1",
         "--max-tokens", "16", "--groups-in-flight", "2", "--group-size", "2", "--set", "learner.batch_groups=1",
         "--no-cache")


def forge_up(run_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([script("forge"), "up", "--model", MODEL, "--run-dir", str(run_dir), *SHORT],
                          capture_output=True, text=True, timeout=1500, env=env, cwd=run_dir.parent)


def trained(result: subprocess.CompletedProcess, run_dir: Path, directory: Path) -> None:
    """The run ended well, fetched (or found) ``directory`` first, and made its learner step."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"model {MODEL}: {directory}" in result.stdout.splitlines()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["learner"]["step"] >= 1 and summary["episodes"] > 0


@pytest.mark.timeout(3000)
def test_forge_up_fetches_the_model_once_then_runs_offline_from_the_cache(tmp_path, monkeypatch):
    root, home = tmp_path / "hub", tmp_path / "hf"
    write_model_repo(root, MODEL, seed=3)
    with HubServer(root, tmp_path / "server") as server:
        first = forge_up(tmp_path / "run", hub_env(home, server.url))
        asked = Counter("resolve" if "/resolve/" in r["path"] else r["path"] for r in server.requests())
    directories = list((home / "hub" / "models--org--tiny-random" / "snapshots").iterdir())
    assert len(directories) == 1
    trained(first, tmp_path / "run", directories[0])
    files = len(list(directories[0].iterdir()))
    # One fetch, in forge up's own process: the model's info and file list once, each file's HEAD and GET once.
    assert asked == {f"/api/models/{MODEL}/revision/main": 1,
                     f"/api/models/{MODEL}/tree/{directories[0].name}": 1, "resolve": 2 * files}

    second = forge_up(tmp_path / "offline", hub_env(home, server.url, HF_HUB_OFFLINE="1"))
    trained(second, tmp_path / "offline", directories[0])

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    instances = Plan(UpConfig(model=ModelChoice(path=MODEL), run_dir=tmp_path / "plan")).check()
    assert all(instance.environment()["HF_HUB_OFFLINE"] == "1" for instance in instances)
    assert {instance.settings.model for instance in instances if hasattr(instance.settings, "model")} == {MODEL}
