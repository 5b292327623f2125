"""``python -m forge.gateway``: the gateway server (options: ``--help``; env ``FORGE_GATEWAY_*``)."""

from forge.cli.common import entry_point
from forge.gateway.cli import gateway

if __name__ == "__main__":
    entry_point(gateway, "gateway")()
