"""``forge-cache``: serve the L3 KV block store (forge.v1.Cache) from a local or mounted directory."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from forge.cli.common import CONTEXT_SETTINGS, config_option, log_level_option, setup_logging, write_ready_file

log = logging.getLogger("forge.cache")


@click.command("cache", context_settings=CONTEXT_SETTINGS)
@config_option
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory holding the blocks (local, or a mounted shared file system); one server per directory.")
@click.option("--capacity-mb", default=4096, show_default=True, type=click.IntRange(1),
              help="Bytes of blocks kept; the least recently used are evicted beyond it.")
@click.option("--max-block-mb", default=256, show_default=True, type=click.IntRange(1),
              help="Largest block accepted.")
@click.option("--chunk-kb", default=1024, show_default=True, type=click.IntRange(4, 65536),
              help="Size of the chunks blocks are streamed in.")
@click.option("--fsync/--no-fsync", default=False, show_default=True,
              help="fsync every block before acknowledging it (a cache may lose recent blocks on power loss).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option("--port", default=50055, show_default=True, type=click.IntRange(0, 65535),
              help="gRPC port; 0 picks a free one (see --ready-file).")
@click.option("--name", default=None, help="Instance name in stats [default: cache-PORT].")
@click.option("--api-key", "api_keys", multiple=True, envvar="FORGE_CACHE_API_KEYS",
              help="Require this API key on every call (repeatable).")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write {address, instance, pid} as JSON here once serving.")
@log_level_option
def cache(directory: Path, capacity_mb: int, max_block_mb: int, chunk_kb: int, fsync: bool, host: str, port: int,
          name: str | None, api_keys: tuple[str, ...], ready_file: Path | None, log_level: str) -> None:
    """Serve the global L3 KV cache: KV blocks keyed by the chained hash of their token prefix (salted by model and
    weight version), stored one file per block in DIR, evicted least recently used first beyond the capacity, and
    kept across restarts. Several servers share the hash space through the clients' consistent-hash ring."""
    setup_logging(log_level)
    from forge.cache.service import CacheServicer
    from forge.cache.store import BlockStore, DirectoryInUse
    from forge.rpc import GrpcServer, ServerOptions, ServiceBinding
    from forge.v1 import cache_pb2, cache_pb2_grpc

    try:
        store = BlockStore(directory, capacity_mb * 2**20, fsync=fsync)
    except (DirectoryInUse, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    servicer = CacheServicer(store, chunk_bytes=chunk_kb * 1024, max_block_bytes=max_block_mb * 2**20)
    options = ServerOptions(host=host, port=port, api_keys=api_keys)
    try:
        server = GrpcServer([ServiceBinding.of(cache_pb2_grpc.add_CacheServicer_to_server, servicer, cache_pb2,
                                               "Cache")], options)
    except OSError as exc:
        store.close()
        raise click.ClickException(str(exc)) from exc
    servicer.instance = name or f"cache-{server.port}"

    def ready() -> None:
        log.info("cache %s serving %s (%d blocks, %.0f MiB capacity) on %s", servicer.instance, directory,
                 len(store), store.capacity_bytes / 2**20, server.address)
        if ready_file:
            write_ready_file(ready_file, address=server.address, instance=servicer.instance)

    server.run_until_signal(on_stop=store.close, on_ready=ready)
