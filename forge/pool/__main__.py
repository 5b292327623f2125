"""``python -m forge.pool``: serve a pool over gRPC (options: ``--help``; env ``FORGE_POOL_*``)."""

from forge.cli.common import entry_point
from forge.pool.cli import serve_command

if __name__ == "__main__":
    entry_point(serve_command, "pool")()
