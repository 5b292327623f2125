"""A black-box agent's command checked before any program runs: each problem named on one line, and a working command
accepted. (The runner running programs: integration/test_blackbox_runner.py.)"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from forge.rollout.blackbox import (
    AgentCommand,
    AgentCommandError,
    BlackBoxRunner,
    check_command,
)


def command_errors(tmp_path: Path) -> list[tuple[AgentCommand, str]]:
    plain = tmp_path / "plain.py"
    plain.write_text("print('hi')\n")
    plain.chmod(stat.S_IRUSR | stat.S_IWUSR)
    (tmp_path / "folder").mkdir()
    return [
        (AgentCommand(()), "agent command is empty"),
        (AgentCommand(("",)), "agent command is empty"),
        (AgentCommand(("no-such-agent-program-here",)), "'no-such-agent-program-here' is not found on PATH"),
        (AgentCommand(("./missing.py",), cwd=tmp_path), f"does not exist (looked for {tmp_path}/missing.py)"),
        (AgentCommand(("./folder",), cwd=tmp_path), "'./folder' is a directory, not a program"),
        (AgentCommand(("./plain.py",), cwd=tmp_path), "'./plain.py' is not executable"),
        (AgentCommand((sys.executable,), cwd=tmp_path / "nowhere"), f"working directory {tmp_path}/nowhere does not"),
        (AgentCommand((sys.executable,), timeout_s=0), "timeout_s must be greater than 0 (got 0)"),
        (AgentCommand((sys.executable,), timeout_s=-1.5), "timeout_s must be greater than 0 (got -1.5)"),
        (AgentCommand((sys.executable,), concurrency=0), "concurrency must be at least 1 (got 0)"),
        (AgentCommand((sys.executable,), stderr_tail_bytes=-1), "stderr_tail_bytes must not be negative"),
    ]


def test_check_command_names_each_problem_on_one_line(tmp_path):
    for command, message in command_errors(tmp_path):
        with pytest.raises(AgentCommandError) as caught:
            check_command(command)
        assert message in str(caught.value) and "\n" not in str(caught.value), command
        assert isinstance(caught.value, ValueError)
        with pytest.raises(AgentCommandError):
            BlackBoxRunner(command)


def test_check_command_accepts_a_working_command(tmp_path):
    check_command(AgentCommand((sys.executable, "agent.py")))
    check_command(AgentCommand(("sh", "-c", "true"), cwd=tmp_path, timeout_s=0.5, concurrency=1))
    command = AgentCommand([Path(sys.executable), "x.py"], cwd=str(tmp_path))    # lists and strings are normalised
    assert command.argv == (sys.executable, "x.py") and command.cwd == tmp_path
    check_command(command)
