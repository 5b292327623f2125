"""The engine core: the torch engine in a process of its own, driven by an ``EngineProcess`` front over ZeroMQ.

A gRPC server holds the GIL for every message it builds and sends, and the engine's loop needs
the same GIL between its torch ops; at 32 concurrent streams the server delivered two thirds of what its engine
decodes in process. Here the loop has a process (and an interpreter) to itself, as in vLLM's engine core, and the
front keeps only the requests' streams.

Wire (two ipc sockets in a private directory, pickled tuples: both ends are this program, run by one user):

- front → core (PUSH/PULL): ``("spec", EngineSpec)`` first; then ``("submit", GenerationRequest)``,
  ``("abort", request_id)``, ``("call", call_id, method, args)`` and ``("close",)``.
- core → front (PUSH/PULL): ``("ready", CoreInfo)`` or ``("failed", reason)``; ``("out", chunks, version)``
  after each loop pass that produced chunks or a new weight version, ``chunks`` being ``[(request_id,
  TokenChunk)]`` in order; ``("reply", call_id, ok, value)`` for each call, ``value`` being the error text when
  not ``ok``.

The core exits when told to close, when its front's process goes away, or when the engine cannot be built.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import zmq

from forge.actors.backend import FinishReason, GenerationRequest, RequestStream, TokenChunk
from forge.actors.config import AdapterLink, EngineConfig
from forge.actors.engine.cpu_threads import reserve_cpu_threads
from forge.actors.engine.engine import TorchEngine
from forge.actors.limits import RequestLimits
from forge.cli.options import settings_command
from forge.settings import Settings, setting
from forge.weights.curve import ClientKeys, ServerKeys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSpec:
    """Everything the core needs to build its engine: the model, the engine's configuration and its links."""

    model: str = "tiny"                     # a checkpoint directory or 'tiny' (see forge.actors.engine.policy.load_policy)
    device: str = "cpu"
    dtype: str = "float32"
    config: EngineConfig = field(default_factory=EngineConfig)
    initial_version: int = 0
    weights_fetch: str | None = None        # subscribe to the learner's weights here, inside the core
    weights_announce: str | None = None
    weights_curve: ClientKeys | None = None  # the weight channel's CURVE keys (the secret never shows in a repr)
    relay_fetch: str | None = None          # re-serve every verified version to other actors here (bound by the core)
    relay_announce: str | None = None
    relay_curve: ServerKeys | None = None    # the relay's CURVE keys: this actor's pair and the clients it serves
    l3_cache: str | None = None             # the L3 cache's servers, joined from the core (implies kv_events)
    l3_fetch: str = "auto"
    l3_api_key: str | None = field(default=None, repr=False)
    kv_events: bool = False                 # keep a KV event log for routers (EngineProcess.kv_events)
    adapters: tuple[AdapterLink, ...] = ()  # named adapters (other runs' learners) followed inside the core
    adapter_curves: dict[str, ClientKeys] = field(default_factory=dict)    # their streams' CURVE keys, by name
    log_level: str = "INFO"


@dataclass(frozen=True)
class CoreInfo:
    """What the core tells its front once the engine is up."""

    limits: RequestLimits
    weight_shapes: dict[str, tuple[int, ...]]
    weight_version: int
    model_id: str
    pid: int
    relay_fetch: str | None = None          # the relay's bound endpoints (a * port resolved), when relaying
    relay_announce: str | None = None
    adapter_versions: dict[str, int] = field(default_factory=dict)   # named adapters served when it was sent


class _OutboxStream(RequestStream):
    def __init__(self, request_id: str, outbox: _Outbox) -> None:
        super().__init__(request_id)
        self._outbox = outbox

    def put(self, chunk: TokenChunk) -> None:
        self._outbox.put(self.request_id, chunk)


class _Outbox:
    """Chunks put by the engine (loop thread, or a closing thread), sent together after each loop pass; nothing
    before the ready message (``open``), which the front reads first: the loop may pass before it is sent (an
    adapter version installed while the core starts), and what changed then goes in the ready message itself."""

    def __init__(self, send: Callable[[tuple], None], versions: Callable[[], tuple[int, dict[str, int]]]) -> None:
        """``versions``: the engine's weight version and its adapters' (sent whenever they change)."""
        self._send = send
        self._versions = versions
        self._lock = threading.Lock()
        self._chunks: list[tuple[str, TokenChunk]] = []
        self._sent_versions: tuple[int, dict[str, int]] | None = None
        self._open = False

    def stream(self, request_id: str) -> RequestStream:
        return _OutboxStream(request_id, self)

    def put(self, request_id: str, chunk: TokenChunk) -> None:
        with self._lock:
            self._chunks.append((request_id, chunk))

    def open(self, ready: Callable[[int, dict[str, int]], tuple]) -> None:
        """Send ``ready(weight version, adapter versions)`` as of now, then let every later pass flush."""
        with self._lock:
            versions = self._versions()
            self._send(ready(*versions))
            self._sent_versions, self._open = versions, True

    def flush(self) -> None:
        with self._lock:
            if not self._open:
                return
            chunks, self._chunks = self._chunks, []
            versions = self._versions()
            if chunks or versions != self._sent_versions:
                self._sent_versions = versions
                self._send(("out", chunks, *versions))


class EngineCore:
    def __init__(self, commands: str, outputs: str) -> None:
        self._context = zmq.Context()
        self._pull = self._context.socket(zmq.PULL)
        self._pull.connect(commands)
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 5000)
        self._push.connect(outputs)
        self._send_lock = threading.Lock()
        self.spec = EngineSpec()
        self.engine: TorchEngine | None = None
        self.outbox: _Outbox | None = None
        self.connector = None
        self.subscriber = None
        self.adapter_subscribers: list = []
        self.relay = None

    def send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._push.send(data, copy=False)

    def receive_spec(self, timeout_s: float = 60.0) -> EngineSpec:
        if not self._pull.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no engine spec arrived from the front within {timeout_s:.0f} s")
        kind, spec = pickle.loads(self._pull.recv())
        if kind != "spec" or not isinstance(spec, EngineSpec):
            raise ValueError(f"expected the engine spec first, got {kind!r}")
        self.spec = spec
        return spec

    def build(self) -> None:
        from forge.actors.engine.policy import grammars_of, load_policy

        spec = self.spec
        threads = reserve_cpu_threads(spec.config.threads)     # before any torch work (see reserve_cpu_threads)
        model, model_id = load_policy(spec.model, spec.device, spec.dtype)
        config = spec.config if spec.config.model_id != "model" else replace(spec.config, model_id=model_id)
        engine = TorchEngine(model, replace(config, threads=threads), initial_version=spec.initial_version,
                             grammars=grammars_of(spec.model, model))
        outbox = _Outbox(self.send, lambda: (engine.weight_version, engine.adapter_versions))
        engine.stream_factory = outbox.stream
        engine.after_pass = outbox.flush
        self.engine, self.outbox = engine, outbox
        if spec.kv_events or spec.l3_cache:
            from forge.actors.engine.l3 import kv_connector

            self.connector = kv_connector(engine, spec.l3_cache, spec.l3_fetch, spec.l3_api_key)
        if spec.weights_fetch and spec.relay_fetch and spec.relay_announce:
            from forge.actors.weights_link import weight_relay

            self.relay = weight_relay(spec.relay_fetch, spec.relay_announce, spec.relay_curve)
        if spec.weights_fetch:
            from forge.actors.weights_link import weight_subscriber

            self.subscriber = weight_subscriber(engine, spec.weights_fetch, spec.weights_announce,
                                                spec.weights_curve, self.relay)
        if spec.adapters:
            from forge.actors.weights_link import weight_subscriber

            self.adapter_subscribers = [weight_subscriber(engine, link.fetch, link.announce,
                                                          spec.adapter_curves.get(link.name), adapter=link.name)
                                        for link in spec.adapters]
        shapes = {name: tuple(t.shape) for name, t in engine.model.state_dict().items()}
        relay = self.relay
        outbox.open(lambda version, adapters: ("ready", CoreInfo(
            engine.limits(), shapes, version, engine.config.model_id, os.getpid(),
            relay.fetch_endpoint if relay else None, relay.announce_endpoint if relay else None, dict(adapters))))

    def serve(self, parent: int) -> None:
        """Handle the front's commands until it closes us or goes away."""
        engine = self.engine
        assert engine is not None
        while True:
            if not self._pull.poll(1000):
                if os.getppid() != parent:
                    log.warning("the engine's front process went away; closing")
                    return
                continue
            message = pickle.loads(self._pull.recv(copy=False).buffer)
            kind = message[0]
            if kind == "submit":
                self._submit(message[1])
            elif kind == "abort":
                engine.abort(message[1])
            elif kind == "call":
                self._call(*message[1:])
            elif kind == "close":
                return
            else:
                log.error("unknown command %r from the front", kind)

    def _submit(self, request: GenerationRequest) -> None:
        try:
            self.engine.submit(request)
        except Exception as exc:            # the front checked the request already; this is a race or a bug
            chunk = TokenChunk(finish_reason=FinishReason.ERROR, error=str(exc))
            self.send(("out", [(request.request_id, chunk)], self.engine.weight_version,
                       self.engine.adapter_versions))

    def _call(self, call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            value = self._dispatch(method, args)
        except Exception as exc:
            self.send(("reply", call_id, False, f"{type(exc).__name__}: {exc}"))
        else:
            self.send(("reply", call_id, True, value))

    def _dispatch(self, method: str, args: tuple[Any, ...]) -> Any:
        engine = self.engine
        if method == "stats":
            return {**engine.stats(), **(self.relay.figures() if self.relay is not None else {})}
        if method == "load_weights":
            from safetensors.torch import load

            version, data = args
            engine.load_weights(version, load(data))
            return None
        if method == "load_adapter":
            from safetensors.torch import load

            name, version, data = args
            engine.load_adapter(name, version, load(data))
            return None
        if method == "unload_adapter":
            engine.unload_adapter(*args)
            return None
        if method == "poll_kv_events":
            if self.connector is None:
                raise RuntimeError("this engine keeps no KV events")
            return self.connector.events.poll(*args).SerializeToString()
        if method == "describe_kv":
            if self.connector is None:
                raise RuntimeError("this engine keeps no KV events")
            layout, figures = self.connector.describe()
            return layout.SerializeToString(), figures
        raise ValueError(f"unknown call {method!r}")

    def close(self) -> None:
        for subscriber in [self.subscriber, *self.adapter_subscribers]:
            if subscriber is not None:
                subscriber.close()
        if self.relay is not None:
            self.relay.close()
        if self.engine is not None:
            self.engine.close()             # ends what is still running with ABORT
            self.outbox.flush()
            if self.connector is not None:
                self.connector.close()
        self._pull.close(linger=0)
        self._push.close()                  # lingers until the last chunks are out
        self._context.term()


@dataclass(frozen=True, kw_only=True)
class CoreLinks(Settings):
    commands: str = setting(help="ZeroMQ endpoint the front pushes commands to.")
    outputs: str = setting(help="ZeroMQ endpoint the core pushes chunks and replies to.")
    parent: int = setting(min=1, help="The front's pid; the core exits when it goes away.")


@settings_command("engine-core", CoreLinks)
def main(links: CoreLinks) -> None:
    """Run one engine core for an EngineProcess front (started by it; not meant to be run by hand)."""
    from forge.cli.common import setup_logging

    for signum in (signal.SIGINT, signal.SIGTERM):      # sent to the front's process group: the front closes us
        signal.signal(signum, signal.SIG_IGN)
    core = EngineCore(links.commands, links.outputs)
    try:
        spec = core.receive_spec()
    except (TimeoutError, ValueError) as exc:
        core.close()
        sys.exit(str(exc))
    setup_logging(spec.log_level)
    try:
        core.build()
    except BaseException as exc:
        log.exception("the engine could not be built")
        core.send(("failed", f"{type(exc).__name__}: {exc}"))
        core.close()
        sys.exit(1)
    try:
        core.serve(links.parent)
    finally:
        core.close()


if __name__ == "__main__":     # run through the module's own name, so that the pickled EngineSpec is this class
    from forge.actors.engine import core

    core.main()
