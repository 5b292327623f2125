"""The gRPC Cache service over a block store: Lookup (longest cached prefix of a chain), Put and Get of blocks
streamed in chunks, and Stats. Malformed hashes, sizes and payloads get INVALID_ARGUMENT with the reason."""

from __future__ import annotations

import logging
import time

import grpc

from forge.cache.store import BlockStore
from forge.kv.blocks import MAX_BLOCK_BYTES, MAX_HASHES, Assembler, InvalidBlock, check_hashes, to_chunks
from forge.meters import RateMeter
from forge.telemetry import stats_report
from forge.v1 import cache_pb2, cache_pb2_grpc, common_pb2

log = logging.getLogger(__name__)


class CacheServicer(cache_pb2_grpc.CacheServicer):
    def __init__(self, store: BlockStore, instance: str = "cache", chunk_bytes: int = 1 << 20,
                 max_block_bytes: int = MAX_BLOCK_BYTES, labels: dict[str, str] | None = None) -> None:
        self.store = store
        self.instance = instance
        self.chunk_bytes = chunk_bytes
        self.max_block_bytes = max_block_bytes
        self.labels = {"directory": str(store.root), **(labels or {})}
        self.started = time.time()
        self.puts, self.gets = RateMeter(), RateMeter()
        self.counters = dict(lookups=0, lookup_blocks=0, lookup_hits=0, put_blocks=0, put_present=0, get_blocks=0,
                             get_misses=0, rejected=0)

    def _hashes(self, hashes, context: grpc.ServicerContext) -> list[bytes]:
        if len(hashes) > MAX_HASHES:
            self._reject(context, f"{len(hashes)} block hashes in one request; at most {MAX_HASHES}")
        try:
            hashes = check_hashes(hashes)
        except InvalidBlock as exc:
            self._reject(context, str(exc))
        return hashes

    def _reject(self, context: grpc.ServicerContext, message: str) -> None:
        self.counters["rejected"] += 1
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    def Lookup(self, request: cache_pb2.LookupRequest, context: grpc.ServicerContext) -> cache_pb2.LookupResponse:
        hashes = self._hashes(request.block_hashes, context)
        found = self.store.prefix_length(hashes)
        self.counters["lookups"] += 1
        self.counters["lookup_blocks"] += len(hashes)
        self.counters["lookup_hits"] += found
        return cache_pb2.LookupResponse(num_cached_blocks=found)

    def Put(self, request_iterator, context: grpc.ServicerContext) -> cache_pb2.PutResponse:
        assembler = Assembler(self.max_block_bytes)
        stored = present = 0
        try:
            for chunk in request_iterator:
                block = assembler.feed(chunk)
                if block is None:
                    continue
                if self.store.put(block):
                    stored += 1
                    self.puts.add()
                else:
                    present += 1
            assembler.finish()
        except InvalidBlock as exc:
            self._reject(context, f"{exc} ({stored + present} earlier blocks of this stream were accepted)")
        except OSError as exc:
            log.error("cannot write a block: %s", exc)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the cache cannot write blocks: {exc}")
        self.counters["put_blocks"] += stored
        self.counters["put_present"] += present
        return cache_pb2.PutResponse(stored=stored, already_present=present)

    def Get(self, request: cache_pb2.GetRequest, context: grpc.ServicerContext):
        hashes = self._hashes(request.block_hashes, context)
        for block_hash in hashes:
            block = self.store.get(block_hash)
            if block is None:
                self.counters["get_misses"] += 1
                continue
            self.counters["get_blocks"] += 1
            self.gets.add()
            yield from to_chunks(block, self.chunk_bytes)

    def gauges(self) -> dict[str, float]:
        c = self.counters
        store = self.store
        return {
            "blocks": float(len(store)), "bytes": float(store.used_bytes), "capacity_bytes": float(store.capacity_bytes),
            "used_frac": store.used_bytes / store.capacity_bytes,
            "hit_rate": c["lookup_hits"] / c["lookup_blocks"] if c["lookup_blocks"] else 0.0,
            "get_hit_rate": c["get_blocks"] / (c["get_blocks"] + c["get_misses"]) if c["get_blocks"] + c["get_misses"]
            else 0.0,
            "puts_per_s": self.puts.per_s(), "gets_per_s": self.gets.per_s(), "evictions": float(store.evictions),
            **{k: float(v) for k, v in c.items()},
        }

    def Stats(self, request: common_pb2.StatsRequest, context: grpc.ServicerContext) -> common_pb2.StatsReport:
        return self.report()

    def report(self) -> common_pb2.StatsReport:
        """What Stats answers (and a Prometheus scrape reads)."""
        return stats_report("cache", self.instance, self.started, self.gauges(), self.labels)
