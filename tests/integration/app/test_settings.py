"""Settings through the programs: ``forge config show`` reports each setting's source (and never a key), the example
run files are valid for every service, and an actor that is no address, an empty key variable or a missing key file
is refused in one line before anything starts. (The settings and options themselves: unit/test_settings.py.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from forge.app.config_show import settings_commands
from forge.learner.config import LearnerConfig
from forge.settings import entries

from conftest import REPO, script

COMMANDS = settings_commands()


def test_config_show_lists_every_learner_setting_with_its_source(tmp_path):
    env = {"FORGE_LEARNER_SEED": "7", "FORGE_LEARNER_POOL_API_KEY": "s3cret"}
    result = subprocess.run([script("forge"), "config", "show", "learner", "--config", str(REPO / "examples/run.toml"),
                             "--json"], capture_output=True, text=True, timeout=120, env={**_env(), **env})
    report = json.loads(result.stdout)
    rows = {row["name"]: row for row in report["settings"]}
    assert set(rows) == {e.name for e in entries(LearnerConfig)}
    assert rows["lr"]["source"] == "file" and rows["lr"]["value"] == 2e-4
    assert rows["eps_high"]["source"] == "file"                   # from the [learner.loss] sub-table
    assert rows["seed"]["source"] == "environment" and rows["seed"]["value"] == 7
    assert rows["pool_api_key"]["value"] == "***" and "s3cret" not in result.stdout
    assert rows["micro_batch_tokens"]["source"] == "file" and rows["max_steps"]["source"] == "default"
    assert "exactly one of --pool and --pool-address" in report["error"] and result.returncode == 2


def test_the_example_run_file_is_valid_for_every_service():
    for table in COMMANDS:
        args = ["--config", str(REPO / "examples/run.toml")]
        result = subprocess.run([script("forge"), "config", "show", table, *args, "--json"], capture_output=True,
                                text=True, timeout=120, env=_env())
        report = json.loads(result.stdout)
        assert any(row["source"] == "file" for row in report["settings"]), table


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}


def test_forge_up_reads_the_shared_model_tasks_and_agent_tables(tmp_path):
    run_file = REPO / "examples" / "blackbox" / "run.toml"
    result = subprocess.run([script("forge"), "config", "show", "up", "--config", str(run_file), "--json"],
                            capture_output=True, text=True, timeout=120, env=_env())
    rows = {row["name"]: row for row in json.loads(result.stdout)["settings"]}
    assert result.returncode == 0, result.stderr
    assert rows["tasks"]["value"] == "tasks/train.jsonl" and rows["tasks"]["source"] == "file"
    assert rows["agent_timeout"]["value"] == 120.0           # [agent] timeout_s: a group's field name as the key
    assert rows["agent"]["value"] == "python agent.py" and rows["model"]["source"] == "file"
    both = tmp_path / "both.toml"
    both.write_text('[tasks]\ngroup_size = 2\n\n[up.tasks]\ngroup_size = 3\n')
    result = subprocess.run([script("forge"), "config", "show", "up", "--config", str(both)], capture_output=True,
                            text=True, timeout=120, env=_env())
    assert result.returncode == 2 and "give [tasks] or [up.tasks], not both" in result.stderr


@pytest.mark.parametrize("command, variable", [("forge-gateway", "FORGE_GATEWAY_API_KEYS"),
                                               ("forge-actor", "FORGE_ACTOR_API_KEYS"),
                                               ("forge-cache", "FORGE_CACHE_API_KEYS")])
@pytest.mark.parametrize("value", ["", "  "])
def test_a_key_variable_set_to_nothing_is_refused_not_read_as_no_auth(tmp_path, command, variable, value):
    """What a template with an unset variable gives: served without a key, it would switch authentication off."""
    import os

    env = {**os.environ, variable: value}
    result = subprocess.run([script(command), "--port", "0"] if command != "forge-gateway" else
                            [script(command), "--actor", "127.0.0.1:1", "--pool", str(tmp_path / "pool")],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and f"{variable} is set but empty" in result.stderr, result.stderr
    assert not (tmp_path / "pool").exists(), "nothing was started"


@pytest.mark.parametrize("address, reason", [("nonsense", "is not HOST:PORT"), ("127.0.0.1:0", "is not HOST:PORT"),
                                             ("127.0.0.1:99999", "is not HOST:PORT"), (":5000", "is not HOST:PORT"),
                                             ("::1:5000", "IPv6 host in brackets")])
def test_the_gateway_refuses_an_actor_that_is_no_address_before_starting(tmp_path, address, reason):
    result = subprocess.run([script("forge-gateway"), "--actor", address, "--pool", str(tmp_path / "pool")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and reason in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "pool").exists()


SERVICE_CALLS = {"gateway": ["forge-gateway", "--actor", "127.0.0.1:1", "--pool", "{tmp}/pool"],
                 "actor": ["forge-actor", "--port", "0"], "cache": ["forge-cache", "--dir", "{tmp}/cache"],
                 "learner": ["forge-learner", "--pool-address", "127.0.0.1:1"],
                 "pool": ["forge", "pool", "serve", "--path", "{tmp}/pool"],
                 "rollout": ["forge", "rollout", "--gateway", "127.0.0.1:1"]}


@pytest.mark.parametrize(("table", "flag"), [("gateway", "--api-key"), ("actor", "--api-key"), ("cache", "--api-key"),
                                             ("pool", "--api-key"), ("learner", "--pool-api-key"),
                                             ("rollout", "--api-key")])
def test_every_service_refuses_a_missing_key_file_in_one_line_before_starting(tmp_path, table, flag):
    program, *args = [a.format(tmp=tmp_path) for a in SERVICE_CALLS[table]]
    result = subprocess.run([script(program), *args, f"{flag}-file", str(tmp_path / "no-such-file")],
                            capture_output=True, text=True, timeout=120, env=_env())
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr
    assert f"'{flag}-file': cannot read {tmp_path / 'no-such-file'}" in errors[0] and "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir()), "nothing was started"


def test_config_show_shows_the_key_file_and_never_the_key(tmp_path):
    keys = tmp_path / "gateway.key"
    keys.write_text("very-secret-key\n")
    env = {**_env(), "FORGE_GATEWAY_API_KEY_FILE": str(keys), "FORGE_GATEWAY_ACTOR_API_KEY": "actor-secret"}
    result = subprocess.run([script("forge"), "config", "show", "gateway", "--json"], capture_output=True, text=True,
                            timeout=120, env=env)
    rows = {row["name"]: row for row in json.loads(result.stdout)["settings"]}
    assert rows["api_key_file"]["value"] == str(keys) and rows["api_key_file"]["source"] == "environment"
    assert rows["actor_api_key"]["value"] == "***" and rows["actor_api_key_file"]["value"] is None
    assert "very-secret-key" not in result.stdout + result.stderr and "actor-secret" not in result.stdout
