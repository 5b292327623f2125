"""Shared by the pool tests and their helper processes: deterministic call records, sessions whose prompts extend or
rewrite their history and the form the pool stores them in, a dump of a whole pool, and a
small pool as ``forge pool``'s commands find it."""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

from forge.pool import Pool
from forge.pool.layout import DATABASES
from forge.v1 import common_pb2, pool_pb2


def make_call(session_id: str, index: int, prompt_len: int = 16, completion_len: int = 8) -> pool_pb2.CallRecord:
    """A call whose content is a function of (session_id, index), so any reader can check it."""
    seed = int.from_bytes(hashlib.sha256(f"{session_id}/{index}".encode()).digest()[:8], "big")
    rng = random.Random(seed)
    return pool_pb2.CallRecord(
        session_id=session_id, index=index,
        prompt_ids=[rng.randrange(1024) for _ in range(prompt_len)],
        completion_ids=[rng.randrange(1024) for _ in range(completion_len)],
        logprobs=[-rng.random() for _ in range(completion_len)],
        weight_versions=[index] * completion_len, actor=f"actor-{seed % 4}",
        timing=common_pb2.Timing(total_s=rng.random()), finish_reason=common_pb2.FINISH_REASON_STOP,
        sampling=common_pb2.SamplingParams(temperature=1.0), created_at=1.0 + index)


def varied_session_calls(rng: random.Random, session_id: str, count: int) -> list[pool_pb2.CallRecord]:
    """Calls of one session: most extend the previous call's ids, some repeat them exactly, some rewrite history."""
    calls: list[pool_pb2.CallRecord] = []
    for index in range(count):
        call = make_call(session_id, index, prompt_len=rng.randrange(1, 12), completion_len=rng.randrange(0, 6))
        if calls:
            before = [*calls[-1].prompt_ids, *calls[-1].completion_ids]
            kind = rng.choice(["extend", "extend", "extend", "repeat", "rewrite", "cut"])
            prompt = {"extend": [*before, *call.prompt_ids], "repeat": before,
                      "rewrite": [*before[:-1], before[-1] + 1, *call.prompt_ids],
                      "cut": before[:max(1, len(before) // 2)]}[kind]
            del call.prompt_ids[:]
            call.prompt_ids.extend(prompt)
        calls.append(call)
    return calls


def stored_prompts(pool, session_id: str) -> list[tuple[int, int]]:
    """(prompt_shared, stored prompt ids) of each of a session's calls as the pool holds them."""
    with pool.store.read() as tx:
        return [(c.prompt_shared, len(c.prompt_ids)) for c in
                (pool_pb2.CallRecord.FromString(data) for _, data in tx.call_items(session_id))]


def same_call(stored: pool_pb2.CallRecord, expected: pool_pb2.CallRecord) -> bool:
    return stored.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


def snapshot(reader) -> dict[str, dict[bytes, bytes]]:
    """Every key and value of every database of the pool behind ``reader`` (a Pool or PoolReader)."""
    with reader.store.read() as tx:
        return {name: dict(tx.cursor(name)) for name in DATABASES}


@contextlib.contextmanager
def cli_pool(path: Path) -> Iterator[Pool]:
    """A pool open for writing at ``path``: a group of two closed sessions (g0's two calls are text encoded by
    the built-in tokenizer, with a process reward on the second; g1 has one call), and a session left open."""
    from forge.checkpoints import tiny_tokenizer  # imports torch: not for the pool's helper processes

    tokenizer = tiny_tokenizer()
    with Pool(path) as opened:
        group = [opened.open_session(session_id=f"g{i}", task_id="sum", group_id="g", group_size=2) for i in range(2)]
        prompt, answer = tokenizer.encode("What is 12 + 30?"), tokenizer.encode("It is 42.")
        opened.append_call(pool_pb2.CallRecord(session_id="g0", index=0, prompt_ids=prompt, completion_ids=answer,
                                               logprobs=[-0.5] * len(answer), weight_versions=[3] * len(answer),
                                               actor="actor-0"))
        follow, completion = prompt + answer + tokenizer.encode(" Sure?"), tokenizer.encode("Yes.")
        opened.append_call(pool_pb2.CallRecord(session_id="g0", index=1, prompt_ids=follow, completion_ids=completion,
                                               logprobs=[-0.1] * len(completion), weight_versions=[4] * len(completion)))
        opened.append_call(make_call("g1", 0))
        opened.add_process_reward("g0", 1, 0.75)
        for session in group:
            opened.close_session(session_id=session.session_id, outcome_rewards={"correct": 1.0})
        opened.open_session(session_id="later")
        yield opened
