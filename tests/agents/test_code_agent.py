"""The code example's agent, mini-swe-agent unchanged, as a sandboxed session's black box: ``forge rollout`` runs
examples/code/run_mini.py, mini's commands go through ``forge sandbox exec`` into the session's sandbox, and the
verifier scores the tests there. A scripted actor stands in for a model able to fix the bug: every answer is one
bash tool call that submits and applies the fix, so the reward says whether the fix landed in the sandbox that
the verifier tests (and nowhere else)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forge.pool import PoolReader
from forge.tokenizer import Tokenizer
from forge.v1 import pool_pb2

from conftest import REPO, script
from helpers.gateway_fake_actor import sampled_ids, serve_fake_actor
from helpers.gateway_procs import start_gateway

pytestmark = [pytest.mark.agents, pytest.mark.sandbox]

FIX = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; sed -i 's/a - b/a + b/' calc.py; echo fixed calc.add"
ANSWER = '<tool_call>\n' + json.dumps({"name": "bash", "arguments": {"command": FIX}}) + '\n</tool_call>'


def test_mini_swe_agent_fixes_the_bug_in_its_sandbox_and_the_tests_there_pass(tmp_path):
    from forge.checkpoints import TINY_DIR

    mini = Path(os.environ["FORGE_AGENTS_PYTHON"]).absolute().parent / "mini"
    example = tmp_path / "code"
    shutil.copytree(REPO / "examples" / "code", example)
    (example / "tasks" / "one.jsonl").write_text((example / "tasks" / "train.jsonl").read_text().splitlines()[0])
    run_file = example / "run-scripted.toml"
    run_file.write_text('[tasks]\ntrain = "tasks/one.jsonl"\nverifier = "verify.py:score"\ngroup_size = 2\n\n'
                        '[agent]\ncommand = ["python", "run_mini.py"]\ntimeout_s = 600\n\n'
                        '[sandbox]\nenabled = true\ntimeout_s = 120\n')
    server, servicer = serve_fake_actor("script", sampled_ids(Tokenizer.from_dir(TINY_DIR), ANSWER))
    long_context = subprocess.run([script("python"), str(REPO / "examples" / "smolagents" / "long_context.py"),
                                   str(tmp_path / "tiny-16k")], check=True, capture_output=True, text=True,
                                  timeout=120).stdout.strip()      # mini's prompt is longer than tiny's context
    gateway = start_gateway(tmp_path, [server.address], tmp_path / "pool", "--model", long_context)
    try:
        result = subprocess.run([script("forge"), "rollout", "--config", str(run_file), "--gateway",
                                 gateway.info["grpc_address"], "--http", gateway.info["http_address"],
                                 "--episodes", "2"], capture_output=True, text=True, timeout=900,
                                env={**os.environ, "MSWEA_MINI": str(mini)})
    finally:
        gateway.stop()
        server.stop(0)
    assert result.returncode == 0, result.stderr[-4000:]
    with PoolReader(tmp_path / "pool") as pool:
        sessions = [pool.get_session(s) for e in pool.entries(start=0, limit=1000) for s in e.members]
    done = [s for s in sessions if s.session.status == pool_pb2.SESSION_STATUS_COMPLETED]
    assert len(done) >= 2, [s.session.failure_reason for s in sessions]
    for record in done:
        assert record.session.outcome_rewards["tests"] == 1.0, record.session
        assert len(record.calls) == 1 and servicer.calls >= 2
    assert (example / "tasks" / "bug-add" / "repo" / "calc.py").read_text().count("a - b") == 1   # host untouched
