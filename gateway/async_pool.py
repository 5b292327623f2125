"""The pool from the gateway's event loop: an in-process ``Pool`` or a remote ``PoolClient`` behind coroutines.
Blocking calls run on a dedicated thread pool; the writes of sessions and calls are awaited on futures directly (an
in-process pool's group commit, a remote pool's gRPC call): no thread each, and as many at once as come. Every
failure comes out as a ``GatewayError``."""

from __future__ import annotations

import asyncio
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from forge.gateway.errors import from_pool_error
from forge.pool import PoolError
from forge.v1 import pool_pb2

log = logging.getLogger(__name__)


class AsyncPool:
    def __init__(self, pool: Any, threads: int = 64) -> None:
        self.pool = pool
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gateway-pool")

    async def _run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, functools.partial(getattr(self.pool, method), *args,
                                                                               **kwargs))
        except (PoolError, grpc.RpcError) as exc:
            raise from_pool_error(exc) from exc

    async def _write(self, method: str, *args: Any) -> Any:
        """``method``: on the pool's group-commit future where it has one (``method_async``), else in a thread."""
        submit = getattr(self.pool, f"{method}_async", None)
        if submit is None:
            return await self._run(method, *args)
        try:
            return await asyncio.wrap_future(submit(*args))
        except (PoolError, grpc.RpcError) as exc:
            raise from_pool_error(exc) from exc

    async def append_call(self, record: pool_pb2.CallRecord) -> int:
        return await self._write("append_call", record)

    async def open_session(self, request: pool_pb2.OpenSessionRequest) -> pool_pb2.SessionRecord:
        return await self._write("open_session", request)

    async def close_session(self, request: pool_pb2.CloseSessionRequest) -> pool_pb2.SessionRecord:
        return await self._write("close_session", request)

    async def add_process_reward(self, session_id: str, call_index: int, reward: float) -> None:
        await self._run("add_process_reward", session_id, call_index, reward)

    async def get_session(self, session_id: str) -> pool_pb2.SessionWithCalls:
        return await self._run("get_session", session_id)

    async def expire_sessions(self, older_than_s: float) -> list[str]:
        return await self._run("expire_sessions", older_than_s)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.pool.close()
