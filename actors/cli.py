"""``forge-actor``: serve token generation from a checkpoint over gRPC. The command is the actor process's
composition root: its settings (``ActorConfig``) in, the backend, its weight subscription (and the relay that
re-serves it to other actors) and the server out."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import click

from forge.actors.config import VLLM_INSTALL_HINT, ActorConfig, vllm_installed
from forge.actors.parts import (
    kv_connector,
    load_policy,
    model_id_of,
    trtllm_backend,
    vllm_backend,
    weight_relay,
    weight_subscriber,
)
from forge.cli.common import (
    check_port_option,
    reachable_address,
    remove_ready_file,
    setup_logging,
    start_metrics,
    write_ready_file,
)
from forge.cli.options import settings_command

log = logging.getLogger("forge.actor")


def _curve_keys(config: ActorConfig):
    """The weight channel's CURVE keys, read before the model loads (the settings checked them already: this read
    is the one used, so a file changed since is refused too)."""
    if config.weights_key is None or config.weights_server_key is None:
        return None
    from forge.weights.curve import KeyFileError, client_keys

    try:
        return client_keys(config.weights_key, config.weights_server_key)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint="'--weights-key'") from None


def _relay_keys(config: ActorConfig):
    """The relay's CURVE keys (this actor's key pair and the clients it serves), read before the model loads."""
    if config.relay_clients is None or config.weights_key is None:
        return None
    from forge.weights.curve import KeyFileError, server_keys

    try:
        return server_keys(config.weights_key, config.relay_clients)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), param_hint="'--relay-clients'") from None


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


@settings_command("actor", ActorConfig)
def actor(config: ActorConfig) -> None:
    """Serve token generation from MODEL over gRPC (forge.v1.Actor: Generate, Abort, Stats, plus health and
    reflection). Token ids in, token ids out, with the log-probability and weight version of every token."""
    setup_logging(config.log_level)
    backend, model, device = config.backend, config.model, config.device
    if backend == "vllm" and not vllm_installed():
        raise click.ClickException(VLLM_INSTALL_HINT)
    check_port_option(config.host, config.port, "--port")
    check_port_option(config.host, config.metrics_port, "--metrics-port")
    weights_fetch, weights_announce = config.weights_fetch, config.weights_announce
    curve = _curve_keys(config)
    relay_curve = _relay_keys(config)
    relaying = weights_fetch is not None and config.relay_fetch is not None and config.relay_announce is not None
    _check_relay_endpoints(config)
    import torch

    from forge.actors.server import ActorServicer
    from forge.rpc import ServerOptions, ServiceBinding
    from forge.rpc.aio_server import AioGrpcServer
    from forge.v1 import actor_pb2, actor_pb2_grpc

    events = None
    threads = config.engine.threads
    if backend == "torch":
        from forge.actors.engine.engine import reserve_cpu_threads

        threads = reserve_cpu_threads(threads)
    elif threads:
        torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # Subscribed to a learner: serve only once its first version is in (every token carries a learner version).
    initial_version = -1 if weights_fetch else 0
    if backend == "trtllm":
        try:
            engine, model_id = trtllm_backend(model, config.engine.max_waiting)
        except (RuntimeError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
    elif backend == "vllm":
        try:
            engine, model_id = vllm_backend(model, replace(config.engine, threads=threads), device, config.dtype,
                                            initial_version)
        except (RuntimeError, ValueError, TimeoutError) as exc:
            raise click.ClickException(f"vLLM could not start: {exc}") from exc
        events = engine.kv_events()
    else:
        from forge.actors.engine.engine import TorchEngine

        try:
            model_id = model_id_of(model)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--model") from exc
        engine_config = replace(config.engine, model_id=model_id, threads=threads)
    subscriber = None
    relay = None
    metrics = None
    servers: list = []                  # stopped if the engine process dies
    if backend == "torch" and config.engine_process:
        from forge.actors.engine.core import EngineSpec
        from forge.actors.engine.process import EngineProcess

        spec = EngineSpec(model=model, device=device, dtype=config.dtype, config=engine_config,
                          initial_version=initial_version, weights_fetch=weights_fetch,
                          weights_announce=weights_announce, weights_curve=curve, l3_cache=config.l3_cache, l3_fetch=config.l3_fetch,
                          l3_api_key=config.l3_api_key, kv_events=True, log_level=config.log_level,
                          relay_fetch=config.relay_fetch if relaying else None,
                          relay_announce=config.relay_announce if relaying else None, relay_curve=relay_curve)
        try:
            engine = EngineProcess(spec, on_exit=lambda reason: [each.stop(5) for each in servers])
        except (RuntimeError, TimeoutError) as exc:
            raise click.ClickException(str(exc)) from exc
        events = engine.kv_events()
    elif backend == "torch":
        policy, model_id = load_policy(model, device, config.dtype)
        engine = TorchEngine(policy, engine_config, initial_version=initial_version)
        connector = kv_connector(engine, config.l3_cache, config.l3_fetch, config.l3_api_key)
        events = connector.events, connector.describe
    if weights_fetch and not (backend == "torch" and config.engine_process):     # the engine core subscribes itself
        if relaying:
            try:
                relay = weight_relay(config.relay_fetch, config.relay_announce, relay_curve)
            except (OSError, ValueError, RuntimeError) as exc:     # taken since the check at start
                engine.close()
                raise click.ClickException(f"cannot start the weight relay: {exc}") from None
        subscriber = weight_subscriber(engine, weights_fetch, weights_announce, curve, relay)
    relay_endpoints = {}
    if relay is not None:
        relay_endpoints = {"relay_fetch": relay.fetch_endpoint, "relay_announce": relay.announce_endpoint}
    elif relaying:                      # the engine core relays: it bound the endpoints
        relay_endpoints = {"relay_fetch": engine.info.relay_fetch, "relay_announce": engine.info.relay_announce}
    if weights_fetch:
        log.info("waiting for the learner's first weight version on %s", weights_fetch)
        deadline = time.monotonic() + config.first_version_timeout
        while engine.weight_version < 0:
            if time.monotonic() > deadline:
                if subscriber is not None:
                    subscriber.close()
                if relay is not None:
                    relay.close()
                engine.close()
                refused = subscriber.stats.handshake_error if subscriber is not None else ""
                raise click.ClickException(f"no weight version arrived from {weights_fetch} within "
                                           f"{config.first_version_timeout:.0f} s"
                                           + (f" (the handshake failed: {refused})" if refused else ""))
            time.sleep(0.05)

    def stop() -> None:
        if metrics is not None:
            metrics.close()
        if subscriber is not None:
            subscriber.close()
        if relay is not None:
            relay.close()
        engine.close()

    options = ServerOptions(host=config.host, port=config.port, api_keys=config.api_keys)
    servicer = ActorServicer(engine, config.name or "actor", {"model": model_id, "device": device}, config.role,
                             figures=relay.figures if relay is not None else None)
    bindings = [ServiceBinding.of(actor_pb2_grpc.add_ActorServicer_to_server, servicer, actor_pb2, "Actor")]
    event_source = None
    if events is not None:
        from forge.kv.events import KVEventSourceServicer
        from forge.v1 import router_pb2, router_pb2_grpc

        event_source = KVEventSourceServicer(*events)
        bindings.append(ServiceBinding.of(router_pb2_grpc.add_KVEventSourceServicer_to_server, event_source,
                                          router_pb2, "KVEventSource"))
    try:
        server = AioGrpcServer(bindings, options)
    except OSError as exc:             # taken since the check at start
        stop()
        raise click.ClickException(str(exc)) from None
    servers.append(server)
    engine_gone = click.ClickException("the engine process exited; the actor stopped (see the log above)")
    if engine.failed:
        stop()
        raise engine_gone
    servicer.instance = config.name or f"actor-{server.port}"
    if event_source is not None:
        event_source.instance = servicer.instance
    metrics = start_metrics(servicer.report, config.host, config.metrics_port, config.api_keys, on_failure=stop)

    def ready() -> None:
        log.info("actor %s serving %s on %s (device %s)", servicer.instance, model_id, server.address, device)
        if relay_endpoints:
            log.info("actor %s relays its weight versions on fetch %s, announce %s", servicer.instance,
                     relay_endpoints["relay_fetch"], relay_endpoints["relay_announce"])
        if config.ready_file:
            write_ready_file(config.ready_file, address=reachable_address(server.address), instance=servicer.instance,
                             **({"metrics_url": metrics.url} if metrics else {}), **relay_endpoints)

    def leave() -> None:                # a gateway watching the ready file's directory drains this actor
        if config.ready_file:
            remove_ready_file(config.ready_file)

    server.run_until_signal(on_stop=stop, on_ready=ready, on_leave=leave)
    if engine.failed:
        raise engine_gone
