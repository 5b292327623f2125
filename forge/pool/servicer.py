"""The Pool gRPC service: every rpc of forge.v1.Pool over an in-process ``Pool``, with pool errors turned into
status codes (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ABORTED, RESOURCE_EXHAUSTED) and clear messages.

It runs on ``grpc.aio``: the writes that every gateway call makes (OpenSession, AppendCall, CloseSession) are
coroutines that wait on the writer's group-commit future on the event loop, holding no thread, so a busy service
spends its CPU on the calls and the commits rather than on a thread per waiting call; the other rpcs are plain
functions, run in the server's threads."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from forge.pool.errors import PoolError, status_code
from forge.pool.pool import Pool
from forge.rpc import ServerOptions, ServiceBinding
from forge.rpc.aio_server import AioGrpcServer
from forge.telemetry import stats_report
from forge.v1 import common_pb2, pool_pb2, pool_pb2_grpc

log = logging.getLogger(__name__)


def _status(method: Callable, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status an rpc's failure answers with: a pool error's own, else INTERNAL (and logged)."""
    if isinstance(exc, PoolError):
        return status_code(exc), str(exc)
    log.exception("Pool.%s failed", method.__name__)
    return grpc.StatusCode.INTERNAL, f"{method.__name__} failed: {exc}"


def _guarded(method: Callable) -> Callable:
    """Run an rpc (a coroutine, or a plain function run in the server's threads), answering pool errors and any
    unexpected failure with a status instead of a crash."""
    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def run_async(self: PoolServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await method(self, request, context)
            except Exception as exc:
                await context.abort(*_status(method, exc))

        return run_async

    @functools.wraps(method)
    def run(self: PoolServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Exception as exc:
            context.abort(*_status(method, exc))

    return run


class PoolServicer(pool_pb2_grpc.PoolServicer):
    """``max_fetch_bytes``: the largest Fetch response (the server's message limit; ``serve_pool`` sets it): a fetch
    answers with the leading entries that fit, and the client fetches again for the others."""

    def __init__(self, pool: Pool, instance: str = "pool", max_fetch_bytes: int = 0) -> None:
        self.pool = pool
        self.instance = instance
        self.max_fetch_bytes = max_fetch_bytes
        self.started = time.time()

    @_guarded
    async def OpenSession(self, request, context):
        return await asyncio.wrap_future(self.pool.open_session_async(request))

    @_guarded
    async def AppendCall(self, request, context):
        return pool_pb2.AppendCallResponse(index=await asyncio.wrap_future(self.pool.append_call_async(request)))

    @_guarded
    def AddProcessReward(self, request, context):
        self.pool.add_process_reward(request.session_id, request.call_index, request.reward)
        return pool_pb2.AddProcessRewardResponse()

    @_guarded
    async def CloseSession(self, request, context):
        return await asyncio.wrap_future(self.pool.close_session_async(request))

    @_guarded
    def Fetch(self, request, context):
        return self.pool.fetch(request.window, request.max_entries, request.include_calls, self.max_fetch_bytes)

    @_guarded
    def Consume(self, request, context):
        expected = request.expected_seq if request.HasField("expected_seq") else None
        cursor = self.pool.consume(request.positions, request.failed, expected, request.commit)
        return pool_pb2.ConsumeResponse(head=cursor.head, cursor=cursor)

    @_guarded
    def GetSession(self, request, context):
        return self.pool.get_session(request.session_id)

    @_guarded
    def GetCursor(self, request, context):
        return self.pool.cursor()

    @_guarded
    def CommitCursor(self, request, context):
        return self.pool.commit_cursor(request.seq)

    @_guarded
    def RewindCursor(self, request, context):
        return self.pool.rewind(request.seq)

    @_guarded
    def ExpireSessions(self, request, context):
        return pool_pb2.ExpireSessionsResponse(session_ids=self.pool.expire_sessions(request.idle_s))

    @_guarded
    def Stats(self, request, context):
        return self.report()

    def report(self) -> common_pb2.StatsReport:
        """What Stats answers (and a Prometheus scrape reads)."""
        return stats_report("pool", self.instance, self.started, self.pool.stats(), {"path": str(self.pool.path)})


def pool_binding(servicer: PoolServicer) -> ServiceBinding:
    return ServiceBinding.of(pool_pb2_grpc.add_PoolServicer_to_server, servicer, pool_pb2, "Pool")


def serve_pool(pool: Pool, options: ServerOptions | None = None, servicer: PoolServicer | None = None
               ) -> AioGrpcServer:
    """A started gRPC server for ``pool`` (loopback and any free port unless ``options`` say otherwise), through
    ``servicer`` when given (a servicer of ``pool``)."""
    options = options or ServerOptions()
    servicer = servicer or PoolServicer(pool)
    servicer.max_fetch_bytes = options.max_message_bytes
    server = AioGrpcServer([pool_binding(servicer)], options)
    servicer.instance = server.address
    return server.start()
