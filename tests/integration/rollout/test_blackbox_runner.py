"""The black-box runner runs real programs (small Python scripts written here) as a training session's agent: what
they see, how their failures read, that nothing they start outlives a timeout or a cancellation, the concurrency
limit, and chatty programs. (The start-up checks of the command: unit/test_blackbox_runner.py.)"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from forge.rollout.blackbox import (
    STDOUT_LIMIT_BYTES,
    AgentCommand,
    AgentFailed,
    BlackBoxRunner,
    check_command,
)

SESSION = {"base_url": "http://127.0.0.1:8000/s/abc/v1", "api_key": "sk-session-key-123", "session_id": "abc"}
TASK = {"task_id": "t7", "domain": "qa", "messages": [{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": "What is 2 + 3?"},
                                                       {"role": "user", "content": "not this one"}]}
POLL_STEPS = 4800              # bounded waits for an event (120 s): this many steps of POLL_S
POLL_S = 0.025


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The runner's temporary directories go here, so that a test can see that none is left behind."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def write_program(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(source)
    return path


def python(script: Path, *args: str, **options) -> AgentCommand:
    return AgentCommand((sys.executable, str(script), *args), **options)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # Where PID 1 does not reap orphans (some containers), a killed grandchild stays a zombie: dead all the same.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def gone(pids: list[int]) -> bool:
    for _ in range(POLL_STEPS):
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(POLL_S)
    return False


ECHO = """\
import json, os, stat, sys
task_file = os.environ["FORGE_TASK_FILE"]
task = json.load(open(task_file))
print("stdin:", sys.stdin.read())
for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "FORGE_SESSION_ID"):
    print(name + ":", os.environ.get(name))
print("task_id:", task["task_id"])
print("task_file:", task_file)
print("folder_mode:", oct(stat.S_IMODE(os.stat(os.path.dirname(task_file)).st_mode)))
print("cwd:", os.getcwd())
print("environment:", sorted(os.environ.items()))
"""


def test_the_program_gets_its_session_and_task_and_nothing_of_forge(tmp_path, private_tmp, monkeypatch):
    monkeypatch.setenv("FORGE_GATEWAY_API_KEYS", "deployment-secret-1")
    monkeypatch.setenv("OPENAI_API_KEY", "deployment-secret-2")
    monkeypatch.setenv("OPENAI_ORG_ID", "deployment-secret-3")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "deployment-secret-4")
    monkeypatch.setenv("UNRELATED_SETTING", "kept")
    runner = BlackBoxRunner(python(write_program(tmp_path, "echo.py", ECHO), cwd=tmp_path))
    result = asyncio.run(runner.run(TASK, **SESSION))
    lines = dict(line.split(": ", 1) for line in result.reply.splitlines())
    assert lines["stdin"] == "What is 2 + 3?"
    assert lines["OPENAI_BASE_URL"] == SESSION["base_url"]
    assert lines["OPENAI_API_KEY"] == SESSION["api_key"] == lines["ANTHROPIC_API_KEY"]
    assert lines["ANTHROPIC_BASE_URL"] + "/v1" == SESSION["base_url"]
    assert lines["FORGE_SESSION_ID"] == "abc"
    assert lines["task_id"] == "t7"
    assert lines["folder_mode"] == "0o700"
    assert Path(lines["cwd"]).resolve() == tmp_path.resolve()
    assert "deployment-secret" not in result.reply
    assert "('UNRELATED_SETTING', 'kept')" in lines["environment"]
    assert result.exit_code == 0 and result.stderr_tail == "" and result.seconds > 0
    assert not Path(lines["task_file"]).exists()
    assert list(private_tmp.iterdir()) == []


def test_a_relative_program_path_runs_from_the_command_folder(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    agent = write_program(folder, "agent.py", f"#!{sys.executable}\nimport sys\nprint('answer:', sys.stdin.read())\n")
    agent.chmod(0o755)
    command = AgentCommand(("./agent.py",), cwd=folder)
    check_command(command)
    result = asyncio.run(BlackBoxRunner(command).run(TASK, **SESSION))
    assert result.reply == "answer: What is 2 + 3?"


def test_a_non_zero_exit_names_the_code_and_the_message(tmp_path, private_tmp, caplog):
    failing = write_program(tmp_path, "fail.py", """\
import os, sys
print("partial answer")
sys.stderr.write("warming up\\n" * 2000)
sys.stderr.write("using key " + os.environ["OPENAI_API_KEY"] + "\\n")
sys.stderr.write("fatal: the model is down\\n")
sys.exit(3)
""")
    runner = BlackBoxRunner(python(failing, stderr_tail_bytes=200))
    with caplog.at_level(logging.WARNING, logger="forge.rollout.blackbox"), pytest.raises(AgentFailed) as caught:
        asyncio.run(runner.run(TASK, **SESSION))
    failed = caught.value
    assert str(failed).startswith("agent exited with code 3: ")
    assert str(failed).endswith("fatal: the model is down")
    assert "\n" not in str(failed)
    assert failed.exit_code == 3 and failed.reply == "partial answer" and failed.seconds > 0
    assert failed.stderr_tail.endswith("fatal: the model is down\n") and len(failed.stderr_tail) <= 200
    records = [r for r in caplog.records if r.name == "forge.rollout.blackbox"]
    assert len(records) == 1 and "code 3" in records[0].getMessage()
    assert SESSION["api_key"] not in caplog.text and SESSION["api_key"] not in str(failed) + failed.stderr_tail
    assert list(private_tmp.iterdir()) == []


# Starts a child that would run for long, writes both pids (and its task file) where the test finds them, then waits.
HANG = """\
import os, signal, subprocess, sys
if sys.argv[2] == "ignore-sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)    # the child inherits this: only SIGKILL stops either
child = subprocess.Popen(["sleep", "1000"])
with open(sys.argv[1] + ".part", "w") as f:
    f.write(f"{os.getpid()} {child.pid} {os.environ['FORGE_TASK_FILE']}")
os.rename(sys.argv[1] + ".part", sys.argv[1])
child.wait()
"""


def read_pids(path: Path) -> tuple[list[int], Path]:
    program, child, task_file = path.read_text().split()
    return [int(program), int(child)], Path(task_file)


def test_a_timeout_kills_the_program_and_what_it_started(tmp_path, private_tmp):
    """A slow machine may not even start the program's child within a short timeout: then the timeout is
    quadrupled and the run repeated, until the child was there to be killed."""
    for timeout_s in (3, 12, 48):
        pids = tmp_path / f"pids-{timeout_s}"
        runner = BlackBoxRunner(python(write_program(tmp_path, "hang.py", HANG), str(pids), "ignore-sigterm",
                                       timeout_s=float(timeout_s)))
        with pytest.raises(AgentFailed) as caught:
            asyncio.run(runner.run(TASK, **SESSION))
        assert str(caught.value) == f"agent timed out after {timeout_s} s (killed)"
        assert caught.value.exit_code is None and caught.value.seconds >= timeout_s
        if pids.exists():
            break
    else:
        pytest.fail("the program did not get to start its child within 48 s")
    processes, task_file = read_pids(pids)
    assert gone(processes), f"still running after the timeout: {[p for p in processes if alive(p)]}"
    assert not task_file.exists() and list(private_tmp.iterdir()) == []


def test_cancelling_a_run_kills_the_program_and_what_it_started(tmp_path, private_tmp):
    pids = tmp_path / "pids"
    runner = BlackBoxRunner(python(write_program(tmp_path, "hang.py", HANG), str(pids), "default", timeout_s=300))

    async def cancel_once_started() -> None:
        run = asyncio.create_task(runner.run(TASK, **SESSION))
        for _ in range(POLL_STEPS):
            if pids.exists() or run.done():
                break
            await asyncio.sleep(POLL_S)
        assert pids.exists() and not run.done()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(cancel_once_started())
    processes, task_file = read_pids(pids)
    assert gone(processes), f"still running after the cancellation: {[p for p in processes if alive(p)]}"
    assert not task_file.exists() and list(private_tmp.iterdir()) == []


def test_what_a_finished_program_left_running_is_stopped(tmp_path):
    pids = tmp_path / "pids"
    leaving = write_program(tmp_path, "leave.py", """\
import subprocess, sys
child = subprocess.Popen(["sleep", "1000"])     # inherits standard output, so it would hold the pipe open
open(sys.argv[1], "w").write(str(child.pid))
print("answer: 5")
""")
    result = asyncio.run(BlackBoxRunner(python(leaving, str(pids), timeout_s=120)).run(TASK, **SESSION))
    assert result.reply == "answer: 5" and result.exit_code == 0
    assert gone([int(pids.read_text())])


def test_no_more_programs_run_at_once_than_the_concurrency(tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    # Each program marks itself running, notes how many were running when it started, and waits for the release.
    waiting = write_program(tmp_path, "wait.py", """\
import os, pathlib, sys, time
gate = pathlib.Path(sys.argv[1])
me = gate / f"running-{os.getpid()}"
me.touch()
seen = len(list(gate.glob("running-*")))
while not (gate / "release").exists():
    time.sleep(0.01)
(gate / f"seen-{os.getpid()}").write_text(str(seen))
me.unlink()
print("done")
""")
    runner = BlackBoxRunner(python(waiting, str(gate), concurrency=2, timeout_s=120))

    def running() -> int:
        return len(list(gate.glob("running-*")))

    async def five_runs() -> list:
        runs = [asyncio.create_task(runner.run(TASK, **SESSION)) for _ in range(5)]
        for _ in range(POLL_STEPS):
            if running() >= 2:
                break
            await asyncio.sleep(POLL_S)
        assert running() == 2
        for _ in range(40):                    # while the gate is held, no third program starts
            await asyncio.sleep(POLL_S)
            assert running() == 2
        (gate / "release").touch()
        return await asyncio.gather(*runs)

    results = asyncio.run(five_runs())
    assert [r.reply for r in results] == ["done"] * 5
    seen = [int(p.read_text()) for p in gate.glob("seen-*")]
    assert len(seen) == 5 and max(seen) <= 2
    assert running() == 0


def test_a_chatty_program_does_not_hang_and_its_reply_keeps_the_end(tmp_path):
    chatty = write_program(tmp_path, "chatty.py", """\
import sys
chunk = "x" * 65535 + "\\n"
for _ in range(80):                        # about 5 MB on each pipe, interleaved
    sys.stdout.write(chunk); sys.stdout.flush()
    sys.stderr.write(chunk); sys.stderr.flush()
sys.stderr.write("stderr ends here\\n")
print("the final answer is 42")
""")
    runner = BlackBoxRunner(python(chatty, timeout_s=120, stderr_tail_bytes=100))
    big_prompt = {"messages": [{"role": "user", "content": "never read " * 200_000}]}   # 2 MB it ignores
    result = asyncio.run(runner.run(big_prompt, **SESSION))
    assert result.reply.endswith("x\nthe final answer is 42")
    assert len(result.reply.encode()) <= STDOUT_LIMIT_BYTES
    assert result.stderr_tail.endswith("x\nstderr ends here\n") and len(result.stderr_tail) <= 100


def test_a_program_that_cannot_start_fails_the_run(tmp_path, private_tmp):
    agent = write_program(tmp_path, "agent.py", "#!/bin/sh\necho hi\n")
    agent.chmod(0o755)
    runner = BlackBoxRunner(AgentCommand(("./agent.py",), cwd=tmp_path))
    agent.unlink()
    with pytest.raises(AgentFailed, match=r"agent could not be started: .*No such file") as caught:
        asyncio.run(runner.run(TASK, **SESSION))
    assert caught.value.exit_code is None
    assert list(private_tmp.iterdir()) == []
