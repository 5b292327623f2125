"""What the rollout driver rolls out: a ``Workload`` hands out tasks and plays one session of a task, returning its
``Outcome`` (rewards, metrics, or the reason it failed). ``BuiltinWorkload`` is the built-in tasks with the
white-box agent and, every n-th single-turn group, the black-box example agent; ``TeamWorkload`` is a team's own
tasks, played by its agent program (``forge.rollout.blackbox``) and scored by its verifier
(``forge.rollout.verifier``)."""

from __future__ import annotations

import abc
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from forge.model.sampling import SamplingParams
from forge.rollout.agent import Episode, run_episode
from forge.rollout.blackbox import AgentFailed, BlackBoxRunner
from forge.rollout.llm import GatewayChat
from forge.rollout.verifier import VerificationFailed, Verifier
from forge.tasks import DOMAINS, Task, task_stream
from forge.tasks.source import task_cycle
from forge.v1 import gateway_pb2

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """How one session went: what the driver records when it ends the session."""

    domain: str
    rewards: dict[str, float] = field(default_factory=dict)           # outcome rewards (their sum is the reward)
    process_rewards: dict[int, float] = field(default_factory=dict)   # call index -> reward
    metrics: dict[str, float] = field(default_factory=dict)
    failed: str = ""
    blackbox: bool = False
    reply: str = ""

    @property
    def reward(self) -> float:
        return float(sum(self.rewards.values()))


@dataclass(frozen=True)
class Plan:
    """One task to roll out as a group, and how its sessions are played."""

    task_id: str
    domain: str
    task: Any                      # the workload's own task object
    blackbox: bool                 # sessions need per-session keys and the gateway's HTTP base URL


@dataclass(frozen=True)
class Session:
    """A started session, as an agent reaches it."""

    session_id: str
    api_key: str                   # per-session key ("" when none was issued)
    base_url: str                  # the session's OpenAI base URL ("" without HTTP)


class Workload(abc.ABC):
    """Tasks to roll out and how to play a session of one."""

    domains: tuple[str, ...]

    @abc.abstractmethod
    def next_plan(self) -> Plan:
        """The next task to roll out as a group."""

    @abc.abstractmethod
    async def play(self, stub: Any, plan: Plan, session: Session) -> Outcome:
        """Play one session of ``plan`` (``stub``: the gateway's asyncio gRPC stub); never raises for the
        session's own failures, which come back in ``Outcome.failed``."""

    async def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release what the workload holds (worker pools)."""


class BuiltinWorkload(Workload):
    """The built-in tasks: white-box agents in-process, and every ``blackbox_every``-th single-turn group the
    black-box example agent (a program that knows nothing but the OpenAI client)."""

    def __init__(self, domains: tuple[str, ...] = DOMAINS, *, temperature: float = 1.0, max_tokens: int = 48,
                 tool_latency_s: float = 0.3, blackbox_every: int = 0, seed: int = 0) -> None:
        self.domains = domains
        self.sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        self.tool_latency_s = tool_latency_s
        self.blackbox_every = blackbox_every
        self._tasks = task_stream(domains, seed)
        self._single_turn = 0

    def next_plan(self) -> Plan:
        task: Task = next(self._tasks)
        blackbox = False
        if task.tools is None and self.blackbox_every:
            self._single_turn += 1
            blackbox = self._single_turn % self.blackbox_every == 0
        return Plan(task.task_id, task.domain, task, blackbox)

    async def play(self, stub: Any, plan: Plan, session: Session) -> Outcome:
        task: Task = plan.task
        if plan.blackbox and session.base_url:
            episode = await self._example_agent(task, session)
        else:
            try:
                episode = await run_episode(task, GatewayChat(stub, session.session_id), self.sampling,
                                            self.tool_latency_s)
            except Exception as exc:  # a failed call fails the session, not the driver
                episode = Episode(task, failed=f"{type(exc).__name__}: {exc}")
        return Outcome(task.domain, {"correct": episode.reward}, dict(episode.process_rewards), episode.metrics,
                       episode.failed, plan.blackbox, episode.reply)

    async def _example_agent(self, task: Task, session: Session) -> Episode:
        import asyncio

        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "forge.examples.blackbox_agent", "--base-url", session.base_url,
            "--messages", json.dumps(task.messages), "--max-tokens", str(self.sampling.max_tokens),
            "--temperature", str(self.sampling.temperature),
            env={"OPENAI_API_KEY": session.api_key or "unused", "PATH": "/usr/bin:/bin"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        episode = Episode(task, reply=out.decode().strip())
        if process.returncode != 0:
            episode.failed = f"black-box agent exited with {process.returncode}: {err.decode()[-300:]}"
        episode.reward = task.score(episode.reply)
        return episode


class TeamWorkload(Workload):
    """A team's tasks (dicts, see ``forge.tasks.source``), each session played by its agent program and scored by
    its verifier. A program that fails, or a verifier that raises, fails that session with the reason."""

    def __init__(self, tasks: tuple[dict, ...], verifier: Verifier, runner: BlackBoxRunner, *, seed: int = 0,
                 http_timeout_s: float = 30.0) -> None:
        self.domains = tuple(sorted({t["domain"] for t in tasks}))
        self.verifier = verifier
        self.runner = runner
        self.http_timeout_s = http_timeout_s
        self._tasks = task_cycle(tasks, seed)
        self._http: aiohttp.ClientSession | None = None

    def next_plan(self) -> Plan:
        task = next(self._tasks)
        return Plan(task["id"], task["domain"], task, blackbox=True)

    async def play(self, stub: Any, plan: Plan, session: Session) -> Outcome:
        task, started = plan.task, time.perf_counter()
        metrics: dict[str, float] = {}
        try:
            run = await self.runner.run(task, base_url=session.base_url, api_key=session.api_key,
                                        session_id=session.session_id)
        except AgentFailed as exc:
            return Outcome(plan.domain, metrics={"agent_s": exc.seconds}, failed=exc.reason, blackbox=True)
        metrics["agent_s"] = run.seconds
        recorded = await self._recorded(session)
        recorded["agent"] = {"exit_code": run.exit_code, "seconds": run.seconds, "stderr_tail": run.stderr_tail}
        try:
            rewards = await self.verifier.score(task, run.reply, recorded)
        except VerificationFailed as exc:
            return Outcome(plan.domain, metrics=metrics, failed=str(exc), blackbox=True, reply=run.reply)
        metrics["completion_time_s"] = time.perf_counter() - started
        return Outcome(plan.domain, rewards, {}, metrics, "", True, run.reply)

    async def _recorded(self, session: Session) -> dict[str, Any]:
        """The session as the gateway recorded it (its calls with their timings), for the verifier."""
        root = session.base_url.split("/s/", 1)[0]
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.http_timeout_s))
        try:
            async with self._http.get(f"{root}/v1/sessions/{session.session_id}",
                                      headers={"Authorization": f"Bearer {session.api_key}"}) as response:
                response.raise_for_status()
                return dict(await response.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("session %s: its record could not be read for the verifier: %s", session.session_id, exc)
            return {"session": {"session_id": session.session_id}, "calls": []}

    async def close(self) -> None:
        self.verifier.close()
        if self._http is not None:
            await self._http.close()


def start_request(plan: Plan, group_id: str, group_size: int) -> gateway_pb2.StartSessionRequest:
    return gateway_pb2.StartSessionRequest(
        task_id=plan.task_id, domain=plan.domain, group_id=group_id, group_size=group_size,
        issue_api_key=plan.blackbox, metadata={"agent": "blackbox" if plan.blackbox else "whitebox"})
