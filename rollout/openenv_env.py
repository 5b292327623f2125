"""OpenEnv environments (openenv-core): ``[env] openenv = "module:Class"`` (Forge serves the class on loopback in a
process of its own, ``forge.rollout.openenv_server``) or ``openenv_url`` (a server already running). A task is
a reset seed (``0 .. seeds-1``, ``args`` the reset's other keyword arguments); a session is one episode over the
environment's WebSocket: its observations go to the model as user messages through the session's base URL, and
the model's replies go back as actions, until the environment says done or ``max_turns`` replies were made.

Two kinds of environment are played. One whose action is a single text field gets each reply's text in it. An MCP
environment (its action is a tool call) offers its tools to the model as OpenAI tools: each tool call the model
makes is a step, its result the tool message; a reply without a tool call ends the episode (``tool_choice =
"required"`` makes every reply a call, its arguments held to the tool's schema by the gateway's grammar). The rewards of all steps add up to the session's outcome reward
``reward``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.loading import PluginError, first_line
from forge.rollout.openenv_server import WHAT, environment_class, wire_classes
from forge.rollout.tasks.source import TaskSet, split, task_cycle
from forge.rollout.workload import SESSION_MODEL, Outcome, Plan, Session, Workload
from forge.sampling.params import SamplingParams

CALL_TOOL = "call_tool"


@dataclass(frozen=True)
class Interface:
    """How the model meets the environment: ``text_field`` (the action's one text field) or tools."""

    name: str                       # the environment's name: the domain
    text_field: str | None          # None: an MCP environment, played with tools


def interface_of(action_schema: dict[str, Any], name: str, spec: str) -> Interface:
    """The interface an action's JSON schema allows; PluginError for an action the model's reply cannot fill."""
    properties = {k: v for k, v in action_schema.get("properties", {}).items() if k != "metadata"}
    if "tool_name" in properties and "arguments" in properties:
        return Interface(name, None)
    texts = [k for k, v in properties.items() if v.get("type") == "string"]
    required = [k for k in action_schema.get("required", []) if k != "metadata"]
    if len(texts) == 1 and set(required) <= set(texts):
        return Interface(name, texts[0])
    raise PluginError(WHAT, spec, f"its action has the fields {sorted(properties)}; Forge plays an action with one "
                                  f"text field (the model's reply) or an MCP environment's tool calls")


def content_text(result: Any) -> str:
    """An MCP tool result as the tool message's text."""
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        texts = [part.get("text", "") for part in result["content"] if isinstance(part, dict)
                 and part.get("type") == "text"]
        if texts:
            return "\n".join(texts)
        return json.dumps(result.get("data", result.get("structured_content")), default=str)
    return result if isinstance(result, str) else json.dumps(result, default=str)


def observation_text(observation: dict[str, Any]) -> str:
    """An observation as the text the model reads: a tool's error or result, a lone field's value, or each field
    on a line of its own."""
    fields = {k: v for k, v in observation.items() if v not in (None, "", [], {}) and k != "tool_name"}
    error = fields.get("error")
    if isinstance(error, dict):
        return f"error: {error.get('message', error)}"
    if "result" in fields:
        return content_text(fields["result"])
    if len(fields) == 1:
        value = next(iter(fields.values()))
        return value if isinstance(value, str) else json.dumps(value, default=str)
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, default=str)}" for k, v in fields.items())


def openai_tools(listed: list[dict[str, Any]], strict: bool = False) -> list[dict[str, Any]]:
    """MCP tools as OpenAI function tools; ``strict``: their arguments held to their schemas."""
    return [{"type": "function", "function": {"name": tool["name"], "description": tool.get("description") or "",
                                              "parameters": tool.get("input_schema") or {"type": "object"},
                                              **({"strict": True} if strict else {})}}
            for tool in listed]


def seed_tasks(name: str, seeds: int, eval_fraction: float, seed: int) -> TaskSet:
    if eval_fraction and seeds < 2:
        raise ValueError(f"{WHAT} {name!r}: one seed cannot be split into train and held-out")
    return split([{"id": f"seed-{n}", "domain": name, "seed": n} for n in range(seeds)], eval_fraction, seed)


class ManagedServer:
    """The environment class served by a child process (``forge.rollout.openenv_server``), started on first
    use and stopped with the workload; its log is kept in a file and quoted if it fails to start."""

    def __init__(self, spec: str, base_dir: Path, concurrency: int) -> None:
        self.argv = [sys.executable, "-m", "forge.rollout.openenv_server", spec, "--base-dir", str(base_dir),
                     "--concurrency", str(concurrency)]
        descriptor, name = tempfile.mkstemp(prefix="forge-openenv-", suffix=".log")
        os.close(descriptor)
        self.log = Path(name)
        self.process: asyncio.subprocess.Process | None = None
        self.url: str | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> str:
        async with self._lock:
            if self.url is None:
                with self.log.open("wb") as log_file:
                    self.process = await asyncio.create_subprocess_exec(
                        *self.argv, stdout=asyncio.subprocess.PIPE, stderr=log_file, start_new_session=True)
                assert self.process.stdout is not None
                line = await self.process.stdout.readline()
                try:
                    self.url = json.loads(line)["url"]
                except (ValueError, KeyError, TypeError):
                    await self.process.wait()
                    tail = self.log.read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"the OpenEnv server did not start (exit {self.process.returncode}): "
                                       f"{tail}") from None
        return self.url

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()
        self.log.unlink(missing_ok=True)


@dataclass
class OpenEnvEnvironment:
    """An OpenEnv environment, checked before anything starts: its interface and its seed tasks."""

    interface: Interface
    tasks: TaskSet
    url: str | None                     # None: Forge serves ``spec`` itself
    spec: str | None
    base_dir: Path
    reset_args: dict[str, Any]
    max_turns: int
    concurrency: int
    timeout_s: float
    tool_choice: str = "auto"

    @classmethod
    def load(cls, *, spec: str | None, url: str | None, base_dir: Path, reset_args: dict[str, Any], seeds: int,
             eval_fraction: float, seed: int, max_turns: int, concurrency: int, timeout_s: float,
             tool_choice: str = "auto") -> OpenEnvEnvironment:
        """PluginError (a ValueError) with the reason when the class cannot be used or the server not reached."""
        if spec is not None:
            env_class = environment_class(spec, base_dir)
            action, _ = wire_classes(env_class, spec)
            interface = interface_of(action.model_json_schema(), env_class.__name__, spec)
            if not getattr(env_class, "SUPPORTS_CONCURRENT_SESSIONS", False):
                concurrency = 1
        else:
            interface = probe(url)
        return cls(interface, seed_tasks(interface.name, seeds, eval_fraction, seed), url, spec, base_dir,
                   reset_args, max_turns, concurrency, timeout_s, tool_choice)

    def describe(self) -> str:
        """One line for the start of a run: what is played, and how."""
        where = self.url or "served by Forge on loopback"
        how = f"its {self.interface.text_field!r} field" if self.interface.text_field else "tool calls"
        return (f"environment: {self.interface.name} (OpenEnv, {where}; replies in {how}; "
                f"{len(self.tasks.train)} seeds, {len(self.tasks.eval)} held out)")

    def workload(self, sampling: SamplingParams, seed: int = 0) -> OpenEnvWorkload:
        server = ManagedServer(self.spec, self.base_dir, self.concurrency) if self.spec is not None else None
        return OpenEnvWorkload(self, self.tasks.train, sampling, server=server, seed=seed)


def probe(url: str) -> Interface:
    """The interface of the environment served at ``url`` (its /metadata and /schema)."""
    import httpx

    try:
        with httpx.Client(base_url=url, timeout=30.0, trust_env=False) as client:
            schema = client.get("/schema").raise_for_status().json()
            name = client.get("/metadata").raise_for_status().json().get("name") or "openenv"
    except (httpx.HTTPError, ValueError) as exc:
        raise PluginError(WHAT, url, f"its server cannot be reached: {first_line(exc)}") from None
    return interface_of(schema.get("action", {}), name, url)


class OpenEnvWorkload(Workload):
    """Each session one episode of the environment, its replies through the session's base URL."""

    def __init__(self, environment: OpenEnvEnvironment, tasks: Sequence[dict[str, Any]], sampling: SamplingParams,
                 *, server: ManagedServer | None = None, seed: int = 0) -> None:
        self.environment = environment
        self.domains = (environment.interface.name,)
        self.sampling = sampling
        self.server = server
        self._tasks = task_cycle(tasks, seed)
        self._limit = asyncio.Semaphore(environment.concurrency)

    def next_plan(self) -> Plan:
        return self.plan_for(next(self._tasks))

    def plan_for(self, task: dict[str, Any]) -> Plan:
        return Plan(task["id"], task["domain"], task, blackbox=True)

    async def play(self, stub: Any, plan: Plan, session: Session) -> Outcome:
        started = time.perf_counter()
        episode = Episode()
        try:
            async with self._limit:             # the timeout counts from the episode's start, not from its wait
                async with asyncio.timeout(self.environment.timeout_s):
                    url = self.environment.url or await self.server.start()
                    await self._episode(url, plan.task, session, episode)
        except TimeoutError:
            return Outcome(plan.domain, failed=f"the episode took longer than {self.environment.timeout_s:g} s",
                           blackbox=True, reply=episode.reply)
        except Exception as exc:  # the environment's or the model call's failure fails its session only
            return Outcome(plan.domain, failed=f"the episode failed: {first_line(exc)}"[:1000], blackbox=True,
                           reply=episode.reply)
        metrics = {"steps": float(episode.steps), "turns": float(episode.turns), "done": float(episode.done),
                   "completion_time_s": time.perf_counter() - started}
        return Outcome(plan.domain, {"reward": episode.reward}, {}, metrics, "", True, episode.reply)

    async def _episode(self, url: str, task: dict[str, Any], session: Session, episode: Episode) -> None:
        from openai import AsyncOpenAI
        from openenv.core import GenericEnvClient

        tools_mode = self.environment.interface.text_field is None
        model = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key or session.driver_key, max_retries=0)
        async with GenericEnvClient(base_url=url, message_timeout_s=self.environment.timeout_s) as env, model:
            result = await env.reset(seed=task["seed"], **self.environment.reset_args)
            messages: list[dict[str, Any]] = [{"role": "user", "content": observation_text(result.observation)}]
            tools: list[dict[str, Any]] = []
            if tools_mode:
                listed = await env.step({"type": "list_tools"})
                tools = openai_tools(listed.observation.get("tools", []),
                                     strict=self.environment.tool_choice == "required")
            while not result.done and episode.turns < self.environment.max_turns:
                reply = (await model.chat.completions.create(
                    model=SESSION_MODEL, messages=messages, temperature=self.sampling.temperature,
                    max_tokens=self.sampling.max_tokens,
                    **({"tools": tools, "tool_choice": self.environment.tool_choice} if tools else {})
                )).choices[0].message
                episode.turns += 1
                episode.reply = reply.content or ""
                messages.append(reply.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
                if not tools_mode:
                    result = await env.step({self.environment.interface.text_field: episode.reply})
                    episode.took(result)
                    if not result.done:
                        messages.append({"role": "user", "content": observation_text(result.observation)})
                    continue
                if not reply.tool_calls:
                    break                   # the model answered without a tool: its episode is over
                for call in reply.tool_calls:
                    try:
                        arguments = json.loads(call.function.arguments or "{}")
                    except ValueError as exc:
                        messages.append({"role": "tool", "tool_call_id": call.id,
                                         "content": f"error: the arguments are not JSON: {exc}"})
                        continue
                    result = await env.step({"type": CALL_TOOL, "tool_name": call.function.name,
                                             "arguments": arguments})
                    episode.took(result)
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": observation_text(result.observation)})
                    if result.done:
                        break

    async def close(self) -> None:
        if self.server is not None:
            await self.server.stop()


@dataclass
class Episode:
    """What one episode came to so far (kept when it fails half-way)."""

    reward: float = 0.0
    steps: int = 0
    turns: int = 0
    done: bool = False
    reply: str = ""

    def took(self, result: Any) -> None:
        self.steps += 1
        self.reward += float(result.reward or 0.0)
        self.done = bool(result.done)

__all__ = ["Interface", "OpenEnvEnvironment", "OpenEnvWorkload", "interface_of", "observation_text", "seed_tasks"]
