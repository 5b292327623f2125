"""Forge's built-in tool agent over MCP: ``[agent.mcp] servers`` names MCP tool servers (a command line spoken to
over stdio, or a streamable-HTTP URL) and this agent plays each task with their tools: the task's messages and the
servers' tools go to the model, every tool call it makes runs on the server that offers the tool and its result goes
back as the tool message, until a reply calls no tool or ``max_turns`` calls were made; that reply is the answer the
verifier scores.

Servers are connected per session (each session its own stdio process: state never leaks between sessions) or,
with ``shared``, once for the run. A server that fails (it crashes, or a call outlasts ``tool_timeout_s``) fails the
session that was using it, with the reason; a shared one is connected afresh for the next session. A stdio server
runs in the run file's folder with MCP's minimal environment (no secrets of Forge's), Forge's Python first on PATH.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from forge import variables
from forge.agents import LLM, Agent, AgentResult
from forge.loading import first_line
from forge.rollout.config import McpConfig
from forge.rollout.held import Held

WHAT = "MCP server"


def is_url(server: str) -> bool:
    return server.startswith(("http://", "https://"))


def search_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), variables.read("PATH") or os.defpath])


def check_servers(config: McpConfig, base_dir: Path) -> None:
    """ValueError unless every server can be started: the mcp package is there, each command line splits and its
    program is found."""
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"[agent.mcp] needs the mcp package: pip install 'forge-rl[envs]' ({exc})") from None
    for server in config.servers:
        if is_url(server):
            continue
        try:
            words = shlex.split(server)
        except ValueError as exc:
            raise ValueError(f"{WHAT} {server!r}: cannot split it as a command line: {exc}") from None
        if not words:
            raise ValueError(f"{WHAT} {server!r}: the command line is empty")
        if shutil.which(words[0], path=search_path()) is None and not (base_dir / words[0]).is_file():
            raise ValueError(f"{WHAT} {server!r}: the program {words[0]!r} is not found")


class Connection:
    """One server's MCP client, held open by a task of its own (``Held``): a shared one outlives the sessions that
    use it."""

    def __init__(self, server: str, base_dir: Path, timeout_s: float) -> None:
        self.server = server
        self.base_dir = base_dir
        self.timeout_s = timeout_s
        self.client: Any = None
        self.broken = False
        self._held: Held | None = None

    def _transport(self) -> Any:
        from mcp import StdioServerParameters, stdio_client

        if is_url(self.server):
            return self.server
        words = shlex.split(self.server)
        program = shutil.which(words[0], path=search_path()) or str(self.base_dir / words[0])
        return stdio_client(StdioServerParameters(command=program, args=words[1:], cwd=self.base_dir,
                                                  env={"PATH": search_path()}))

    async def open(self) -> Connection:
        from mcp import Client

        self._held = Held(lambda: Client(self._transport(), read_timeout_seconds=self.timeout_s))
        try:
            self.client = await self._held.open()
        except Exception as exc:
            raise RuntimeError(f"{WHAT} {self.server!r} did not start: {first_line(exc)}") from exc
        return self

    async def close(self) -> None:
        if self._held is not None:
            await self._held.close()


class SharedConnections:
    """The run's connections with ``shared``: opened on first use, opened afresh after one broke."""

    def __init__(self) -> None:
        self._open: dict[str, Connection] = {}
        self._lock = asyncio.Lock()

    async def get(self, server: str, base_dir: Path, timeout_s: float) -> Connection:
        async with self._lock:
            found = self._open.get(server)
            if found is None or found.broken:
                if found is not None:
                    await found.close()
                found = self._open[server] = await Connection(server, base_dir, timeout_s).open()
            return found

    async def close(self) -> None:
        for connection in self._open.values():
            await connection.close()
        self._open.clear()


FORMAT_HINT = "error: the tool call could not be read; call a tool as the tools list shows, with JSON arguments."


def without_titles(schema: Any) -> Any:
    """A JSON schema without its ``title`` annotations (pydantic's names of each model and field): they validate
    nothing and cost the model prompt tokens. Properties named ``title`` stay."""
    if isinstance(schema, list):
        return [without_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            kept[key] = {name: without_titles(item) for name, item in value.items()}
        else:
            kept[key] = without_titles(value)
    return kept


def result_text(result: Any) -> str:
    """A tool result as the tool message's text: its text parts, else its structured content; errors say so."""
    texts = [part.text for part in result.content if getattr(part, "type", "") == "text"]
    text = "\n".join(texts) if texts else json.dumps(result.structured_content, default=str)
    return f"error: {text}" if result.is_error else text


class McpToolAgent(Agent):
    """The built-in tool agent; ``mcp_agent_class`` binds it to a run's servers."""

    config: McpConfig = McpConfig()
    base_dir: Path = Path(".")
    shared: SharedConnections | None = None

    async def run(self, task: dict[str, Any], llm: LLM) -> AgentResult:
        async with contextlib.AsyncExitStack() as stack:
            connections = [await self._connection(server, stack) for server in self.config.servers]
            owner: dict[str, Connection] = {}
            tools: list[dict[str, Any]] = []
            for connection in connections:
                for tool in (await self._guarded(connection, connection.client.list_tools())).tools:
                    if tool.name in owner:
                        raise ValueError(f"two MCP servers offer a tool named {tool.name!r}: "
                                         f"{owner[tool.name].server!r} and {connection.server!r}")
                    owner[tool.name] = connection
                    tools.append({"type": "function", "function": {
                        "name": tool.name, "description": tool.description or "",
                        "parameters": without_titles(tool.input_schema or {"type": "object"})}})
            return await self._converse(task, llm, tools, owner)

    async def _converse(self, task: dict[str, Any], llm: LLM, tools: list[dict[str, Any]],
                        owner: dict[str, Connection]) -> AgentResult:
        messages = list(task["messages"])
        calls = 0
        reply = None
        for _ in range(self.config.max_turns):
            reply = await llm.chat(messages, tools or None)
            messages.append(reply.message())
            if reply.malformed_tool_call and not reply.tool_calls:
                messages.append({"role": "user", "content": FORMAT_HINT})
                continue
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                calls += 1
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""),
                                 "content": await self._call(call, owner)})
        return AgentResult(reply.content if reply is not None else "",
                           metrics={"tool_calls": float(calls), "turns": float(len(messages))})

    async def _call(self, call: dict[str, Any], owner: dict[str, Connection]) -> str:
        function = call.get("function", {})
        name = function.get("name", "")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError as exc:
            return f"error: the arguments are not JSON: {exc}"
        if name not in owner:
            return f"error: there is no tool named {name!r}"
        connection = owner[name]
        return result_text(await self._guarded(connection, connection.client.call_tool(name, arguments)))

    async def _guarded(self, connection: Connection, request: Any) -> Any:
        """``request`` to the server, within the tool timeout; its failure fails the session (and marks a shared
        connection for a fresh start)."""
        try:
            async with asyncio.timeout(self.config.tool_timeout_s):
                return await request
        except Exception as exc:
            connection.broken = True
            raise RuntimeError(f"{WHAT} {connection.server!r} failed: {first_line(exc)}") from exc

    @classmethod
    async def end_run(cls) -> None:
        if cls.shared is not None:
            await cls.shared.close()

    async def _connection(self, server: str, stack: contextlib.AsyncExitStack) -> Connection:
        if self.shared is not None:
            return await self.shared.get(server, self.base_dir, self.config.tool_timeout_s)
        connection = await Connection(server, self.base_dir, self.config.tool_timeout_s).open()
        stack.push_async_callback(connection.close)
        return connection


def mcp_agent_class(config: McpConfig, base_dir: Path) -> type[McpToolAgent]:
    """The built-in tool agent bound to ``config``'s servers (checked: ValueError with the reason)."""
    check_servers(config, base_dir)
    return type("McpToolAgent", (McpToolAgent,), {"config": config, "base_dir": base_dir,
                                                   "shared": SharedConnections() if config.shared else None})


__all__ = ["Connection", "McpToolAgent", "SharedConnections", "check_servers", "mcp_agent_class", "result_text"]
