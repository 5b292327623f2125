"""The code example (examples/code): each task's tests fail in a sandbox seeded from its repository and pass once
its reference fix is applied there; a fix that edits the tests instead scores nothing; and a team run with
[sandbox] enabled gives each session's program a sandbox whose result the verifier scores, unless the program tried
to get out of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forge.checkpoints import TINY_DIR
from forge.pool import PoolReader
from forge.rollout.sandbox import Sandbox, SandboxConfig, tripwires, verify
from forge.v1 import pool_pb2

from conftest import REPO, script

pytestmark = pytest.mark.sandbox

EXAMPLE = REPO / "examples" / "code"
TASKS = [json.loads(line) for split in ("train", "eval") for line in
         (EXAMPLE / "tasks" / f"{split}.jsonl").read_text().splitlines()]
UID = 220_000 if os.getuid() == 0 else None


@pytest.mark.parametrize("task", TASKS, ids=[t["id"] for t in TASKS])
def test_the_tests_fail_as_given_and_pass_with_the_reference_fix(tmp_path, task):
    repo = EXAMPLE / task["workspace"]
    box = Sandbox.create(tmp_path / "box", SandboxConfig(timeout_s=120.0), UID, repo)
    before = verify.run_pytest(box.directory, restore=repo)
    assert before.failed >= 1 and before.pass_rate < 1.0, before.output
    for fixed in (repo.parent / "reference").iterdir():
        shutil.copyfile(fixed, box.workspace / fixed.name)
    after = verify.run_pytest(box.directory, restore=repo)
    assert after.failed == 0 and after.passed >= 2 and after.pass_rate == 1.0, after.output


def test_editing_the_tests_instead_of_the_code_scores_nothing(tmp_path):
    task = TASKS[0]
    repo = EXAMPLE / task["workspace"]
    box = Sandbox.create(tmp_path / "box", SandboxConfig(timeout_s=120.0), UID, repo)
    for test in box.workspace.glob("test_*.py"):
        box.run(f"echo 'def test_ok(): pass' > {test.name}")
    assert verify.tests_pass_rate(box.directory) == 1.0                   # graded as the agent left them
    assert verify.tests_pass_rate({"sandbox": str(box.directory)}, restore=repo) == 0.0    # on the task's tests
    with pytest.raises(ValueError, match="no sandbox"):
        verify.tests_pass_rate({"calls": []})


# A program that does what a coding agent would, without a model able to: asks the model once (so the session has
# a recorded call), then applies the reference fix in its sandbox through forge sandbox exec.
FIXER = '''
import json, os, pathlib, subprocess, sys
from openai import OpenAI
task = json.load(open(os.environ["FORGE_TASK_FILE"]))
OpenAI().chat.completions.create(model="forge", messages=task["messages"], max_tokens=4)
reference = pathlib.Path({example!r}) / task["workspace"] / ".." / "reference"
for fixed in reference.resolve().iterdir():
    subprocess.run(["forge", "sandbox", "exec", "--", "sh", "-c", "cat > " + fixed.name],
                   input=fixed.read_bytes(), check=True)
print("fixed")
'''
# One that tries to write outside its sandbox instead.
ESCAPER = '''
import json, os, subprocess
from openai import OpenAI
task = json.load(open(os.environ["FORGE_TASK_FILE"]))
OpenAI().chat.completions.create(model="forge", messages=task["messages"], max_tokens=4)
subprocess.run(["forge", "sandbox", "exec", "--", "sh", "-c", "touch /usr/forge-escape"])
print("done")
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not any(TINY_DIR.glob("*.safetensors")), reason="the pre-trained tiny checkpoint is not shipped")
def test_a_sandboxed_team_run_scores_what_each_program_left_in_its_sandbox(tmp_path):
    from helpers.gateway_procs import start_actor, start_gateway

    example = tmp_path / "code"
    shutil.copytree(EXAMPLE, example)
    (example / "fixer.py").write_text(FIXER.format(example=str(example)))
    (example / "escaper.py").write_text(ESCAPER)
    run_file = example / "run-fixer.toml"
    run_file.write_text("""
[tasks]
train = "tasks/train.jsonl"
verifier = "verify.py:score"
group_size = 2

[agent]
command = ["python", "fixer.py"]

[sandbox]
enabled = true
timeout_s = 120
""")
    actor = start_actor(tmp_path, "actor", "--model", "tiny")
    gateway = start_gateway(tmp_path, [actor.address], tmp_path / "pool")

    def rollout(run: Path, episodes: int) -> None:
        result = subprocess.run([script("forge"), "rollout", "--config", str(run), "--gateway",
                                 gateway.info["grpc_address"], "--http", gateway.info["http_address"],
                                 "--episodes", str(episodes)], capture_output=True, text=True, timeout=500,
                                cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]

    escapes = tripwires.unavailable() is None
    try:
        rollout(run_file, 4)
        if escapes:
            escaping = example / "run-escaper.toml"
            escaping.write_text(run_file.read_text().replace("fixer.py", "escaper.py"))
            rollout(escaping, 2)
    finally:
        gateway.stop()
        actor.stop()
    with PoolReader(tmp_path / "pool") as pool:
        sessions = [pool.get_session(s) for e in pool.entries(start=0, limit=10_000) for s in e.members]
    completed = [s for s in sessions if s.session.status == pool_pb2.SESSION_STATUS_COMPLETED]
    assert len(completed) >= 4, [s.session.failure_reason for s in sessions]
    assert all(s.session.outcome_rewards["tests"] == 1.0 and len(s.calls) == 1 for s in completed)
    # every escaper's session that ended failed for its attempt (the others were still playing at the stop)
    failed = [s.session.failure_reason for s in sessions if s.session.status != pool_pb2.SESSION_STATUS_COMPLETED]
    attempts = [reason for reason in failed if reason.startswith("sandbox escape attempt")]
    assert len(attempts) >= (2 if escapes else 0) and set(attempts) <= {"sandbox escape attempt: 1 write outside its tree"}
    assert set(failed) - set(attempts) <= {"the rollout stopped before the session ended"}, failed
    assert not Path("/usr/forge-escape").exists()
