"""Held-out evaluation: the fixed evaluation tasks of each domain, solved greedily by the white-box agent straight
against an actor (nothing is recorded in the pool or trained on)."""

from __future__ import annotations

import asyncio

from forge.model.sampling import SamplingParams
from forge.rollout.agent import run_episode
from forge.rollout.llm import ActorChat, ChatLLM, aio_channel
from forge.tasks import DOMAINS, eval_set
from forge.tokenizer import Tokenizer
from forge.v1 import actor_pb2_grpc


async def evaluate_with(llm: ChatLLM, domains: tuple[str, ...] = DOMAINS, size: int = 48, max_tokens: int = 48,
                        concurrency: int = 16, tool_latency_s: float = 0.0) -> dict[str, float]:
    """Mean reward per domain on the held-out sets (greedy decoding)."""
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    limit = asyncio.Semaphore(concurrency)

    async def one(task) -> float:
        async with limit:
            return (await run_episode(task, llm, sampling, tool_latency_s)).reward

    results = {}
    for domain in domains:
        scores = await asyncio.gather(*(one(task) for task in eval_set(domain, size)))
        results[domain] = sum(scores) / len(scores)
    return results


async def evaluate(actor: str, tokenizer: Tokenizer, domains: tuple[str, ...] = DOMAINS, size: int = 48,
                   max_tokens: int = 48, concurrency: int = 16, tool_latency_s: float = 0.0) -> dict[str, float]:
    """``evaluate_with`` against the actor at ``actor`` (host:port)."""
    async with aio_channel(actor) as channel:
        llm = ActorChat(actor_pb2_grpc.ActorStub(channel), tokenizer)
        return await evaluate_with(llm, domains, size, max_tokens, concurrency, tool_latency_s)
