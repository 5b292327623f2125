"""What the rollout driver rolls out: a ``Workload`` hands out tasks and plays one session of a task, returning its
``Outcome`` (rewards, metrics, or the reason it failed). ``BuiltinWorkload`` is the built-in tasks with the
white-box agent and, every n-th single-turn group, the black-box example agent; ``TeamWorkload`` is a team's own
tasks, played by its agent program (``forge.rollout.blackbox``) and scored by its verifier
(``forge.rollout.verifier``)."""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from forge.agents import AgentResult
from forge.rollout.agent import Episode, run_episode
from forge.rollout.blackbox import AgentFailed, BlackBoxRunner
from forge.rollout.llm import GatewayChat
from forge.rollout.sandbox import SandboxConfig, SandboxPool
from forge.rollout.sandbox.tripwires import describe
from forge.rollout.tasks import DOMAINS, Task, task_stream
from forge.rollout.tasks.long import PAGE_LINES
from forge.rollout.tasks.source import task_cycle
from forge.rollout.verifier import VerificationFailed, Verifier
from forge.sampling.params import SamplingParams
from forge.v1 import gateway_pb2

log = logging.getLogger(__name__)
SESSION_MODEL = "forge"         # the model name environments' clients send: a session's URL serves its policy by any


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
    driver_key: str = ""           # the driver's own gateway key, for its reads of the session; never an agent's


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
                 tool_latency_s: float = 0.3, blackbox_every: int = 0, seed: int = 0,
                 page_lines: int = PAGE_LINES) -> None:
        self.domains = domains
        self.sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        self.tool_latency_s = tool_latency_s
        self.blackbox_every = blackbox_every
        self._tasks = task_stream(domains, seed, page_lines)
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
        try:
            out, err = await process.communicate()
        except asyncio.CancelledError:          # the driver stops: end the program, and read its pipes to their end
            process.kill()                      # on this loop, which closes them before the loop goes
            await process.communicate()
            raise
        episode = Episode(task, reply=out.decode().strip())
        if process.returncode != 0:
            episode.failed = f"black-box agent exited with {process.returncode}: {err.decode()[-300:]}"
        episode.reward = task.score(episode.reply)
        return episode


class SessionLLM:
    """A white-box agent's ``forge.agents.LLM``: the session's calls through the gateway's gRPC Chat, with the
    run's sampling unless the agent gives its own."""

    def __init__(self, stub: Any, session_id: str, sampling: SamplingParams) -> None:
        self._chat = GatewayChat(stub, session_id)
        self.sampling = sampling

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                   sampling: SamplingParams | None = None) -> Any:
        return await self._chat.chat(messages, tools, sampling or self.sampling)


class TeamWorkload(Workload):
    """A team's tasks (dicts, see ``forge.rollout.tasks.source``), each session played by its agent — a program
    (``runner``, black-box) or a ``forge.agents.Agent`` class (``agent_class``, white-box) — and scored by its
    verifier. An agent that fails, or a verifier that raises, fails that session with the reason."""

    def __init__(self, tasks: tuple[dict, ...], verifier: Verifier, *, runner: BlackBoxRunner | None = None,
                 agent_class: type | None = None, sampling: SamplingParams | None = None, seed: int = 0,
                 tokenizer: Any = None, http_timeout_s: float = 30.0, sandbox: SandboxConfig | None = None,
                 base_dir: Path = Path(".")) -> None:
        """With ``sandbox``, each session's program gets a sandbox seeded from its task's ``workspace`` folder
        (relative to ``base_dir``), held until the verifier has scored it; an escape attempt made in it, by the
        program's commands or the verifier's tests, fails the session."""
        if (runner is None) == (agent_class is None):
            raise ValueError("a team workload has one agent: a program (runner) or an Agent class")
        self.domains = tuple(sorted({t["domain"] for t in tasks}))
        self.verifier = verifier
        self.runner = runner
        self.agent_class = agent_class
        self.sampling = sampling or SamplingParams(temperature=1.0, max_tokens=256)
        self.tokenizer = tokenizer
        self.http_timeout_s = http_timeout_s
        self._tasks = task_cycle(tasks, seed)
        self._http: aiohttp.ClientSession | None = None
        self.base_dir = base_dir
        self.sandboxes = (SandboxPool(Path(tempfile.mkdtemp(prefix="forge-sandboxes-")), sandbox)
                          if sandbox is not None else None)

    def next_plan(self) -> Plan:
        return self.plan_for(next(self._tasks))

    def plan_for(self, task: dict) -> Plan:
        return Plan(task["id"], task["domain"], task, blackbox=self.runner is not None)

    async def play(self, stub: Any, plan: Plan, session: Session) -> Outcome:
        if self.sandboxes is None:
            return await self._play(stub, plan, session)
        seed = plan.task.get("workspace")
        async with self.sandboxes.async_session(self.base_dir / seed if seed else None) as sandbox:
            outcome = await self._play(stub, plan, session, sandbox.directory)
            attempts = await asyncio.to_thread(sandbox.attempts)
        if not attempts:
            return outcome
        return replace(outcome, rewards={}, process_rewards={}, failed=f"sandbox escape attempt: {describe(attempts)}")

    async def _play(self, stub: Any, plan: Plan, session: Session, sandbox: Path | None = None) -> Outcome:
        started = time.perf_counter()
        played = await (self._program(plan, session, sandbox) if self.runner is not None else
                        self._whitebox(stub, plan, session))
        if isinstance(played, Outcome):
            return played
        reply, extra, process_rewards, metrics = played
        recorded = await self._recorded(session) if session.base_url else {"session": {}, "calls": []}
        recorded.update(extra)
        if sandbox is not None:
            recorded["sandbox"] = str(sandbox)
        try:
            rewards = await self.verifier.score(plan.task, reply, recorded)
        except VerificationFailed as exc:
            return Outcome(plan.domain, metrics=metrics, failed=str(exc), blackbox=plan.blackbox, reply=reply)
        metrics["completion_time_s"] = time.perf_counter() - started
        return Outcome(plan.domain, rewards, process_rewards, metrics, "", plan.blackbox, reply)

    async def _program(self, plan: Plan, session: Session, sandbox: Path | None) -> Outcome | tuple:
        try:
            run = await self.runner.run(plan.task, base_url=session.base_url, api_key=session.api_key,
                                        session_id=session.session_id, sandbox=sandbox)
        except AgentFailed as exc:
            return Outcome(plan.domain, metrics={"agent_s": exc.seconds}, failed=exc.reason, blackbox=True)
        agent = {"agent": {"exit_code": run.exit_code, "seconds": run.seconds, "stderr_tail": run.stderr_tail}}
        return run.reply, agent, {}, {"agent_s": run.seconds}

    async def _whitebox(self, stub: Any, plan: Plan, session: Session) -> Outcome | tuple:
        started = time.perf_counter()
        try:
            result = await self.agent_class().run(plan.task, SessionLLM(stub, session.session_id, self.sampling))
            if not isinstance(result, AgentResult):
                raise TypeError(f"run returned {type(result).__name__}, not forge.agents.AgentResult")
            metrics = {**{str(k): float(v) for k, v in result.metrics.items()},
                       "context_rewrites": float(result.context_rewrites)}
            process_rewards = {int(k): float(v) for k, v in result.process_rewards.items()}
        except Exception as exc:  # the agent's failure fails its session, not the driver
            return Outcome(plan.domain, failed=f"agent raised {type(exc).__name__}: {exc}"[:1000])
        seconds = time.perf_counter() - started
        metrics["agent_s"] = seconds
        agent = {"agent": {"seconds": seconds, "context_rewrites": result.context_rewrites}}
        return result.reply, agent, process_rewards, metrics

    async def _recorded(self, session: Session) -> dict[str, Any]:
        """The session as the gateway recorded it, for the verifier: its calls with their timings, token ids and,
        with a tokenizer, their text (``prompt``, ``completion``)."""
        root = session.base_url.split("/s/", 1)[0]
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.http_timeout_s))
        try:
            async with self._http.get(f"{root}/v1/sessions/{session.session_id}", params={"include_ids": "1"},
                                      headers={"Authorization": f"Bearer {session.api_key or session.driver_key}"}
                                      ) as response:
                response.raise_for_status()
                recorded = dict(await response.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("session %s: its record could not be read for the verifier: %s", session.session_id, exc)
            return {"session": {"session_id": session.session_id}, "calls": []}
        if self.tokenizer is not None:
            for call in recorded.get("calls", []):
                call["prompt"] = self.tokenizer.decode(call.get("prompt_ids", []))
                call["completion"] = self.tokenizer.decode(call.get("completion_ids", []))
        return recorded

    async def close(self) -> None:
        self.verifier.close()
        if self.agent_class is not None:
            await self.agent_class.end_run()
        if self._http is not None:
            await self._http.close()
        if self.sandboxes is not None:
            self.sandboxes.close()


def start_request(plan: Plan, group_id: str, group_size: int) -> gateway_pb2.StartSessionRequest:
    return gateway_pb2.StartSessionRequest(
        task_id=plan.task_id, domain=plan.domain, group_id=group_id, group_size=group_size,
        issue_api_key=plan.blackbox, metadata={"agent": "blackbox" if plan.blackbox else "whitebox"})
