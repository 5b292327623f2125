"""Held-out evaluation: the fixed evaluation tasks of each domain, solved by the white-box agent straight against an
actor (nothing is recorded in the pool or trained on); and a team's held-out tasks, played by its agent through a
gateway of their own.

Two readings: *greedy* (temperature 0, one episode per task) and *sampled* (the training temperature, ``samples``
seeded episodes per task), the expected reward of the very policy RL trains."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from forge.rollout.agent import run_episode
from forge.rollout.llm import ActorChat, ChatLLM, aio_channel
from forge.rollout.tasks import DOMAINS, eval_set
from forge.sampling.params import SamplingParams
from forge.tokenizer import Tokenizer
from forge.v1 import actor_pb2_grpc

if TYPE_CHECKING:
    from forge.rollout.workload import TeamWorkload


async def evaluate_with(llm: ChatLLM, domains: tuple[str, ...] = DOMAINS, size: int = 48, max_tokens: int = 48,
                        concurrency: int = 16, tool_latency_s: float = 0.0, temperature: float = 0.0,
                        samples: int = 1, seed: int = 0) -> dict[str, float]:
    """Mean reward per domain on the held-out sets: ``samples`` episodes per task at ``temperature`` (greedy at 0,
    where more than one sample would repeat the same episode). Episode k of task i is seeded with seed + i·samples + k,
    so a reading is reproducible for given weights."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if temperature == 0.0:
        samples = 1
    limit = asyncio.Semaphore(concurrency)

    async def one(task, episode_seed: int) -> float:
        sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                  seed=episode_seed if temperature > 0 else None)
        async with limit:
            return (await run_episode(task, llm, sampling, tool_latency_s)).reward

    results = {}
    for domain in domains:
        scores = await asyncio.gather(*(one(task, seed + i * samples + k)
                                        for i, task in enumerate(eval_set(domain, size)) for k in range(samples)))
        results[domain] = sum(scores) / len(scores)
    return results


async def evaluate(actor: str, tokenizer: Tokenizer, domains: tuple[str, ...] = DOMAINS, size: int = 48,
                   max_tokens: int = 48, concurrency: int = 16, tool_latency_s: float = 0.0, temperature: float = 0.0,
                   samples: int = 1) -> dict[str, float]:
    """``evaluate_with`` against the actor at ``actor`` (host:port)."""
    readings = await evaluate_readings(actor, tokenizer, [(temperature, samples)], domains, size, max_tokens,
                                       concurrency, tool_latency_s)
    return readings[0]


async def evaluate_readings(actor: str, tokenizer: Tokenizer, readings: Sequence[tuple[float, int]],
                            domains: tuple[str, ...] = DOMAINS, size: int = 48, max_tokens: int = 48,
                            concurrency: int = 16, tool_latency_s: float = 0.0, api_key: str | None = None,
                            adapter: str = "") -> list[dict[str, float]]:
    """One ``evaluate_with`` per (temperature, samples) reading, in order, over one channel to ``actor`` (with its
    ``api_key`` when it requires one), sampled with its named ``adapter`` when given."""
    async with aio_channel(actor, api_key) as channel:
        llm = ActorChat(actor_pb2_grpc.ActorStub(channel), tokenizer, adapter)
        return [await evaluate_with(llm, domains, size, max_tokens, concurrency, tool_latency_s, temperature, samples)
                for temperature, samples in readings]


async def evaluate_sessions(gateway: str, http_base: str, workload: TeamWorkload, tasks: Sequence[dict],
                            samples: int = 1, api_key: str | None = None) -> tuple[dict[str, float], int]:
    """(mean reward per domain, failed sessions) of a team's held-out ``tasks``, each played ``samples`` times by
    the workload's agent through ``gateway`` — a gateway whose pool no learner reads, so nothing here is trained
    on. A failed session counts as reward 0. ``api_key``: the gateway's, when it requires one."""
    from forge.rollout.driver import finish, session_of
    from forge.rollout.workload import start_request
    from forge.v1 import gateway_pb2_grpc

    async with aio_channel(gateway, api_key) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(task: dict) -> tuple[str, float, bool]:
            plan = workload.plan_for(task)
            started = await stub.StartSession(start_request(plan, "", 1), timeout=60)
            session = session_of(started, http_base, api_key)
            outcome = await workload.play(stub, plan, session)
            await finish(stub, session.session_id, outcome)
            return task["domain"], outcome.reward, bool(outcome.failed)

        played = await asyncio.gather(*(one(task) for task in tasks for _ in range(samples)))
    by_domain: dict[str, list[float]] = {}
    for domain, reward, _ in played:
        by_domain.setdefault(domain, []).append(reward)
    return {d: sum(v) / len(v) for d, v in sorted(by_domain.items())}, sum(failed for *_, failed in played)
