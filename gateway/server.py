"""A gateway process: the pool, and one event loop in a thread of its own that serves both front ends (HTTP and
gRPC) and runs the actor streams and sessions; a graceful stop: both servers stop accepting at once, in-flight calls
finish (bounded by the grace period), then the pool is closed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from forge.gateway.config import GatewayConfig
from forge.gateway.http.app import HttpFrontEnd
from forge.gateway.loop_thread import LoopThread
from forge.gateway.modelinfo import ModelInfo
from forge.gateway.service import Gateway
from forge.gateway.servicer import GatewayServicer, key_interceptor
from forge.rpc import ServerOptions, ServiceBinding
from forge.rpc.aio_server import AioGrpcServer
from forge.rpc.server import run_until_signal
from forge.v1 import gateway_pb2, gateway_pb2_grpc, pool_pb2

log = logging.getLogger(__name__)


def open_pool(config: GatewayConfig) -> Any:
    """The pool for ``config``: the LMDB directory in this process, or a client of a Pool service."""
    if bool(config.pool_path) == bool(config.pool_address):
        raise ValueError("give exactly one of a pool path and a pool address")
    if config.pool_path:
        from forge.pool import Pool

        return Pool(config.pool_path)
    import grpc

    from forge.pool import PoolClient

    client = PoolClient(config.pool_address, api_key=config.pool_api_key)
    try:
        client.stub.GetCursor(pool_pb2.GetCursorRequest(), timeout=10)
    except grpc.RpcError as exc:
        client.close()
        raise ConnectionError(f"the pool service at {config.pool_address} does not answer: "
                              f"{exc.code().name}: {exc.details()}") from exc
    return client


class GatewayServer:
    def __init__(self, config: GatewayConfig, pool: Any | None = None) -> None:
        self.config = config
        model = ModelInfo.load(config.model)
        self.pool = pool if pool is not None else open_pool(config)
        self.loop = LoopThread()
        self.gateway = Gateway(config, self.pool, model)
        self.http = HttpFrontEnd(self.gateway, config.max_body_bytes, config.shutdown_grace_s)
        self._stopped = threading.Event()
        try:
            self.loop.run(self.gateway.start())
            self.gateway.http_url = self.loop.run(self.http.start(config.host, config.http_port))
            interceptors = [key_interceptor(self.gateway.policy)] if self.gateway.keys.required else []
            binding = ServiceBinding.of(gateway_pb2_grpc.add_GatewayServicer_to_server,
                                        GatewayServicer(self.gateway), gateway_pb2, "Gateway")
            options = ServerOptions(host=config.host, port=config.grpc_port, grace_s=config.shutdown_grace_s)
            self.grpc = AioGrpcServer([binding], options, interceptors, loop=self.loop.loop)
        except BaseException:
            self._close_rest()
            raise
        self.gateway.grpc_address = self.grpc.address
        self.gateway.instance = f"gateway-{self.grpc.port}"

    @property
    def grpc_address(self) -> str:
        return self.grpc.address

    @property
    def http_url(self) -> str:
        return self.gateway.http_url

    def start(self) -> GatewayServer:
        self.grpc.start()
        actors = self.gateway.actors
        watching = f", watching {self.config.actors_dir} for more" if self.config.actors_dir is not None else ""
        log.info("gateway serving gRPC on %s and OpenAI HTTP on %s/v1 (%d actors%s, router %s)", self.grpc.address,
                 self.http_url, len(actors.actors) + len(actors.prefill.actors), watching, self.config.router)
        return self

    def stop(self) -> None:
        """Stop accepting on both servers, let in-flight calls finish (up to the grace period), close the pool."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        started = time.monotonic()
        stopper = threading.Thread(target=self.grpc.stop, name="grpc-stop")
        stopper.start()
        try:
            self.loop.run(self.http.stop(), timeout=self.config.shutdown_grace_s + 10)
        except Exception as exc:
            log.warning("HTTP server did not stop cleanly: %s", exc)
        stopper.join()
        self._close_rest()
        log.info("gateway stopped in %.1f s", time.monotonic() - started)

    def _close_rest(self) -> None:
        try:
            self.loop.run(self.gateway.close(), timeout=10)
        except Exception as exc:
            log.warning("closing the actor channels failed: %s", exc)
        self.loop.stop()
        self.gateway.pool.close()

    def run_until_signal(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT (main thread), then stop gracefully. ``on_ready`` runs once both servers
        serve and the signal handlers are in place."""
        run_until_signal(self.start, self.stop, on_ready)
