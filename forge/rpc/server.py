"""Starting a gRPC server the Forge way: health service and server reflection on every server, loopback unless
told otherwise, optional API keys, undecodable requests refused as INVALID_ARGUMENT, and a graceful stop on SIGTERM
or SIGINT."""

from __future__ import annotations

import logging
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Self

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from forge.rpc import heap
from forge.rpc.auth import ApiKeyInterceptor
from forge.rpc.decoding import DecodeInterceptor

log = logging.getLogger(__name__)

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServiceBinding:
    """One gRPC service to serve: its full name (``forge.v1.Actor``) and how to add its servicer to a server."""

    name: str
    register: Callable[[grpc.Server], None]

    @classmethod
    def of(cls, add_to_server: Callable, servicer: object, descriptor_module: object, service: str) -> ServiceBinding:
        """From generated stubs, e.g. ``ServiceBinding.of(actor_pb2_grpc.add_ActorServicer_to_server, servicer,
        actor_pb2, "Actor")``."""
        name = descriptor_module.DESCRIPTOR.services_by_name[service].full_name
        return cls(name, lambda server: add_to_server(servicer, server))


@dataclass
class ServerOptions:
    host: str = LOOPBACK
    port: int = 0                              # 0 = any free port
    max_workers: int = 64                      # threads for calls (asyncio server: for plain-function handlers)
    max_message_bytes: int = 256 * 1024 * 1024
    grace_s: float = 5.0                       # how long in-flight calls may finish on stop
    api_keys: Sequence[str] = ()               # when set, every call but health checks needs one
    # Calls received but not yet taken up by the service, and how long one may wait so. An asyncio server takes up
    # one call per turn of its loop, so a burst on a busy actor waits in gRPC; gRPC's defaults cancel such calls
    # (bare CANCELLED, unseen by the service) past 1,000 waiting (at random; all past 3,000) or 30 s. The service's
    # own admission (an actor's --max-waiting) is the limit that answers with a reason; deadlines are the callers'.
    max_waiting_calls: int = 65_536
    unrequested_wait_s: int = 3600


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def check_port_free(host: str, port: int) -> None:
    """Raise OSError if ``host:port`` cannot be bound now: checked before a service loads anything heavy, so that a
    taken port is told at once, not after a model has loaded (port 0 always can)."""
    import socket

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as gRPC binds: TIME_WAIT is no obstacle
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            raise OSError(f"cannot listen on {format_address(host, port)}: {exc.strerror or exc}") from None


def channel_options(options: ServerOptions) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", options.max_message_bytes),
            ("grpc.max_send_message_length", options.max_message_bytes),
            ("grpc.so_reuseport", 0), ("grpc.server_max_unrequested_time_in_server", options.unrequested_wait_s),
            ("grpc.server.max_pending_requests", options.max_waiting_calls),
            ("grpc.server.max_pending_requests_hard_limit", options.max_waiting_calls)]


def register_and_bind(server: grpc.Server | grpc.aio.Server, services: list[ServiceBinding], health_servicer: object,
                      options: ServerOptions) -> int:
    """Add the services, health and reflection to ``server`` and bind it; returns the port (OSError if taken)."""
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in services:
        service.register(server)
    names = [s.name for s in services]
    reflection.enable_server_reflection((*names, HEALTH_SERVICE, reflection.SERVICE_NAME), server)
    address = format_address(options.host, options.port)
    try:
        return server.add_insecure_port(address)
    except RuntimeError as exc:   # grpc reports a failed bind this way
        raise OSError(f"cannot bind gRPC server to {address} (address in use or not local)") from exc


class ServerBase(ABC):
    """A Forge gRPC server (threaded or asyncio): ``port`` and ``address`` once bound, and around its own ``start``
    and ``stop``, serving until a signal and use as a context manager."""

    port: int
    address: str

    def __init__(self, services: Iterable[ServiceBinding], options: ServerOptions | None) -> None:
        self.options = options or ServerOptions()
        self.services = list(services)
        self._started = False
        self._stopped = threading.Event()          # set once stop has begun
        self._stop_lock = threading.Lock()

    def _interceptors(self, given: Sequence, api_key_interceptor: type, decode_interceptor: type) -> list:
        """``given`` behind the API-key check of ``options.api_keys`` (health checks exempt), if any; innermost,
        the decoding of each request (so that keys are checked before a request is read)."""
        chain = [*given, decode_interceptor()]
        if self.options.api_keys:
            chain.insert(0, api_key_interceptor(self.options.api_keys, exempt=(HEALTH_SERVICE,)))
        return chain

    def _serving(self) -> tuple[str, ...]:
        """The names health reports SERVING once started ("" is the server as a whole); logs that it serves."""
        log.info("serving %s on %s", ", ".join(s.name for s in self.services) or "health", self.address)
        return ("", *(s.name for s in self.services))

    def _begin_stop(self) -> bool:
        """True for the one caller that goes on to stop the server (a signal and a failing backend may race)."""
        with self._stop_lock:
            if self._stopped.is_set():
                return False
            self._stopped.set()
            return True

    @abstractmethod
    def start(self) -> Self: ...

    @abstractmethod
    def stop(self, grace_s: float | None = None) -> None:
        """Report NOT_SERVING, let in-flight calls finish for up to ``grace_s`` seconds, then stop."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops; True when ``timeout`` passed first (``grpc.Server``'s convention)."""

    def run_until_signal(self, on_stop: Callable[[], None] | None = None,
                         on_ready: Callable[[], None] | None = None,
                         on_leave: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT (main thread only), then stop gracefully and call ``on_stop``.
        ``on_ready`` runs once the server is serving and the signal handlers are in place; ``on_leave`` when the
        stop begins, while the server still serves (to withdraw an announcement before calls are refused)."""

        def stop() -> None:
            if on_leave:
                on_leave()
            self.stop()
            if on_stop:
                on_stop()

        run_until_signal(self.start, stop, on_ready, stopped=self._stopped)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(0)


class GrpcServer(ServerBase):
    """A running gRPC server; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, services: Iterable[ServiceBinding], options: ServerOptions | None = None,
                 interceptors: Sequence[grpc.ServerInterceptor] = ()) -> None:
        super().__init__(services, options)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.options.max_workers, thread_name_prefix="grpc"),
            interceptors=self._interceptors(interceptors, ApiKeyInterceptor, DecodeInterceptor),
            options=channel_options(self.options))
        self.health = health.HealthServicer()
        self.port = register_and_bind(self.server, self.services, self.health, self.options)
        self.address = format_address(self.options.host, self.port)

    def start(self) -> Self:
        if self._started:
            return self
        self._started = True
        self.server.start()
        for name in self._serving():
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def stop(self, grace_s: float | None = None) -> None:
        if not self._begin_stop():
            return
        self.health.enter_graceful_shutdown()
        self.server.stop(self.options.grace_s if grace_s is None else grace_s).wait()
        log.info("stopped serving on %s", self.address)

    def wait(self, timeout: float | None = None) -> bool:
        return self.server.wait_for_termination(timeout)


def run_until_signal(start: Callable[[], object], stop: Callable[[], None],
                     on_ready: Callable[[], None] | None = None, stopped: threading.Event | None = None) -> None:
    """Start, report ready, block until SIGTERM or SIGINT (or ``stopped`` is set), then stop; the previous signal
    handlers are restored afterwards. Call from the main thread."""
    received = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        received.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        start()
        heap.settle()
        if on_ready:
            on_ready()
        while not received.wait(0.5) and not (stopped and stopped.is_set()):
            pass
    finally:
        stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(services: Iterable[ServiceBinding], options: ServerOptions | None = None,
          interceptors: Sequence[grpc.ServerInterceptor] = ()) -> GrpcServer:
    """Build and start a server; stop it with ``.stop()`` or block in ``.run_until_signal()``."""
    return GrpcServer(services, options, interceptors).start()
