"""``forge-actor``: serve token generation from a checkpoint over gRPC. The command is the actor process's
composition root: its settings (``ActorConfig``) in; the backend its factory builds (``forge.actors.factory``), its
weight subscription (and the relay that re-serves it to other actors) and the server out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from forge.actors.backend import Serving, StartContext
from forge.actors.config import ActorConfig
from forge.actors.factory import factory_for
from forge.actors.kinds import pick_backend
from forge.actors.weights_link import weight_relay, weight_subscriber
from forge.cli.common import (
    check_port_option,
    entry_point,
    reachable_address,
    remove_ready_file,
    setup_logging,
    start_metrics,
    write_ready_file,
)
from forge.cli.options import settings_command

log = logging.getLogger("forge.actor")


def _read_keys(flag: str, read: Callable[[], Any]) -> Any:
    """``read()``, CURVE key files read before the model loads (the settings checked them already: this read is the
    one used, so a file changed since is refused too); a file it refuses is a bad ``flag``."""
    from forge.weights.curve import KeyFileError

    try:
        return read()
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{flag}'") from None


def _curve_keys(config: ActorConfig):
    """The weight channel's CURVE keys."""
    if config.weights_key is None or config.weights_server_key is None:
        return None
    from forge.weights.curve import client_keys

    return _read_keys("--weights-key", lambda: client_keys(config.weights_key, config.weights_server_key))


def _adapter_keys(config: ActorConfig) -> dict[str, Any]:
    """Each adapter stream's CURVE keys (this actor's pair, that run's learner's certificate); none without
    --weights-key."""
    if config.weights_key is None:
        return {}
    from forge.weights.curve import client_keys

    return _read_keys("--adapter", lambda: {link.name: client_keys(config.weights_key, link.server_key)
                                            for link in config.adapter_links})


def _source_keys(config: ActorConfig):
    """The adapter source's CURVE keys (this actor's pair, the publisher's certificate); none without --weights-key."""
    source = config.source_link
    if source is None or config.weights_key is None:
        return None
    from forge.weights.curve import client_keys

    return _read_keys("--adapter-source", lambda: client_keys(config.weights_key, source.server_key))


def _relay_keys(config: ActorConfig):
    """The relay's CURVE keys (this actor's key pair and the clients it serves)."""
    if config.relay_clients is None or config.weights_key is None:
        return None
    from forge.weights.curve import server_keys

    return _read_keys("--relay-clients", lambda: server_keys(config.weights_key, config.relay_clients))


def _check_relay_endpoints(config: ActorConfig) -> None:
    """Refuse a relay endpoint whose TCP port is taken now, before anything heavy loads (one line, exit 2)."""
    import ipaddress

    from forge.rpc.server import check_port_free

    for option, endpoint in (("--relay-fetch", config.relay_fetch), ("--relay-announce", config.relay_announce)):
        if endpoint is None or not endpoint.startswith("tcp://"):
            continue
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        host = {"*": "0.0.0.0", "localhost": "127.0.0.1"}.get(host, host)
        try:
            ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            continue                    # an interface name: ZeroMQ resolves it when the relay binds
        if port == "*":
            continue
        try:
            check_port_free(host, int(port))
        except OSError as exc:
            raise click.BadParameter(f"{exc} (another service there? port * picks a free one)",
                                     param_hint=f"'{option}'") from None


def _context(config: ActorConfig, threads: int, on_exit) -> StartContext:
    """What the backend is built with: the device, the first version it serves, the weight channel's keys."""
    import torch

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return StartContext(device=device, threads=threads,
                        initial_version=-1 if config.weights_fetch else 0,   # every token carries a learner version
                        curve=_curve_keys(config), relay_curve=_relay_keys(config), adapter_curves=_adapter_keys(config),
                        source_curve=_source_keys(config),
                        relaying=config.weights_fetch is not None and config.relay_fetch is not None,
                        on_exit=on_exit)


@dataclass
class Parts:
    """The actor's parts, closed in reverse order of their start."""

    serving: Serving
    subscriber: Any = None
    adapter_subscribers: list = field(default_factory=list)
    source_subscriber: Any = None                       # the adapter source's, and what it feeds (its gauges)
    source: Any = None
    relay: Any = None
    metrics: Any = None
    servers: list = field(default_factory=list)         # stopped if the engine process dies
    grammars: Any = None                                # the grammar sandbox (forge.structured.sandbox)

    def close(self) -> None:
        for part in (self.metrics, self.subscriber, *self.adapter_subscribers, self.source_subscriber, self.relay,
                     self.grammars):
            if part is not None:
                part.close()
        self.serving.backend.close()


def _follow_weights(config: ActorConfig, context: StartContext, parts: Parts) -> None:
    """Subscribe to the learner's weights (unless the backend does), relay them, and wait for the first version."""
    backend = parts.serving.backend
    if not parts.serving.follows_weights:
        if context.relaying:
            try:
                parts.relay = weight_relay(config.relay_fetch, config.relay_announce, context.relay_curve)
            except (OSError, ValueError, RuntimeError) as exc:     # taken since the check at start
                parts.close()
                raise click.ClickException(f"cannot start the weight relay: {exc}") from None
            parts.serving.relay_endpoints = {"relay_fetch": parts.relay.fetch_endpoint,
                                             "relay_announce": parts.relay.announce_endpoint}
        parts.subscriber = weight_subscriber(backend, config.weights_fetch, config.weights_announce, context.curve,
                                             parts.relay)
    log.info("waiting for the learner's first weight version on %s", config.weights_fetch)
    deadline = time.monotonic() + config.first_version_timeout
    while backend.weight_version < 0:
        if time.monotonic() > deadline:
            refused = parts.subscriber.stats.handshake_error if parts.subscriber is not None else ""
            parts.close()
            raise click.ClickException(f"no weight version arrived from {config.weights_fetch} within "
                                       f"{config.first_version_timeout:.0f} s"
                                       + (f" (the handshake failed: {refused})" if refused else ""))
        time.sleep(0.05)


def _follow_adapters(config: ActorConfig, context: StartContext, parts: Parts) -> None:
    """Subscribe to the named adapters' learners (unless the backend does) and wait for the first version of each."""
    backend = parts.serving.backend
    links = config.adapter_links
    if not parts.serving.follows_weights:
        parts.adapter_subscribers = [weight_subscriber(backend, link.fetch, link.announce,
                                                       context.adapter_curves.get(link.name), adapter=link.name)
                                     for link in links]
    log.info("waiting for the first version of adapters %s", ", ".join(link.name for link in links))
    deadline = time.monotonic() + config.first_version_timeout
    while missing := [link for link in links if link.name not in backend.adapter_versions]:
        if time.monotonic() > deadline:
            parts.close()
            raise click.ClickException(f"no version of adapter {missing[0].name} arrived from {missing[0].fetch} "
                                       f"within {config.first_version_timeout:.0f} s")
        time.sleep(0.05)


def _follow_source(config: ActorConfig, context: StartContext, parts: Parts) -> None:
    """Follow the adapter source: the named adapters its publisher adds and drops at run time (none need be there to
    start)."""
    from forge.actors.adapter_source import follow_source

    source = config.source_link
    parts.source_subscriber, parts.source = follow_source(parts.serving.backend, source.fetch, source.announce,
                                                          config.source_adapters, context.source_curve,
                                                          reserved=[link.name for link in config.adapter_links])
    log.info("following the adapter source on %s (up to %d adapters)", source.fetch, config.source_adapters)


def _figures(parts: Parts):
    """More Stats gauges beside the backend's: the relay's and the adapter source's (None: neither)."""
    sources = [part.figures for part in (parts.relay, parts.source) if part is not None]
    if not sources:
        return None
    return lambda: {name: value for figures in sources for name, value in figures().items()}


def _grammar_sandbox(config: ActorConfig):
    """Where requests' grammars are compiled first (forge.structured.sandbox); None for a model without a
    tokenizer.json."""
    from forge.checkpoints import resolve_model
    from forge.structured.sandbox import GrammarSandbox, SandboxSpec

    spec = SandboxSpec.of_checkpoint(resolve_model(config.model).directory, config.grammar_memory_mb,
                                     config.grammar_timeout_s)
    return None if spec is None else GrammarSandbox(spec)


def _serve(config: ActorConfig, context: StartContext, parts: Parts) -> None:
    """Serve the Actor service (and the backend's KV events) until a signal, announcing it in the ready file."""
    from forge.actors.servicer import ActorServicer
    from forge.rpc import ServerOptions, ServiceBinding
    from forge.rpc.aio_server import AioGrpcServer
    from forge.v1 import actor_pb2, actor_pb2_grpc

    serving = parts.serving
    servicer = ActorServicer(serving.backend, config.name or "actor",
                             {"model": serving.model_id, "device": context.device}, config.role,
                             figures=_figures(parts),
                             grammars=_grammar_sandbox(config))
    parts.grammars = servicer.grammars
    bindings = [ServiceBinding.of(actor_pb2_grpc.add_ActorServicer_to_server, servicer, actor_pb2, "Actor")]
    event_source = None
    if serving.kv_events is not None:
        from forge.kv.events import KVEventSourceServicer
        from forge.v1 import router_pb2, router_pb2_grpc

        event_source = KVEventSourceServicer(*serving.kv_events)
        bindings.append(ServiceBinding.of(router_pb2_grpc.add_KVEventSourceServicer_to_server, event_source,
                                          router_pb2, "KVEventSource"))
    try:
        server = AioGrpcServer(bindings, ServerOptions(host=config.host, port=config.port, api_keys=config.api_keys))
    except OSError as exc:             # taken since the check at start
        parts.close()
        raise click.ClickException(str(exc)) from None
    parts.servers.append(server)
    if serving.backend.failed:
        parts.close()
        raise ENGINE_GONE
    servicer.instance = config.name or f"actor-{server.port}"
    if event_source is not None:
        event_source.instance = servicer.instance
    parts.metrics = start_metrics(servicer.report, config.host, config.metrics_port, config.api_keys,
                                  on_failure=parts.close)

    def ready() -> None:
        relay = serving.relay_endpoints
        log.info("actor %s serving %s on %s (device %s)", servicer.instance, serving.model_id, server.address,
                 context.device)
        if relay:
            log.info("actor %s relays its weight versions on fetch %s, announce %s", servicer.instance,
                     relay["relay_fetch"], relay["relay_announce"])
        if config.ready_file:
            write_ready_file(config.ready_file, address=reachable_address(server.address), instance=servicer.instance,
                             **({"metrics_url": parts.metrics.url} if parts.metrics else {}), **relay)

    def leave() -> None:                # a gateway watching the ready file's directory drains this actor
        if config.ready_file:
            remove_ready_file(config.ready_file)

    server.run_until_signal(on_stop=parts.close, on_ready=ready, on_leave=leave)


ENGINE_GONE = click.ClickException("the engine process exited; the actor stopped (see the log above)")


@settings_command("actor", ActorConfig)
def actor(config: ActorConfig) -> None:
    """Serve token generation from MODEL over gRPC (forge.v1.Actor: Generate, Abort, Stats, plus health and
    reflection). Token ids in, token ids out, with the log-probability and weight version of every token."""
    setup_logging(config.log_level)
    backend, why = pick_backend(config.backend, config.model)
    log.info("backend: %s (%s)", backend, why)
    factory = factory_for(backend)
    try:
        factory.check(config)
    except ValueError as exc:
        picked = f"--backend auto picked {backend} ({why}): " if config.backend == "auto" else ""
        raise click.ClickException(picked + str(exc)) from None
    check_port_option(config.host, config.port, "--port")
    check_port_option(config.host, config.metrics_port, "--metrics-port")
    _check_relay_endpoints(config)
    servers: list = []

    def engine_exited(_reason: str) -> None:
        for server in servers:
            server.stop(5)

    context = _context(config, factory.threads(config), engine_exited)
    try:
        serving = factory.build(config, context)
    except (RuntimeError, ValueError, TimeoutError) as exc:
        raise click.ClickException(f"the {config.backend} backend could not start: {exc}") from exc
    parts = Parts(serving, servers=servers)
    if config.weights_fetch:
        _follow_weights(config, context, parts)
    if config.adapters:
        _follow_adapters(config, context, parts)
    if config.adapter_source is not None:
        _follow_source(config, context, parts)
    _serve(config, context, parts)
    if serving.backend.failed:
        raise ENGINE_GONE


main = entry_point(actor, "actor")
