"""The rollout driver: issues the built-in tasks in groups of G through the gateway and closes each session with
its verified reward. White-box agents run in-process over gRPC; every ``blackbox_every``-th single-turn group is
solved by the black-box example agent instead (a separate program that knows nothing but the OpenAI client and a
session's base URL)."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import sys
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from forge.model.sampling import SamplingParams
from forge.rollout.agent import Episode, run_episode
from forge.rollout.llm import GatewayChat, aio_channel
from forge.tasks import DOMAINS, Task, task_stream
from forge.v1 import gateway_pb2, gateway_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverConfig:
    gateway: str                               # host:port of the gateway's gRPC service
    http_base: str = ""                        # the gateway's OpenAI base URL root (for black-box agents)
    api_key: str | None = None
    domains: tuple[str, ...] = DOMAINS
    group_size: int = 4
    groups_in_flight: int = 4
    temperature: float = 1.0
    max_tokens: int = 48
    tool_latency_s: float = 0.3
    blackbox_every: int = 0                    # 0 = never
    max_queued_groups: int = 0                 # pause issuing while more groups wait for the learner (0 = no limit)
    seed: int = 0


class RolloutStats:
    def __init__(self, window: int = 64) -> None:
        self.episodes = 0
        self.blackbox = 0
        self.failed = 0
        self.recent: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))

    def add(self, episode: Episode, blackbox: bool) -> None:
        self.episodes += 1
        self.blackbox += blackbox
        self.failed += bool(episode.failed)
        self.recent[episode.task.domain].append(episode.reward)

    def reward(self) -> dict[str, float]:
        return {d: sum(v) / len(v) for d, v in self.recent.items() if v}


class RolloutDriver:
    def __init__(self, config: DriverConfig, on_episode: Callable[[Episode, bool], None] | None = None,
                 queued_groups: Callable[[], int] | None = None) -> None:
        """``queued_groups`` tells how many issued groups the learner has not taken yet (for backpressure)."""
        self.config = config
        self.stats = RolloutStats()
        self.on_episode = on_episode
        self.queued_groups = queued_groups
        self._tasks = task_stream(config.domains, config.seed)
        self._group = 0
        self._single_turn = 0
        self._run_tag = secrets.token_hex(4)    # group ids stay unique when a run directory (and pool) is reused

    def _sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.config.temperature, max_tokens=self.config.max_tokens)

    async def run(self, stop: asyncio.Event) -> None:
        async with aio_channel(self.config.gateway, self.config.api_key) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            running: set[asyncio.Task] = set()
            while not stop.is_set():
                while len(running) < self.config.groups_in_flight and not self._throttled():
                    running.add(asyncio.create_task(self._run_group(stub, next(self._tasks))))
                if not running:
                    await asyncio.sleep(0.2)
                    continue
                done, running = await asyncio.wait(running, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    if finished.exception() is not None:
                        log.warning("a rollout group failed: %s", finished.exception())
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def _throttled(self) -> bool:
        limit = self.config.max_queued_groups
        return bool(limit and self.queued_groups and self.queued_groups() >= limit)

    async def _run_group(self, stub, task: Task) -> None:
        self._group += 1
        blackbox = False
        if task.tools is None and self.config.blackbox_every and self.config.http_base:
            self._single_turn += 1
            blackbox = self._single_turn % self.config.blackbox_every == 0
        group_id = f"{task.task_id}-{self._run_tag}-g{self._group}"
        starts = [stub.StartSession(gateway_pb2.StartSessionRequest(
            task_id=task.task_id, domain=task.domain, group_id=group_id, group_size=self.config.group_size,
            issue_api_key=bool(blackbox), metadata={"agent": "blackbox" if blackbox else "whitebox"}), timeout=60)
            for _ in range(self.config.group_size)]
        sessions = await asyncio.gather(*starts)
        runner = self._blackbox if blackbox else self._whitebox
        await asyncio.gather(*(runner(stub, task, started) for started in sessions))

    async def _finish(self, stub, session_id: str, episode: Episode, blackbox: bool) -> None:
        for index, reward in episode.process_rewards.items():
            if index >= 0:
                await stub.AddReward(gateway_pb2.AddRewardRequest(session_id=session_id, call_index=index,
                                                                  reward=reward), timeout=60)
        await stub.EndSession(gateway_pb2.EndSessionRequest(
            session_id=session_id, outcome_rewards={"correct": episode.reward}, metrics=episode.metrics,
            failed=bool(episode.failed), failure_reason=episode.failed), timeout=60)
        self.stats.add(episode, blackbox)
        if self.on_episode:
            self.on_episode(episode, blackbox)

    async def _whitebox(self, stub, task: Task, started: gateway_pb2.StartSessionResponse) -> None:
        session_id = started.session.session_id
        try:
            episode = await run_episode(task, GatewayChat(stub, session_id), self._sampling(),
                                        self.config.tool_latency_s)
        except Exception as exc:  # a failed call fails the session, not the driver
            episode = Episode(task, failed=f"{type(exc).__name__}: {exc}")
        await self._finish(stub, session_id, episode, False)

    async def _blackbox(self, stub, task: Task, started: gateway_pb2.StartSessionResponse) -> None:
        """Run the black-box example agent as its own process against this session's base URL and key."""
        session_id = started.session.session_id
        base_url = self.config.http_base.rstrip("/") + f"/s/{session_id}/v1"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "forge.examples.blackbox_agent", "--base-url", base_url,
            "--messages", json.dumps(task.messages), "--max-tokens", str(self.config.max_tokens),
            "--temperature", str(self.config.temperature),
            env={"OPENAI_API_KEY": started.api_key or "unused", "PATH": "/usr/bin:/bin"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        episode = Episode(task, reply=out.decode().strip())
        if process.returncode != 0:
            episode.failed = f"black-box agent exited with {process.returncode}: {err.decode()[-300:]}"
        episode.reward = task.score(episode.reply)
        await self._finish(stub, session_id, episode, True)
