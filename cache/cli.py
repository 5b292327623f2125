"""``forge-cache``: serve the L3 KV block store (forge.v1.Cache) from a local or mounted directory. The command is
the composition root of the cache process: its settings (``CacheConfig``) in, the store and its server out."""

from __future__ import annotations

import logging

import click

from forge.cache.config import CacheConfig
from forge.cli.common import check_port_option, entry_point, setup_logging, start_service_metrics, write_ready_file
from forge.cli.options import settings_command

log = logging.getLogger("forge.cache")


@settings_command("cache", CacheConfig)
def cache(config: CacheConfig) -> None:
    """Serve the global L3 KV cache: KV blocks keyed by the chained hash of their token prefix (salted by model and
    weight version), stored one file per block in DIR, evicted least recently used first beyond the capacity, and
    kept across restarts. Several servers share the hash space through the clients' consistent-hash ring."""
    setup_logging(config.log_level)
    check_port_option(config.host, config.metrics_port, "--metrics-port")
    from forge.cache.servicer import CacheServicer
    from forge.cache.store import BlockStore, DirectoryInUse
    from forge.rpc import GrpcServer, ServerOptions, ServiceBinding
    from forge.v1 import cache_pb2, cache_pb2_grpc

    try:
        store = BlockStore(config.dir, config.capacity_bytes, fsync=config.fsync)
    except (DirectoryInUse, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    servicer = CacheServicer(store, chunk_bytes=config.chunk_bytes, max_block_bytes=config.max_block_bytes)
    options = ServerOptions(host=config.host, port=config.port, api_keys=config.api_keys)
    try:
        server = GrpcServer([ServiceBinding.of(cache_pb2_grpc.add_CacheServicer_to_server, servicer, cache_pb2,
                                               "Cache")], options)
    except OSError as exc:
        store.close()
        raise click.ClickException(str(exc)) from exc
    servicer.instance = config.name or f"cache-{server.port}"
    metrics, stop = start_service_metrics(server, servicer.report, config, store.close)

    def ready() -> None:
        log.info("cache %s serving %s (%d blocks, %.0f MiB capacity) on %s", servicer.instance, config.dir,
                 len(store), store.capacity_bytes / 2**20, server.address)
        if config.ready_file:
            write_ready_file(config.ready_file, address=server.address, instance=servicer.instance,
                             **({"metrics_url": metrics.url} if metrics else {}))

    server.run_until_signal(on_stop=stop, on_ready=ready)


main = entry_point(cache, "cache")
