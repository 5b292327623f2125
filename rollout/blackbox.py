"""Runs a user's unmodified agent program once per training session (a black-box agent).

The program is any executable that reads the OpenAI or the Anthropic client's variables: it gets
``OPENAI_BASE_URL`` (the session's base URL) and ``OPENAI_API_KEY`` (the session's key), ``ANTHROPIC_BASE_URL`` (the
session's root, where the Messages API is) and ``ANTHROPIC_API_KEY`` (the same key), plus ``FORGE_SESSION_ID`` and
``FORGE_TASK_FILE`` (a JSON file with the task), ``FORGE_SANDBOX`` (its session's sandbox, when the run gives
sessions one: ``forge sandbox exec -- COMMAND`` runs a command there), and the task's first user message on
standard input. Its standard
output is its reply; it must exit 0. Every variable of the parent that starts with ``FORGE_``, ``OPENAI_`` or
``ANTHROPIC_`` is withheld, since those may hold the deployment's secrets. The program runs in a process group of its own, so that on a timeout, a cancellation or its
exit nothing it started is left running. POSIX only (process groups). See docs/agents.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge import variables

log = logging.getLogger(__name__)

STDOUT_LIMIT_BYTES = 1 << 20   # of a longer standard output only the end is kept
KILL_GRACE_S = 2.0             # between SIGTERM and SIGKILL of the program's process group
DRAIN_S = 5.0                  # how long to wait for the pipes to close once the group is killed
WITHHELD_PREFIXES = ("FORGE_", "OPENAI_", "ANTHROPIC_")


def agent_path() -> str:
    """The PATH agent programs run with: Forge's own interpreter's folder first, so that ``python`` in a command
    is the Python Forge runs in (with its packages, the openai client among them), then the inherited PATH."""
    inherited = variables.read("PATH")
    return os.pathsep.join([str(Path(sys.executable).parent), inherited])


class AgentCommandError(ValueError):
    """The agent command cannot work (found at start-up, before any program runs)."""


class AgentFailed(Exception):
    """One run of the agent program failed: it exited non-zero, timed out, or could not be started."""

    def __init__(self, reason: str, *, stderr_tail: str = "", seconds: float = 0.0, exit_code: int | None = None,
                 reply: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.stderr_tail = stderr_tail
        self.seconds = seconds
        self.exit_code = exit_code          # None when the program timed out or never started
        self.reply = reply                  # what it had printed on standard output


@dataclass(frozen=True)
class AgentCommand:
    argv: tuple[str, ...]
    timeout_s: float = 600.0
    concurrency: int = 16                   # programs running at once
    cwd: Path | None = None                 # the run file's folder, so that relative script paths work
    stderr_tail_bytes: int = 2000

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(os.fspath(arg) for arg in self.argv))
        if self.cwd is not None:
            object.__setattr__(self, "cwd", Path(self.cwd))


@dataclass
class AgentRun:
    reply: str
    stderr_tail: str
    seconds: float
    exit_code: int


def check_command(command: AgentCommand) -> None:
    """Raise AgentCommandError (one line) if ``command`` cannot run; does not run it."""
    if not command.timeout_s > 0:
        raise AgentCommandError(f"agent timeout_s must be greater than 0 (got {command.timeout_s})")
    if command.concurrency < 1:
        raise AgentCommandError(f"agent concurrency must be at least 1 (got {command.concurrency})")
    if command.stderr_tail_bytes < 0:
        raise AgentCommandError(f"agent stderr_tail_bytes must not be negative (got {command.stderr_tail_bytes})")
    if command.cwd is not None and not command.cwd.is_dir():
        raise AgentCommandError(f"agent working directory {command.cwd} does not exist")
    if not command.argv or not command.argv[0]:
        raise AgentCommandError("agent command is empty: give the program to run and its arguments")
    program = command.argv[0]
    if "/" not in program:
        if shutil.which(program, path=agent_path()) is None:
            raise AgentCommandError(f"agent program {program!r} is not found on PATH")
        return
    path = (command.cwd or Path.cwd()) / program
    if path.is_dir():
        raise AgentCommandError(f"agent program {program!r} is a directory, not a program ({path})")
    if not path.is_file():
        raise AgentCommandError(f"agent program {program!r} does not exist (looked for {path})")
    if not os.access(path, os.X_OK):
        raise AgentCommandError(f"agent program {program!r} is not executable "
                                f"(chmod +x {path}, or run it with its interpreter, e.g. python {program})")


class BlackBoxRunner:
    """Runs ``command`` once per session, at most ``command.concurrency`` programs at a time."""

    def __init__(self, command: AgentCommand) -> None:
        check_command(command)
        self.command = command
        self._slots = asyncio.Semaphore(command.concurrency)

    async def run(self, task: dict[str, Any], *, base_url: str, api_key: str, session_id: str,
                  sandbox: Path | None = None) -> AgentRun:
        """Run the program for one session; raise AgentFailed if it fails. The task dict is handed to the program
        as it is (leave out what it must not see, such as the verified answer)."""
        async with self._slots:
            try:
                return await self._run(task, base_url=base_url, api_key=api_key, session_id=session_id,
                                       sandbox=sandbox)
            except AgentFailed as failed:
                log.warning("black-box agent failed in session %s: %s", session_id, failed.reason)
                raise

    async def _run(self, task: dict[str, Any], *, base_url: str, api_key: str, session_id: str,
                   sandbox: Path | None) -> AgentRun:
        command = self.command
        folder = tempfile.mkdtemp(prefix="forge-agent-")      # mode 0700
        try:
            task_file = Path(folder) / "task.json"
            task_file.write_text(json.dumps(task, ensure_ascii=False), encoding="utf-8")
            env = {name: value for name, value in os.environ.items() if not name.startswith(WITHHELD_PREFIXES)}
            env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key, ANTHROPIC_BASE_URL=base_url.removesuffix("/v1"),
                       ANTHROPIC_API_KEY=api_key, FORGE_SESSION_ID=session_id, FORGE_TASK_FILE=str(task_file),
                       PATH=agent_path(), **({"FORGE_SANDBOX": str(sandbox)} if sandbox is not None else {}))
            loop = asyncio.get_running_loop()
            output = _Output(STDOUT_LIMIT_BYTES, command.stderr_tail_bytes)
            started = time.monotonic()
            try:
                transport, _ = await loop.subprocess_exec(
                    lambda: output, *command.argv, cwd=command.cwd, env=env, start_new_session=True,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            except OSError as exc:
                raise AgentFailed(f"agent could not be started: {exc}", seconds=time.monotonic() - started) from exc
            try:
                stdin = transport.get_pipe_transport(0)
                stdin.write(first_user_message(task).encode("utf-8"))
                stdin.close()          # flushes first; a program that never reads its input does not block us
                done, _ = await asyncio.wait([output.exited], timeout=command.timeout_s)
                seconds = time.monotonic() - started
            finally:                   # also on cancellation
                try:
                    await _end_group(transport.get_pid(), output)
                finally:
                    transport.close()
            reply = output.stdout_text()
            stderr_tail = output.stderr_text().replace(api_key, "***") if api_key else output.stderr_text()
            if not done:
                raise AgentFailed(f"agent timed out after {command.timeout_s:g} s (killed)", stderr_tail=stderr_tail,
                                  seconds=seconds, reply=reply)
            code = transport.get_returncode()
            assert code is not None
            if code != 0:
                raise AgentFailed(f"{_exit_description(code)}: {_last_lines(stderr_tail)}", stderr_tail=stderr_tail,
                                  seconds=seconds, exit_code=code, reply=reply)
            return AgentRun(reply=reply, stderr_tail=stderr_tail, seconds=seconds, exit_code=code)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def first_user_message(task: dict[str, Any]) -> str:
    """The text of the task's first user message ('' if it has none); text parts of a list content are joined."""
    for message in task.get("messages") or ():
        if message.get("role") == "user":
            content = message.get("content") or ""
            if isinstance(content, str):
                return content
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


class _Output(asyncio.SubprocessProtocol):
    """Keeps the end of the program's standard output and error as they arrive (both pipes are always read, so a
    chatty program never blocks on a full pipe) and says when the program has exited and its pipes have closed."""

    def __init__(self, stdout_limit: int, stderr_limit: int) -> None:
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self._kept = {1: bytearray(), 2: bytearray()}
        self._limits = {1: stdout_limit, 2: stderr_limit}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = self._kept[fd]
        kept += data
        if len(kept) > self._limits[fd]:
            del kept[:len(kept) - self._limits[fd]]

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def stdout_text(self) -> str:
        return _decode_tail(self._kept[1]).strip()

    def stderr_text(self) -> str:
        return _decode_tail(self._kept[2])


async def _end_group(pgid: int, output: _Output) -> None:
    """Stop whatever is left of the program's process group: SIGTERM, up to KILL_GRACE_S for the program to exit and
    its pipes to close, then SIGKILL; then wait (bounded) until the pipes close, which they do once every process
    holding them is dead. Processes that are already gone make this a no-op."""
    if _signal_group(pgid, signal.SIGTERM):
        try:
            await asyncio.wait([output.closed], timeout=KILL_GRACE_S)
        finally:
            _signal_group(pgid, signal.SIGKILL)
    # output.closed comes after the program has exited and all its pipes have closed
    await asyncio.wait([output.closed], timeout=DRAIN_S)


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to the process group; False if the group no longer exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:         # the pgid was reused by a process that is not ours
        return False
    return True


def _decode_tail(data: bytes | bytearray) -> str:
    """UTF-8 text of a buffer that may begin in the middle of a character (those leading bytes are dropped)."""
    start = 0
    while start < min(len(data), 3) and 0x80 <= data[start] < 0xC0:
        start += 1
    return bytes(data[start:]).decode("utf-8", errors="replace")


def _exit_description(code: int) -> str:
    if code < 0:
        try:
            return f"agent exited with code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"agent exited with code {code}"


def _last_lines(text: str, count: int = 3, limit: int = 500) -> str:
    """The last ``count`` non-empty lines of ``text`` on one line (at most ``limit`` characters)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()][-count:]
    if not lines:
        return "(nothing on stderr)"
    joined = " | ".join(lines)
    return joined if len(joined) <= limit else "…" + joined[-limit:]
