"""Popular agent frameworks at their defaults against a real gateway: each program (``programs/``, run in the agent
frameworks' own environment, ``make test-agents``) is a training session's black-box agent, run by Forge's own
runner with nothing but the session's base URL and key. Every call it makes must be accepted (no 4xx or 5xx) and
recorded, with ids the learner recomputes the actor's log-probabilities from.

The model is the pre-trained tiny one with its context raised (the frameworks' system prompts are long), so that
its turns end; what it answers does not matter here, only that every framework's requests are served exactly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from forge.pool import PoolReader
from forge.rollout.blackbox import AgentCommand, BlackBoxRunner

from conftest import REPO, script
from helpers.gateway_procs import start_actor, start_gateway
from helpers.recompute import learner_and_recorded

pytestmark = pytest.mark.agents


def agents_python() -> str:
    """The agent frameworks' interpreter (FORGE_AGENTS_PYTHON), as an absolute path: forge up runs programs from
    the run file's folder. Not resolved: a virtual environment's python is a link that must stay one."""
    return str(Path(os.environ["FORGE_AGENTS_PYTHON"]).absolute())

PROGRAMS = Path(__file__).parent / "programs"
TASK = {"task_id": "owner-bo", "domain": "agent",
        "messages": [{"role": "user", "content": "Who owns Bo? Use the lookup tool."}]}


def long_context_tiny(folder: Path) -> Path:
    """The pre-trained tiny checkpoint with room for the frameworks' prompts, written by the smolagents example's
    own script."""
    subprocess.run([sys.executable, str(REPO / "examples" / "smolagents" / "long_context.py"), str(folder)],
                   check=True, capture_output=True, timeout=120)
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("agents")
    checkpoint = long_context_tiny(directory / "tiny-long")
    actor = start_actor(directory, "actor", "--model", str(checkpoint), "--kv-cache-mb", "256")
    try:
        gateway = start_gateway(directory, [actor.address], directory / "pool", "--model", str(checkpoint))
        try:
            with PoolReader(directory / "pool") as reader:
                yield gateway, reader, checkpoint
        finally:
            gateway.stop()
    finally:
        actor.stop()


def failures(gateway) -> float:
    gauges = httpx.get(f"{gateway.http}/v1/stats", timeout=30).json()["gauges"]
    return gauges["client_errors"] + gauges["errors"]


@pytest.mark.parametrize("program", sorted(p.stem for p in PROGRAMS.glob("*.py")))
def test_the_framework_runs_unchanged_and_every_call_is_recorded_exactly(served, program):
    gateway, reader, checkpoint = served
    before = failures(gateway)
    opened = httpx.post(f"{gateway.http}/v1/sessions", json={"task_id": TASK["task_id"], "domain": "agent"},
                        timeout=30).json()
    session_id = opened["session"]["session_id"]
    runner = BlackBoxRunner(AgentCommand((agents_python(), str(PROGRAMS / f"{program}.py")),
                                         timeout_s=600))
    run = asyncio.run(runner.run(TASK, base_url=opened["base_url"], api_key=opened["api_key"],
                                 session_id=session_id))
    assert run.exit_code == 0, run.stderr_tail
    assert failures(gateway) == before, f"a call of {program} was refused: {run.stderr_tail}"
    calls = list(reader.get_session(session_id).calls)
    assert calls and all(call.completion_ids for call in calls)
    if program.endswith("_structured"):     # their output type became a grammar (a response format or strict tool)
        assert all(call.sampling.HasField("grammar") for call in calls), [c.sampling for c in calls]
    learner, recorded = learner_and_recorded(checkpoint, calls)
    # float32 over the frameworks' long prompts: the tolerance of the learner's own agreement test
    torch.testing.assert_close(learner, recorded, atol=2e-5, rtol=0)
    httpx.post(f"{gateway.http}/v1/sessions/{session_id}/end", json={"outcome_rewards": {"ran": 1.0}}, timeout=30,
               headers={"Authorization": f"Bearer {opened['api_key']}"}).raise_for_status()


SMOLAGENTS_RUN = """
[model]
path = "{model}"

[tasks]
train = "{examples}/blackbox/tasks/train.jsonl"
eval = "eval.jsonl"
verifier = "{examples}/blackbox/verify.py:score"
group_size = 2

[agent]
command = ["{python}", "{examples}/smolagents/agent.py"]
timeout_s = 300
concurrency = 8

[up]
minutes = 30
steps = 2
eval_samples = 1

[learner]
batch_groups = 2
"""


@pytest.mark.timeout(1800)
def test_smolagents_trains_unchanged_through_forge_up(tmp_path):
    """The example run file's agent (examples/smolagents), which forces a tool call at every step, trains a few
    steps through forge up: its sessions are recorded and consumed by the learner."""
    held_out = (REPO / "examples" / "blackbox" / "tasks" / "eval.jsonl").read_text().splitlines()[:2]
    (tmp_path / "eval.jsonl").write_text("\n".join(held_out) + "\n")
    run_file = tmp_path / "run.toml"
    model = long_context_tiny(tmp_path / "tiny-long")
    run_file.write_text(SMOLAGENTS_RUN.format(examples=REPO / "examples", python=agents_python(),
                                              model=model))
    run_dir = tmp_path / "run"
    result = subprocess.run([script("forge"), "up", "--config", str(run_file), "--run-dir", str(run_dir)],
                            capture_output=True, text=True, timeout=1700, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["learner"]["step"] >= 2 and summary["episodes"] > summary["failed_episodes"]
    with PoolReader(run_dir / "pool") as pool:
        calls = [call for entry in pool.entries(start=0, limit=10_000) for sid in entry.members
                 for call in pool.get_session(sid).calls]
    assert calls and all(call.completion_ids for call in calls)
