"""OpenEnv environments played unchanged: ``forge up --config`` with ``[env] openenv`` (Forge serves the class) trains
on a text environment whose observations and replies go back and forth; with ``openenv_url`` (a uvicorn process the
test starts) on an MCP environment whose tools reach the model as OpenAI tools and whose tool calls are steps;
each session's reward is the sum of its steps', the held-out reward is read at both ends. (Environments refused
before anything starts: test_env_refusals.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from forge.checkpoints import load_tokenizer

from conftest import free_port, script
from helpers import short_runs
from helpers.short_runs import completed

ENVS = Path(__file__).parent / "openenv_envs"
pytestmark = pytest.mark.xdist_group("serial")  # forge up runs: one at a time (conftest.SERIAL)


def forge_up(tmp_path: Path, env: str, timeout: float = 900) -> subprocess.CompletedProcess:
    # room for a call's arguments: a long number cut short parses as no call
    return short_runs.forge_up(tmp_path, f"[env]\n{env}\n", timeout, max_tokens=200)


@pytest.fixture
def calc_server(tmp_path):
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "oe_envs:calc_app", "--host", "127.0.0.1",
                                "--port", str(port), "--log-level", "warning"], cwd=ENVS, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:                         # up once it answers; a server that died fails the test at once
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            try:
                process.wait(timeout=0.2)
                pytest.fail(f"the OpenEnv server exited: {(tmp_path / 'server.log').read_text()}")
            except subprocess.TimeoutExpired:
                pass
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_text_environment_served_by_forge_trains(tmp_path):
    result = forge_up(tmp_path, f'openenv = "{ENVS / "oe_envs.py"}:QAEnvironment"\nseeds = 8\neval_fraction = 0.25\n'
                                'group_size = 2')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["domains"] == ["QAEnvironment"] and set(summary["eval_end"]) == {"QAEnvironment"}
    assert "environment: QAEnvironment (OpenEnv, served by Forge" in result.stdout
    assert summary["learner"]["step"] >= 2
    scored = completed(tmp_path / "run" / "pool")
    assert scored and all(set(s.session.outcome_rewards) == {"reward"} for s in scored)
    assert all(s.session.metrics["steps"] == s.session.metrics["turns"] >= 1 for s in scored), "a reply a step"
    tokenizer = load_tokenizer("tiny")
    retried = [s for s in scored if len(s.calls) == 2]
    assert retried, "some episode went on after a wrong reply"
    prompt = tokenizer.decode(list(retried[0].calls[1].prompt_ids))
    assert "feedback: wrong" in prompt and "Try again." in prompt, "the next observation reached the model"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_an_mcp_environment_at_a_url_trains_with_its_tools(tmp_path, calc_server):
    result = forge_up(tmp_path, f'openenv_url = "{calc_server}"\nseeds = 8\neval_fraction = 0.25\ngroup_size = 2\n'
                                'tool_choice = "required"\nmax_turns = 3')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["domains"] == ["CalcEnvironment"], "the server's own name is the domain"
    assert summary["learner"]["step"] >= 2 and set(summary["eval_end"]) == {"CalcEnvironment"}
    scored = completed(tmp_path / "run" / "pool")
    assert scored and all(set(s.session.outcome_rewards) == {"reward"} for s in scored)
    # Every reply opens a call held to the tool's schema; one cut short by max_tokens parses as no call and ends.
    stepped = [s for s in scored if s.session.metrics["steps"] >= 1]
    assert stepped, "tool calls were steps of the environment"
    tokenizer = load_tokenizer("tiny")
    first = tokenizer.decode(list(scored[0].calls[0].prompt_ids))
    assert '"name": "add"' in first and '"name": "submit"' in first, "the environment's tools reached the model"
    later = [tokenizer.decode(list(c.prompt_ids)) for s in stepped for c in s.calls[1:]]
    assert any("<tool_response>" in text for text in later), "a tool's result went back to the model"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_forge_rollout_plays_an_environment_against_a_running_gateway(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'[model]\npath = "tiny"\n\n[env]\nopenenv = "{ENVS / "oe_envs.py"}:QAEnvironment"\nseeds = 4\n'
                        'group_size = 2\n')
    result = short_runs.forge_rollout(tmp_path, run_file, episodes=8)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "QAEnvironment" in result.stdout
    done = [s.session for s in completed(tmp_path / "pool")]
    assert len(done) >= 8 and all(s.domain == "QAEnvironment" and set(s.outcome_rewards) == {"reward"} for s in done)
    result = subprocess.run([script("forge"), "rollout", "--config", str(run_file), "--gateway", "127.0.0.1:1"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "an environment's agent reaches its session over HTTP" in result.stderr
