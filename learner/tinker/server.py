"""A forge-tinker process: the Tinker API over HTTP (aiohttp, on an event loop in a thread of its own, with
/metrics), its Stats over gRPC (``forge.v1.Tinker``), and a watch that ends sessions whose heartbeats stopped.
``TinkerServer`` is composed of a ``Training`` and an optional ``Sampling``; the command (``cli.py``) builds them
from the settings, a test may hand in its own."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

from forge.learner.tinker.app import make_app
from forge.learner.tinker.config import TinkerConfig
from forge.learner.tinker.routes_service import end_session
from forge.learner.tinker.state import TinkerState
from forge.learner.tinker.types import Sampling, Training
from forge.rpc import ServerOptions, ServiceBinding
from forge.rpc.server import GrpcServer, format_address, run_until_signal
from forge.telemetry import stats_report
from forge.v1 import common_pb2, tinker_pb2, tinker_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")


class TinkerServicer(tinker_pb2_grpc.TinkerServicer):
    def __init__(self, state: TinkerState, instance: str = "tinker") -> None:
        self.state = state
        self.instance = instance

    def Stats(self, request: common_pb2.StatsRequest, context: Any) -> common_pb2.StatsReport:
        return self.report()

    def report(self) -> common_pb2.StatsReport:
        labels = {"base_models": ",".join(self.state.config.base_models),
                  "sampling": "actors" if self.state.sampling is not None else "off"}
        return stats_report("tinker", self.instance, self.state.started, self.state.gauges(), labels)


class TinkerServer:
    def __init__(self, config: TinkerConfig, training: Training, sampling: Sampling | None = None) -> None:
        self.config = config
        self.state = TinkerState(config, training, sampling)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="tinker-loop", daemon=True)
        self._thread.start()
        self._stopped = threading.Event()
        self.servicer = TinkerServicer(self.state)
        self._runner: web.AppRunner | None = None
        self._watch: asyncio.Task | None = None
        try:
            self.port = self.run(self._start_http())
            binding = ServiceBinding.of(tinker_pb2_grpc.add_TinkerServicer_to_server, self.servicer, tinker_pb2,
                                        "Tinker")
            self.grpc = GrpcServer([binding], ServerOptions(host=config.host, port=config.grpc_port,
                                                            api_keys=config.api_keys))
        except BaseException:
            self._close_loop()
            raise
        self.servicer.instance = f"tinker-{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{format_address(self.config.host, self.port)}"

    @property
    def address(self) -> str:
        return self.grpc.address

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start_http(self) -> int:
        self._runner = web.AppRunner(make_app(self.state, self.servicer.report), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        self._watch = asyncio.get_running_loop().create_task(self._watch_sessions())
        return site._server.sockets[0].getsockname()[1]          # the bound port (0 picks one)

    async def _watch_sessions(self) -> None:
        every = min(30.0, max(0.05, self.config.session_timeout_s / 4))
        while True:
            await asyncio.sleep(every)
            for session in self.state.registry.expired(self.config.session_timeout_s):
                end_session(self.state, session, "expired")
            self.state.registry.forget_ended()
            self.state.futures.prune()

    def start(self) -> TinkerServer:
        self.grpc.start()
        log.info("Tinker API on %s/api/v1 (base models %s, sampling %s), Stats on %s", self.base_url,
                 ", ".join(self.config.base_models), "on" if self.state.sampling else "off", self.grpc.address)
        return self

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        started = time.monotonic()
        self.grpc.stop()
        try:
            self.run(self._stop_http(), timeout=30)
        except Exception as exc:
            log.warning("the HTTP server did not stop cleanly: %s", exc)
        self._close_loop()
        log.info("tinker server stopped in %.1f s", time.monotonic() - started)

    async def _stop_http(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        for entry in list(self.state.registry.models.values()):
            await entry.runner.close()
        await self.state.futures.close()
        if self.state.sampling is not None:
            await self.state.sampling.close()

    def _close_loop(self) -> None:
        self.state.close()
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self.loop.close()

    def run_until_signal(self, on_ready: Callable[[], None] | None = None) -> None:
        run_until_signal(self.start, self.stop, on_ready)
