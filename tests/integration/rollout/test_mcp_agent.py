"""The built-in tool agent over MCP: ``forge up --config`` with ``[agent.mcp] servers`` plays the team's tasks with
a stdio MCP server's tools (one server process per session, or one for the run with ``shared``): the tools reach the
model as its tool schemas, their results come back as tool messages, the verifier scores the answer and the learner
trains; a session's server that crashes fails that session and no other (a shared one, the sessions using it, and it
is started afresh). Bad servers are refused before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from forge.checkpoints import load_tokenizer
from forge.v1 import pool_pb2

from helpers import short_runs
from helpers.short_runs import stored_sessions

SERVER = Path(__file__).parent / "mcp_servers" / "colors.py"
pytestmark = pytest.mark.xdist_group("serial")  # forge up runs: one at a time (conftest.SERIAL)

TASKS = [("t-cup-pen", ["cup", "pen"]), ("t-box-hat", ["box", "hat"]), ("t-bag-lamp", ["bag", "lamp"]),
         ("t-bell", ["bell", "book"])]
VERIFIER = '''
from colors import COLORS

def score(task, reply, session):
    wanted = [COLORS.get(key, "") for key in task["keys"]]
    return sum(color in reply for color in wanted) / len(wanted)
'''


def forge_up(tmp_path: Path, agent: str, timeout: float = 900) -> subprocess.CompletedProcess:
    lines = [json.dumps({"id": i, "domain": "colors", "keys": keys,
                         "messages": [{"role": "user", "content": f"Find the colors of {' and '.join(keys)}."}]})
             for i, keys in TASKS]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "verify.py").write_text(f"import sys\nsys.path.insert(0, {str(SERVER.parent)!r})\n" + VERIFIER)
    return short_runs.forge_up(tmp_path, f'[tasks]\ntrain = "tasks.jsonl"\nverifier = "verify.py:score"\ngroup_size = 2\n'
                                         f'\n[agent.mcp]\n{agent}\n', timeout)


def server_line(tmp_path: Path, log: str, shared: bool = False) -> str:
    return (f'servers = ["{sys.executable} {SERVER} --log {tmp_path / log}"]\nmax_turns = 4'
            + ("\nshared = true" if shared else ""))


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("shared", [False, True], ids=["per-session", "shared"])
def test_the_tool_agent_trains_with_an_mcp_servers_tools(tmp_path, shared):
    result = forge_up(tmp_path, server_line(tmp_path, "calls.log", shared))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["learner"]["step"] >= 2 and summary["domains"] == ["colors"]
    sessions = stored_sessions(tmp_path / "run" / "pool")
    scored = [s for s in sessions if s.session.status == pool_pb2.SESSION_STATUS_COMPLETED]
    assert scored and all(set(s.session.outcome_rewards) == {"score"} for s in scored)
    tokenizer = load_tokenizer("tiny")
    assert '"name": "lookup"' in tokenizer.decode(list(scored[0].calls[0].prompt_ids)), "the server's tool offered"
    followed = [tokenizer.decode(list(c.prompt_ids)) for s in scored for c in s.calls[1:]]
    assert any("(from the MCP server)" in text for text in followed), "a tool result went back to the model"
    calls = [line.split() for line in (tmp_path / "calls.log").read_text().splitlines()]
    pids, crashes = {pid for pid, _ in calls}, sum(key == "bell" for _, key in calls)
    if shared:
        assert len(pids) <= 1 + crashes, "one server for the run, started afresh after each crash"
    else:
        assert len(pids) > 1, "each session had a server process of its own"
    crashed = [s.session for s in sessions if s.session.status == pool_pb2.SESSION_STATUS_FAILED
               and "the rollout stopped" not in s.session.failure_reason]
    assert all("MCP server" in s.failure_reason and " failed: " in s.failure_reason for s in crashed), \
        [(s.task_id, s.failure_reason) for s in crashed]        # the server named (a lost stream words it its way)
    if crashes:
        assert any(s.task_id == "t-bell" for s in crashed), "the crash failed the session that caused it"
    if not shared:      # a shared server's crash also fails the sessions using it then; a session's own, only its
        assert all(s.task_id == "t-bell" for s in crashed), [s.task_id for s in crashed]


@pytest.mark.parametrize(("agent", "message"), [
    ('servers = ["no-such-mcp-server --stdio"]', "the program 'no-such-mcp-server' is not found"),
    ('servers = ["python \'unclosed"]', "cannot split it as a command line"),
])
def test_a_server_that_cannot_start_is_refused_before_anything_starts(tmp_path, agent, message):
    result = forge_up(tmp_path, agent, timeout=300)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert message in result.stderr, result.stderr
    assert not (tmp_path / "run").exists(), "nothing was started"
