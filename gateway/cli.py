"""``forge-gateway``: serve agents over gRPC (forge.v1.Gateway) and OpenAI-compatible HTTP, route their calls to
actors and record every call token-in-token-out in the Data Pool. The command is the gateway process's composition
root: its settings (``GatewayConfig``) in, the server out."""

from __future__ import annotations

import logging

import click

from forge.cli.common import entry_point, setup_logging, write_ready_file
from forge.cli.options import settings_command
from forge.gateway.config import GatewayConfig

log = logging.getLogger("forge.gateway")


@settings_command("gateway", GatewayConfig)
def gateway(config: GatewayConfig) -> None:
    """Serve agents: white-box agents over gRPC (forge.v1.Gateway), black-box agents over the OpenAI chat API
    (base URL http://HOST:HTTP_PORT/v1, or /s/SESSION_ID/v1 per session). Every call is rendered with the model's
    chat template, routed to an actor, and recorded token-in-token-out in the Data Pool before it is answered."""
    setup_logging(config.log_level)
    from forge.gateway.server import GatewayServer

    try:
        server = GatewayServer(config)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc

    def ready() -> None:
        if config.ready_file:
            write_ready_file(config.ready_file, grpc_address=server.grpc_address, http_address=server.http_url,
                             base_url=f"{server.http_url}/v1")

    server.run_until_signal(on_ready=ready)


main = entry_point(gateway, "gateway")
