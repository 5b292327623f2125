"""verifiers environments played unchanged: ``forge up --config`` with ``[env] verifiers`` trains on a single-turn
environment and on one whose tools are an MCP toolset (both in vf_envs/, local data), each session scored by the
environment's own rubric with every reward function under its name, the environment's prompts and tool schemas in
the recorded calls, and the held-out reward read at both ends; a rubric that raises fails its session alone.
(Environments refused before anything starts: test_env_refusals.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from forge.checkpoints import load_tokenizer
from forge.v1 import pool_pb2

from helpers import short_runs
from helpers.short_runs import stored_sessions

ENVS = Path(__file__).parent / "vf_envs"
pytestmark = pytest.mark.xdist_group("serial")  # forge up runs: one at a time (conftest.SERIAL)


# Each episode of a toolset run starts the toolset's server (``python -m vftest_calc``: verifiers' imports, seconds of
# CPU each); a step of one group, two groups in flight, plays the two steps on half the episodes.
ONE_GROUP_STEPS = ("--groups-in-flight", "2", "--set", "learner.batch_groups=1")


def forge_up(tmp_path: Path, env: str, timeout: float = 900, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return short_runs.forge_up(tmp_path, f"[env]\n{env}\n", timeout, args=args)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_single_turn_environment_trains_with_its_rubric(tmp_path):
    result = forge_up(tmp_path, f'verifiers = "{ENVS / "envs.py"}:single_turn"\nargs = {{ explode_first = true }}\n'
                                'eval_fraction = 0.34\ngroup_size = 2')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["domains"] == ["vftest_qa"], "the environment's name is its domain"
    assert set(summary["eval_start"]) == set(summary["eval_end"]) == {"vftest_qa"}
    assert summary["learner"]["step"] >= 2, "the learner trained on the environment's sessions"
    assert "held-out reward per domain" in result.stdout and "vftest_qa" in result.stdout
    assert "environment: vftest_qa (verifiers, harness null" in result.stdout, "what is played is said at start"

    played = stored_sessions(tmp_path / "run" / "pool")
    scored = [s for s in played if s.session.status == pool_pb2.SESSION_STATUS_COMPLETED]
    assert scored and all(set(s.session.outcome_rewards) == {"exact", "short"} for s in scored)
    assert all(s.session.outcome_rewards["short"] in (0.0, 0.5) for s in scored), "each weighted by its weight"
    assert all("reply_chars" in s.session.metrics for s in scored), "the environment's metrics are kept"
    everywhere = [s.session for s in (*played, *stored_sessions(tmp_path / "run" / "eval-pool"))]
    failed = [s for s in everywhere if s.status == pool_pb2.SESSION_STATUS_FAILED
              and "the rollout stopped" not in s.failure_reason]        # in flight when the run ended
    assert {s.task_id for s in failed} == {"qa-0"}, "a broken rubric fails its own sessions, and only those"
    assert all("ZeroDivisionError: the rubric broke on purpose" in s.failure_reason for s in failed), [s.failure_reason for s in failed]
    tokenizer = load_tokenizer("tiny")
    prompt = tokenizer.decode(list(scored[0].calls[0].prompt_ids))
    assert "Answer with the answer alone." in prompt, "the environment's own system prompt was sent"


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("loader", "name"), [("with_tools", "vftest_tool"), ("with_shared_tools", "vftest_shared")],
                         ids=["toolset-per-episode", "toolset-of-the-taskset"])
def test_an_environment_with_an_mcp_toolset_trains(tmp_path, loader, name):
    result = forge_up(tmp_path, f'verifiers = "{ENVS / "envs.py"}:{loader}"\neval_fraction = 0.25\ngroup_size = 2',
                      args=ONE_GROUP_STEPS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["domains"] == [name] and set(summary["eval_end"]) == {name}
    assert summary["learner"]["step"] >= 2
    played = stored_sessions(tmp_path / "run" / "pool")
    scored = [s for s in played if s.session.status == pool_pb2.SESSION_STATUS_COMPLETED]
    assert scored and all(set(s.session.outcome_rewards) == {"correct", "used_tool"} for s in scored)
    prompt = load_tokenizer("tiny").decode(list(scored[0].calls[0].prompt_ids))
    assert '"name": "calc_add"' in prompt, "the toolset's tools reached the model as its tool schemas"
    assert "Use the calculator to add" in prompt
