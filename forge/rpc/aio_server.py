"""A gRPC server on ``grpc.aio`` for services whose calls mostly wait, such as many long token streams: one event
loop serves every stream, where the threaded server spends a pool thread per open call (so at most ``max_workers``
calls run, and the rest, health checks included, queue behind them) and two thread handoffs per message.

It keeps ``GrpcServer``'s behaviour and interface (health, reflection, loopback by default, API keys, graceful stop,
``run_until_signal``) and runs its event loop in a thread of its own, so the code around it stays synchronous, or
on a loop the caller already runs in a thread (the gateway's, so that its handlers share the loop with the rest of
its work). Handlers written as coroutines run on the loop; handlers written as plain functions (a blocking
``Stats``, say) run in a pool of ``max_workers`` threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine, Iterable, Sequence
from concurrent import futures
from typing import Any, Self, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2

from forge.rpc.auth import AioApiKeyInterceptor
from forge.rpc.decoding import AioDecodeInterceptor
from forge.rpc.server import (
    ServerBase,
    ServerOptions,
    ServiceBinding,
    channel_options,
    format_address,
    register_and_bind,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class AioGrpcServer(ServerBase):
    """A running ``grpc.aio`` server; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, services: Iterable[ServiceBinding], options: ServerOptions | None = None,
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``loop``: an event loop already running in another thread, to serve on (it stays the caller's)."""
        super().__init__(services, options)
        self._terminated = threading.Event()
        self._pool: futures.ThreadPoolExecutor | None = None
        self._loop = loop or asyncio.new_event_loop()
        self._thread: threading.Thread | None = None        # the loop's, when the server runs its own
        if loop is None:
            self._thread = threading.Thread(target=self._loop.run_forever, name="grpc-aio", daemon=True)
            self._thread.start()
        try:
            self.port = self._run(self._build(interceptors))
        except BaseException:
            self._release()
            raise
        self.address = format_address(self.options.host, self.port)

    async def _build(self, interceptors: Sequence[grpc.aio.ServerInterceptor]) -> int:
        self._pool = futures.ThreadPoolExecutor(max_workers=self.options.max_workers, thread_name_prefix="grpc")
        self.server = grpc.aio.server(migration_thread_pool=self._pool,
                                      interceptors=self._interceptors(interceptors, AioApiKeyInterceptor,
                                                                        AioDecodeInterceptor),
                                      options=channel_options(self.options))
        self.health = health.aio.HealthServicer()
        return register_and_bind(self.server, self.services, self.health, self.options)

    def start(self) -> Self:
        if self._started:
            return self
        self._started = True
        self._run(self._start())
        return self

    async def _start(self) -> None:
        await self.server.start()
        for name in self._serving():
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float | None = None) -> None:
        """Report NOT_SERVING, let in-flight calls finish for up to ``grace_s`` seconds, then stop (calls still open
        are cancelled, which runs their handlers' cleanup)."""
        if not self._begin_stop():
            return
        grace = self.options.grace_s if grace_s is None else grace_s
        try:
            if self._started:
                self._run(self._stop(grace))
        finally:
            self._release()
            self._terminated.set()
        log.info("stopped serving on %s", self.address)

    async def _stop(self, grace_s: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)

    def wait(self, timeout: float | None = None) -> bool:
        return not self._terminated.wait(timeout)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coroutine.close()
            raise RuntimeError("AioGrpcServer's blocking methods cannot be called from its own event loop")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _release(self) -> None:
        """Stop the loop if it is the server's own, and the thread pool."""
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            if not self._thread.is_alive():
                self._loop.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
