"""The gateway's pool behind coroutines (``forge.gateway.async_pool``) when the pool is a service: the writes of
sessions and calls are awaited on the gRPC calls themselves, and what fails comes out as the gateway's errors (a
refused call as the client's fault, a service that is gone as the pool being unavailable)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from forge.gateway.async_pool import AsyncPool
from forge.gateway.errors import Conflict, PoolUnavailable
from forge.pool import Pool, PoolClient, serve_pool
from forge.v1 import pool_pb2

from helpers.pool_util import make_call


def test_a_remote_pools_writes_are_awaited_and_fail_as_gateway_errors(tmp_path):
    pool = Pool(tmp_path / "pool")
    server = serve_pool(pool)
    remote = AsyncPool(PoolClient(server.address, timeout_s=30), threads=1)

    async def run() -> None:
        session = await remote.open_session(pool_pb2.OpenSessionRequest(task_id="remote"))
        calls = [make_call(session.session_id, i) for i in range(4)]
        for call in calls:
            call.index = -1
        gate = threading.Event()
        remote.executor.submit(gate.wait, 60)          # the pool's one thread is taken: the writes need none
        appended = await asyncio.wait_for(asyncio.gather(*(remote.append_call(c) for c in calls)), 60)
        gate.set()
        assert sorted(appended) == [0, 1, 2, 3]
        with pytest.raises(Conflict, match="already recorded"):
            await remote.append_call(make_call(session.session_id, 0))
        closed = await remote.close_session(pool_pb2.CloseSessionRequest(session_id=session.session_id))
        assert closed.num_calls == 4
        stored = pool.get_session(session.session_id).calls
        assert sorted(list(c.completion_ids) for c in stored) == sorted(list(c.completion_ids) for c in calls)
        server.stop(0)
        with pytest.raises(PoolUnavailable, match="unreachable: UNAVAILABLE"):
            await remote.open_session(pool_pb2.OpenSessionRequest())

    try:
        asyncio.run(run())
    finally:
        remote.close()
        server.stop(0)
        pool.close()
