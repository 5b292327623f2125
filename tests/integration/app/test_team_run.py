"""A team's own run: ``forge up --config`` on the black-box example trains its tasks with its unmodified agent
program and its verifier; sessions that fail at run time (a crashing or hanging program, a verifier that raises or
returns no number) fail with their reason and nothing else stops; bad input is refused at start-up, before any
service starts."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from forge.checkpoints import TINY_DIR
from forge.pool import PoolReader
from forge.v1 import pool_pb2

from conftest import REPO, script

EXAMPLE = REPO / "examples" / "blackbox"
pytestmark = pytest.mark.xdist_group("serial")  # forge up runs: one at a time (conftest.SERIAL)

# The agent and verifier wrappers fail the first training sessions in each of the four ways, in turn: a numbered
# marker file per session makes "the n-th one" exact whatever the timing. Held-out tasks ("eval-..." ids) pass.
AGENT_WRAPPER = '''
import os, runpy, sys, json
task = json.load(open(os.environ["FORGE_TASK_FILE"]))
if task["id"].startswith("colors-"):
    n = 0
    while True:                      # claim the lowest free number: exactly one session gets each
        try:
            os.close(os.open(os.path.join({marks!r}, str(n)), os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            n += 1
    if n == 0:
        print("the agent broke on purpose", file=sys.stderr)
        sys.exit(3)
    if n == 1:
        import time
        while True:
            time.sleep(1)
sys.argv = [{agent!r}]
runpy.run_path({agent!r}, run_name="__main__")
'''
VERIFIER_WRAPPER = '''
import itertools, sys
sys.path.insert(0, {example!r})
from verify import score as real_score
counter = itertools.count()

def score(task, reply, session):
    if task["id"].startswith("colors-"):
        n = next(counter)
        if n == 0:
            raise ZeroDivisionError("the verifier broke on purpose")
        if n == 1:
            return "yes"
    calls = session.get("calls", [])
    if calls and all(isinstance(c.get("completion"), str) and c["completion"] for c in calls):
        open({seen!r}, "w").close()         # the session came with its calls' text
    return real_score(task, reply, session)
'''


def team_run_file(tmp_path: Path, **tables: str) -> Path:
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "agent.py").write_text(AGENT_WRAPPER.format(marks=str(marks), agent=str(EXAMPLE / "agent.py")))
    (tmp_path / "verify.py").write_text(VERIFIER_WRAPPER.format(example=str(EXAMPLE), seen=str(tmp_path / "seen")))
    held_out = (EXAMPLE / "tasks" / "eval.jsonl").read_text().splitlines()[:8]
    (tmp_path / "eval.jsonl").write_text("\n".join(held_out) + "\n")
    text = f'''
[model]
path = "tiny"

[tasks]
train = "{EXAMPLE / 'tasks' / 'train.jsonl'}"
eval = "eval.jsonl"
verifier = "verify.py:score"
group_size = 2

[agent]
command = ["{sys.executable}", "agent.py"]
timeout_s = 30
concurrency = 8

[up]
minutes = 30
steps = 3
eval_samples = 1
batch_groups = 2
groups_in_flight = 4

[learner]
mode = "fifo"      # strict FIFO: no step passes the first groups, so every planted failure is in before the end
'''
    for name, body in tables.items():
        text += f"\n[{name}]\n{body}\n"
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not any(TINY_DIR.glob("*.safetensors")), reason="the pre-trained tiny checkpoint is not shipped")
def test_forge_up_trains_a_black_box_agent_on_the_teams_tasks(tmp_path):
    run_file = team_run_file(tmp_path)
    run_dir = tmp_path / "run"
    result = subprocess.run([script("forge"), "up", "--config", str(run_file), "--run-dir", str(run_dir)],
                            capture_output=True, text=True, timeout=1100, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["domains"] == ["colors"]
    assert set(summary["eval_start"]) == set(summary["eval_end"]) == {"colors"}
    assert summary["eval_failed_sessions"] == 0 and summary["eval_greedy_start"] == {}
    assert summary["learner"]["step"] >= 3, "the learner consumed the team's sessions"
    reasons = " | ".join(summary["failures"])
    for reason in ("agent exited with code 3: the agent broke on purpose", "agent timed out after 30 s",
                   "verifier raised ZeroDivisionError: the verifier broke on purpose", "verifier returned 'yes'"):
        assert reason in reasons, reasons
    assert summary["failed_episodes"] >= 4 and summary["episodes"] > summary["failed_episodes"]
    assert "held-out reward per domain" in result.stdout and "colors" in result.stdout
    assert (tmp_path / "seen").exists(), "the verifier got the recorded calls with their text"

    with PoolReader(run_dir / "pool") as pool:
        sessions = [pool.get_session(s).session for e in pool.entries(start=0, limit=100_000) for s in e.members]
    scored = [s for s in sessions if s.status == pool_pb2.SESSION_STATUS_COMPLETED]
    assert scored and all(set(s.outcome_rewards) == {"correct"} and s.domain == "colors" for s in scored)
    assert all(s.task_id.startswith("colors-") for s in sessions), "held-out sessions stay out of the training pool"
    failed = {s.failure_reason for s in sessions if s.status == pool_pb2.SESSION_STATUS_FAILED}
    assert any("exited with code 3" in r for r in failed) and any("verifier returned" in r for r in failed)
    with PoolReader(run_dir / "eval-pool") as pool:
        evaluated = [pool.get_session(s).session for e in pool.entries(start=0, limit=10_000) for s in e.members]
    assert len(evaluated) == 16 and all(not s.task_id.startswith("colors-") for s in evaluated)   # 8 tasks, twice


def bad_input(tmp_path: Path, **tables: str) -> subprocess.CompletedProcess:
    run_file = team_run_file(tmp_path)
    text = run_file.read_text()
    for name, body in tables.items():
        start = text.index(f"[{name}]")
        end = text.find("\n[", start + 1)
        text = text[:start] + f"[{name}]\n{body}\n" + (text[end:] if end != -1 else "")
    run_file.write_text(text)
    return subprocess.run([script("forge"), "up", "--config", str(run_file), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


TASKS = f'train = "{EXAMPLE / "tasks" / "train.jsonl"}"\nverifier = "verify.py:score"\neval = "eval.jsonl"'


@pytest.mark.parametrize(("tables", "message"), [
    ({"tasks": 'train = "bad.jsonl"\nverifier = "verify.py:score"'}, "bad.jsonl:2: "),
    ({"tasks": f'train = "{EXAMPLE / "tasks" / "train.jsonl"}"\nverifier = "nowhere.py:score"'},
     "verifier 'nowhere.py:score': file"),
    ({"tasks": f'train = "{EXAMPLE / "tasks" / "train.jsonl"}"\nverifier = "verify.py:nothing"'},
     "has no attribute 'nothing'"),
    ({"tasks": f'train = "{EXAMPLE / "tasks" / "train.jsonl"}"\nverifier = "verify.py:score"\n'
               'eval = "missing.jsonl"'}, "missing.jsonl"),
    ({"agent": 'command = ["no-such-agent-program"]'}, "agent program 'no-such-agent-program' is not found"),
    ({"tasks": f'train = "{EXAMPLE / "tasks" / "train.jsonl"}"'}, "the team's tasks need a verifier"),
    ({"agent": "timeout_s = 30"}, "the team's tasks need an agent"),
])
def test_bad_team_input_is_refused_before_anything_starts(tmp_path, tables, message):
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n'
                                        '{"id": "b", "messages": []}\n')
    result = bad_input(tmp_path, **tables)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert not (tmp_path / "run").exists(), "nothing was started"


WHITEBOX_WRAPPER = '''
import os, sys
sys.path.insert(0, {example!r})
import agent
from agent import ColorAgent

agent.KEEP_TOOL_RESULTS = 0          # rewrite after every tool round: every session that looks a color up rewrites

class FlakyColorAgent(ColorAgent):
    async def run(self, task, llm):
        if task["id"].startswith("colors-"):
            try:
                os.close(os.open(os.path.join({marks!r}, "raised"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return await super().run(task, llm)
            raise RuntimeError("the agent class broke on purpose")
        return await super().run(task, llm)
'''


WHITEBOX_VERIFIER = '''
import sys
sys.path.insert(0, {example!r})
from verify import score as real_score

def score(task, reply, session):
    calls = session.get("calls", [])
    if calls and all(isinstance(c.get("completion"), str) and c["completion"] for c in calls):
        open({seen!r}, "w").close()         # the session came with its calls' text
    return real_score(task, reply, session)
'''


def rewritten(calls) -> bool:
    """Whether some call's prompt does not extend the previous call's prompt and completion: a context rewrite, as
    the pool recorded it in token ids."""
    return any(list(b.prompt_ids[:len(a.prompt_ids) + len(a.completion_ids)]) != [*a.prompt_ids, *a.completion_ids]
               for a, b in itertools.pairwise(calls))


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not any(TINY_DIR.glob("*.safetensors")), reason="the pre-trained tiny checkpoint is not shipped")
def test_forge_up_trains_a_white_box_agent_that_rewrites_its_context(tmp_path):
    run_file = team_run_file(tmp_path)
    (tmp_path / "whitebox.py").write_text(WHITEBOX_WRAPPER.format(example=str(REPO / "examples" / "whitebox"),
                                                                  marks=str(tmp_path / "marks")))
    text = run_file.read_text()
    start, end = text.index("[agent]"), text.index("[up]")
    run_file.write_text(text[:start] + '[agent]\npython = "whitebox.py:FlakyColorAgent"\n\n' + text[end:])
    (tmp_path / "verify.py").write_text(WHITEBOX_VERIFIER.format(example=str(EXAMPLE), seen=str(tmp_path / "seen")))
    run_dir = tmp_path / "run"
    result = subprocess.run([script("forge"), "up", "--config", str(run_file), "--run-dir", str(run_dir)],
                            capture_output=True, text=True, timeout=1100, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["domains"] == ["colors"] and set(summary["eval_end"]) == {"colors"}
    assert summary["learner"]["step"] >= 3 and summary["blackbox_episodes"] == 0
    assert summary["failures"] == ["agent raised RuntimeError: the agent class broke on purpose"]
    with PoolReader(run_dir / "pool") as pool:
        stored = [pool.get_session(s) for e in pool.entries(start=0, limit=100_000) for s in e.members]
    completed = [s for s in stored if s.session.status == pool_pb2.SESSION_STATUS_COMPLETED]
    rewrote = [s for s in completed if s.session.metrics.get("context_rewrites", 0) >= 1]
    assert rewrote, "the agent rewrote its context in some sessions"
    assert any(rewritten(list(s.calls)) for s in rewrote), "a rewrite shows in the recorded token ids"
    assert all(set(s.session.outcome_rewards) == {"correct"} for s in completed)
    assert (tmp_path / "seen").exists(), "the verifier got a white-box session's record from the keyed gateway"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not any(TINY_DIR.glob("*.safetensors")), reason="the pre-trained tiny checkpoint is not shipped")
def test_forge_rollout_plays_the_teams_tasks_against_a_running_gateway(tmp_path):
    from helpers.short_runs import forge_rollout

    result = forge_rollout(tmp_path, team_run_file(tmp_path), episodes=8, evaluate=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sessions (" in result.stdout and "colors" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"] >= 8 and summary["starts"] == 1
    assert set(summary["eval_start"]) == set(summary["eval_end"]) == {"colors"}
    with PoolReader(tmp_path / "eval-pool") as pool:        # the held-out sessions, twice, apart from training's
        held_out = [pool.get_session(s).session for e in pool.entries(start=0, limit=10_000) for s in e.members]
    assert held_out and all(s.task_id.startswith("eval-") for s in held_out)
    with PoolReader(tmp_path / "pool") as pool:
        sessions = [pool.get_session(s).session for e in pool.entries(start=0, limit=10_000) for s in e.members]
    closed = [s for s in sessions if s.status != pool_pb2.SESSION_STATUS_OPEN]
    assert closed == sessions, "every session the rollout started is closed when it stops:\n" + result.stderr[-4000:]
    assert len(closed) >= 8 and all(s.task_id.startswith("colors-") for s in sessions)
    assert any(s.status == pool_pb2.SESSION_STATUS_COMPLETED and "correct" in s.outcome_rewards for s in closed)
    assert any("exited with code 3" in s.failure_reason for s in closed)


def test_forge_rollout_needs_a_gateway_and_the_teams_tasks(tmp_path):
    run_file = team_run_file(tmp_path)
    result = subprocess.run([script("forge"), "rollout", "--config", str(run_file)], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert result.returncode == 2 and "give --gateway HOST:PORT" in result.stderr
    result = subprocess.run([script("forge"), "rollout", "--gateway", "127.0.0.1:1"], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2 and "forge rollout plays the team's tasks" in result.stderr
