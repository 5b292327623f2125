"""A client of one or more cache servers sharing the hash space: ``CacheClient(["h1:p", "h2:p"])`` maps each block
hash to its server on a consistent-hash ring (``HashRing``) and fans requests out to the servers in parallel.

A server that cannot be reached (or times out) counts as holding nothing: lookups end at its first block, its
blocks are not fetched and puts to it are dropped, so a cache outage costs recomputation, never a failed request.
Payloads are checked (size, shape, SHA-256) on arrival; a corrupted block is dropped, as if missing.

A long prompt's chain is asked for in requests of at most ``max_request_hashes`` hashes (the servers' limit,
``MAX_HASHES``), one after another on each server: a lookup stops at the first request not wholly held, and a fetch
keeps the blocks of the requests answered before one that failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc

from forge.kv.blocks import CHUNK_BYTES, MAX_HASHES, Assembler, InvalidBlock, KVBlock, check_hashes, to_chunks
from forge.kv.ring import HashRing
from forge.kvhash import leading
from forge.rpc import connect
from forge.v1 import cache_pb2, cache_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

FETCH_POLICIES = ("auto", "always", "never")     # when an actor fetches missing prompt blocks (--l3-fetch)
TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
             grpc.StatusCode.CANCELLED}
T = TypeVar("T")


def parse_addresses(addresses: str | Sequence[str]) -> list[str]:
    items = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    found = [a.strip() for a in items if a.strip()]
    if not found:
        raise ValueError("no cache server addresses given")
    return found


class CacheClient:
    def __init__(self, addresses: str | Sequence[str], api_key: str | None = None, timeout_s: float = 10.0,
                 chunk_bytes: int = CHUNK_BYTES, max_request_hashes: int = MAX_HASHES) -> None:
        if not 0 < max_request_hashes <= MAX_HASHES:
            raise ValueError(f"max_request_hashes must be in [1, {MAX_HASHES}], got {max_request_hashes}")
        self.ring = HashRing(parse_addresses(addresses))
        self.timeout_s = timeout_s
        self.chunk_bytes = chunk_bytes
        self.max_request_hashes = max_request_hashes
        self._channels = {a: connect(a, api_key) for a in self.ring.servers}
        self.stubs = {a: cache_pb2_grpc.CacheStub(c) for a, c in self._channels.items()}
        self._pool = ThreadPoolExecutor(max_workers=len(self.stubs), thread_name_prefix="cache-client") \
            if len(self.stubs) > 1 else None
        self.failures = 0
        self._last_warning = 0.0

    @property
    def servers(self) -> list[str]:
        return self.ring.servers

    def _fan_out(self, groups: dict[str, T], call: Callable[[str, T], object]) -> dict[str, object]:
        """``call(server, group)`` per server, in parallel; a transient failure gives None for that server."""

        def guarded(server: str, group: T) -> object:
            try:
                return call(server, group)
            except grpc.RpcError as exc:
                if exc.code() not in TRANSIENT:
                    raise
                self.failures += 1
                now = time.monotonic()
                if now - self._last_warning > 10.0:
                    self._last_warning = now
                    log.warning("cache server %s failed (%s: %s); treating it as empty", server, exc.code().name,
                                exc.details())
                return None

        if self._pool is None or len(groups) == 1:
            return {server: guarded(server, group) for server, group in groups.items()}
        futures = {server: self._pool.submit(guarded, server, group) for server, group in groups.items()}
        return {server: future.result() for server, future in futures.items()}

    def _parts(self, indices: list[int]) -> list[list[int]]:
        """``indices`` cut into the requests that carry them, in order."""
        step = self.max_request_hashes
        return [indices[start:start + step] for start in range(0, len(indices), step)]

    def lookup(self, hashes: Sequence[bytes]) -> int:
        """Length of the leading run of ``hashes`` (a chain) held by the servers."""
        hashes = check_hashes(hashes)
        if not hashes:
            return 0
        groups = self.ring.split(hashes)
        held = dict.fromkeys(groups, 0)           # per server: its leading blocks known to be held (kept on failure)

        def ask(server: str, indices: list[int]) -> None:
            for part in self._parts(indices):
                request = cache_pb2.LookupRequest(block_hashes=[hashes[i] for i in part])
                found = self.stubs[server].Lookup(request, timeout=self.timeout_s).num_cached_blocks
                held[server] += found
                if found < len(part):
                    return

        self._fan_out(groups, ask)
        prefix = len(hashes)
        for server, indices in groups.items():
            if held[server] < len(indices):       # the server's first missing block ends the chain there
                prefix = min(prefix, indices[held[server]])
        return prefix

    def put(self, blocks: Sequence[KVBlock]) -> tuple[int, int]:
        """Store blocks on their servers; returns (stored, already present)."""
        groups: dict[str, list[KVBlock]] = {}
        for block in blocks:
            groups.setdefault(self.ring.server_for(block.block_hash), []).append(block)

        def send(server: str, group: list[KVBlock]) -> tuple[int, int]:
            chunks = (chunk for block in group for chunk in to_chunks(block, self.chunk_bytes))
            answer = self.stubs[server].Put(chunks, timeout=self.timeout_s)
            return answer.stored, answer.already_present

        answers = [a for a in self._fan_out(groups, send).values() if a is not None]
        return sum(a[0] for a in answers), sum(a[1] for a in answers)

    def get(self, hashes: Sequence[bytes]) -> dict[bytes, KVBlock]:
        """The blocks the servers hold among ``hashes``, checked; missing and corrupted ones are absent."""
        hashes = check_hashes(hashes)
        groups = self.ring.split(hashes)
        found: list[KVBlock] = []                 # what arrived, also from servers that failed after some requests

        def fetch(server: str, indices: list[int]) -> None:
            for part in self._parts(indices):
                request = cache_pb2.GetRequest(block_hashes=[hashes[i] for i in part])
                assembler = Assembler()
                for chunk in self.stubs[server].Get(request, timeout=self.timeout_s):
                    try:
                        block = assembler.feed(chunk)
                    except InvalidBlock as exc:
                        log.error("cache server %s sent a bad block: %s", server, exc)
                        assembler = Assembler()
                        continue
                    if block is not None:
                        found.append(block)

        self._fan_out(groups, fetch)
        wanted = set(hashes)
        return {block.block_hash: block for block in found if block.block_hash in wanted}

    def get_prefix(self, hashes: Sequence[bytes]) -> list[KVBlock]:
        """The leading run of ``hashes`` whose blocks arrived intact."""
        found = self.get(hashes)
        return [found[h] for h in hashes[:leading(hashes, found.__contains__)]]

    def stats(self) -> dict[str, common_pb2.StatsReport]:
        return {a: stub.Stats(common_pb2.StatsRequest(), timeout=self.timeout_s) for a, stub in self.stubs.items()}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for channel in self._channels.values():
            channel.close()
