"""Shared by the pool tests and their helper processes: deterministic call records and a dump of a whole pool."""

from __future__ import annotations

import hashlib
import random

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


def same_call(stored: pool_pb2.CallRecord, expected: pool_pb2.CallRecord) -> bool:
    return stored.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


def snapshot(reader) -> dict[str, dict[bytes, bytes]]:
    """Every key and value of every database of the pool behind ``reader`` (a Pool or PoolReader)."""
    with reader.store.read() as tx:
        return {name: dict(tx.cursor(name)) for name in DATABASES}
