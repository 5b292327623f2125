"""``forge-gateway``: serve agents over gRPC (forge.v1.Gateway) and OpenAI-compatible HTTP, route their calls to
actors and record every call token-in-token-out in the Data Pool."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from forge.cli.common import CONTEXT_SETTINGS, config_option, log_level_option, setup_logging, write_ready_file
from forge.gateway.routing import DEFAULT_ROUTER, router_class

log = logging.getLogger("forge.gateway")


def _router_spec(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """--router: a built-in name or a dotted path to a Router subclass, resolved before anything is loaded."""
    try:
        router_class(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    return value


@click.command("gateway", context_settings=CONTEXT_SETTINGS)
@config_option
@click.option("--model", default="tiny", show_default=True,
              help="Checkpoint directory (tokenizer, chat template, context length), or 'tiny'.")
@click.option("--model-name", default="forge-tiny", show_default=True,
              help="The model name served at /v1/models and echoed in responses.")
@click.option("--actor", "actors", multiple=True, metavar="HOST:PORT",
              help="An actor to route calls to (repeatable; at least one).")
@click.option("--actor-api-key", default=None, envvar="FORGE_GATEWAY_ACTOR_API_KEY",
              help="API key the actors require.")
@click.option("--pool", "pool_path", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Data Pool directory (LMDB), opened in this process.")
@click.option("--pool-address", default=None, metavar="HOST:PORT", help="Or a remote Pool service.")
@click.option("--pool-api-key", default=None, envvar="FORGE_GATEWAY_POOL_API_KEY",
              help="API key of the remote Pool service.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option("--grpc-port", default=50053, show_default=True, type=click.IntRange(0, 65535),
              help="gRPC port; 0 picks a free one (see --ready-file).")
@click.option("--http-port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="OpenAI-compatible HTTP port; 0 picks a free one.")
@click.option("--api-key", "api_keys", multiple=True, envvar="FORGE_GATEWAY_API_KEYS",
              help="Require this API key (repeatable); only health is served without one. Per-session keys are "
                   "accepted for their own session.")
@click.option("--session-key-secret", default=None, envvar="FORGE_GATEWAY_SESSION_KEY_SECRET",
              help="Secret that signs per-session keys; keep it to keep keys valid across restarts "
                   "[default: random per process].")
@click.option("--router", type=str, default=DEFAULT_ROUTER, show_default=True, metavar="NAME|MODULE:CLASS",
              callback=_router_spec,
              help="How calls are spread over actors: least estimated time to first token (cost-aware), best prefix "
                   "match unless imbalanced (cache-aware), prefix overlap plus load (kv-overlap), fewest in-flight "
                   "calls (least-loaded), or in turn (round-robin); or your own Router subclass by dotted path "
                   "(my_pkg.routers:MyRouter). See docs/gateway.md and docs/cache.md.")
@click.option("--session-affinity/--no-session-affinity", default=True, show_default=True,
              help="Keep a session on the actor that served it (prefix cache): while it is healthy, or with the "
                   "KV-aware routers while it is not overloaded.")
@click.option("--session-timeout", default=600.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Seconds without a call after which an open session is closed as failed.")
@click.option("--max-body-bytes", default=16 * 1024 * 1024, show_default=True, type=click.IntRange(1024),
              help="Largest HTTP request body accepted (larger: 413).")
@click.option("--tool-parser", type=click.Choice(["hermes", "none"]), default="hermes", show_default=True,
              help="Tool-call syntax parsed out of completions.")
@click.option("--reasoning-parser", type=click.Choice(["think", "none"]), default="think", show_default=True,
              help="Reasoning syntax parsed out of completions (<think>...</think>).")
@click.option("--fail-sessions-on-call-error/--no-fail-sessions-on-call-error", default=True, show_default=True,
              help="EndSession records a session as failed if one of its calls failed mid-stream.")
@click.option("--health-interval", default=2.0, show_default=True, type=click.FloatRange(min=0.05),
              help="Seconds between health checks of each actor.")
@click.option("--shutdown-grace", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds in-flight calls may take to finish on SIGTERM.")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write {grpc_address, http_address, base_url, pid} as JSON here once serving.")
@log_level_option
def gateway(model: str, model_name: str, actors: tuple[str, ...], actor_api_key: str | None,
            pool_path: Path | None, pool_address: str | None, pool_api_key: str | None, host: str, grpc_port: int,
            http_port: int, api_keys: tuple[str, ...], session_key_secret: str | None, router: str,
            session_affinity: bool, session_timeout: float, max_body_bytes: int, tool_parser: str,
            reasoning_parser: str, fail_sessions_on_call_error: bool, health_interval: float, shutdown_grace: float,
            ready_file: Path | None, log_level: str) -> None:
    """Serve agents: white-box agents over gRPC (forge.v1.Gateway), black-box agents over the OpenAI chat API
    (base URL http://HOST:HTTP_PORT/v1, or /s/SESSION_ID/v1 per session). Every call is rendered with the model's
    chat template, routed to an actor, and recorded token-in-token-out in the Data Pool before it is answered."""
    setup_logging(log_level)
    from forge.gateway.config import GatewayConfig
    from forge.gateway.server import GatewayServer

    if not actors:
        raise click.UsageError("give at least one --actor HOST:PORT")
    if bool(pool_path) == bool(pool_address):
        raise click.UsageError("give exactly one of --pool PATH and --pool-address HOST:PORT")
    config = GatewayConfig(
        model=model, model_name=model_name, actors=list(actors), actor_api_key=actor_api_key,
        pool_path=str(pool_path) if pool_path else None, pool_address=pool_address, pool_api_key=pool_api_key,
        host=host, grpc_port=grpc_port, http_port=http_port, api_keys=tuple(api_keys),
        session_key_secret=session_key_secret, router=router, session_affinity=session_affinity,
        session_timeout_s=session_timeout, max_body_bytes=max_body_bytes, tool_parser=tool_parser,
        reasoning_parser=reasoning_parser, fail_sessions_on_call_error=fail_sessions_on_call_error,
        health_interval_s=health_interval, shutdown_grace_s=shutdown_grace)
    try:
        server = GatewayServer(config)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc

    def ready() -> None:
        if ready_file:
            write_ready_file(ready_file, grpc_address=server.grpc_address, http_address=server.http_url,
                             base_url=f"{server.http_url}/v1")

    server.run_until_signal(on_ready=ready)
