"""``forge-cache`` as a real process on loopback: put, look up and get blocks through the client; malformed hashes,
sizes and payloads are refused with INVALID_ARGUMENT; the blocks survive a restart; LRU eviction at capacity;
several servers share the hash space by consistent hashing and a client finds every block."""

from __future__ import annotations

import hashlib
import random

import grpc
import pytest

from forge.kv.blocks import KVBlock, to_chunks
from forge.kv.client import CacheClient
from forge.kvhash import chain_hashes, kv_salt
from forge.rpc import connect
from forge.v1 import cache_pb2, cache_pb2_grpc, common_pb2

from helpers.processes import start_cache


def blocks_for(tokens: int, seed: int = 0, block_bytes: int = 2048, version: int = 0) -> list[KVBlock]:
    rng = random.Random(seed)
    hashes = chain_hashes([rng.randrange(1000) for _ in range(tokens)], 16, kv_salt("test-model", version))
    return [KVBlock.build(h, 16, "bfloat16", (2, block_bytes // 4), rng.randbytes(block_bytes)) for h in hashes]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cache")
    proc = start_cache(directory, "cache", "--max-block-mb", "1", "--chunk-kb", "4")
    yield proc
    proc.stop()


def test_put_lookup_get_and_stats(server):
    client = CacheClient([server.address])
    blocks = blocks_for(16 * 12, block_bytes=10_000)         # several chunks per block
    assert client.lookup([b.block_hash for b in blocks]) == 0
    assert client.put(blocks[:8]) == (8, 0)
    assert client.put(blocks[:3]) == (0, 3)
    hashes = [b.block_hash for b in blocks]
    assert client.lookup(hashes) == 8
    got = client.get(hashes)
    assert set(got) == set(hashes[:8]) and all(got[b.block_hash] == b for b in blocks[:8])
    assert client.get_prefix(hashes[:2] + hashes[9:] + hashes[2:3]) == blocks[:2]
    gauges = client.stats()[server.address].gauges
    assert gauges["blocks"] >= 8 and gauges["bytes"] >= 8 * 10_000 and gauges["capacity_bytes"] == 4096 * 2**20
    assert 0 < gauges["hit_rate"] < 1 and gauges["puts_per_s"] > 0 and gauges["gets_per_s"] > 0
    client.close()


def test_malformed_hashes_sizes_and_payloads_are_refused(server):
    stub = cache_pb2_grpc.CacheStub(connect(server.address))
    good = blocks_for(16, seed=5)[0]

    def refused(call, *args) -> str:
        with pytest.raises(grpc.RpcError) as info:
            result = call(*args, timeout=10)
            if not isinstance(result, cache_pb2.PutResponse):
                list(result)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return info.value.details()

    assert "16 bytes" in refused(stub.Lookup, cache_pb2.LookupRequest(block_hashes=[b"\x01" * 15]))
    assert "16 bytes" in refused(stub.Get, cache_pb2.GetRequest(block_hashes=[good.block_hash, b"x" * 20]))
    chunk = next(to_chunks(good))
    chunk.ClearField("shape")
    chunk.shape.extend([3, 3])
    assert "bfloat16 is 18 bytes, but total_bytes says 2048" in refused(stub.Put, iter([chunk]))
    damaged = list(to_chunks(good, 1024))
    damaged[0].data = bytes(1024)
    assert "checksum mismatch" in refused(stub.Put, iter(damaged))
    huge = cache_pb2.KVBlockChunk(block_hash=good.block_hash, num_tokens=16, dtype="uint8", shape=[2 << 20],
                                  total_bytes=2 << 20, data=b"x")
    assert "outside (0, 1048576]" in refused(stub.Put, iter([huge]))
    cut = list(to_chunks(good, 1024))[:1]
    assert "ended inside block" in refused(stub.Put, iter(cut))
    assert CacheClient([server.address]).lookup([good.block_hash]) == 0     # nothing of it was stored
    gauges = stub.Stats(common_pb2.StatsRequest(), timeout=10).gauges
    assert gauges["rejected"] >= 6


def test_the_cache_restarts_with_its_blocks_intact_and_evicts_lru_at_capacity(tmp_path):
    block_bytes = 100_000
    proc = start_cache(tmp_path, "small", "--capacity-mb", "1")       # room for 10 blocks of ~100 kB
    try:
        client = CacheClient([proc.address])
        blocks = blocks_for(16 * 14, seed=2, block_bytes=block_bytes)
        client.put(blocks[:9])
        proc.stop()
        proc = start_cache(tmp_path, "small", "--capacity-mb", "1")
        client = CacheClient([proc.address])
        hashes = [b.block_hash for b in blocks]
        got = client.get(hashes[:9])
        assert [got[h] for h in hashes[:9]] == blocks[:9]
        client.get(hashes[:1])                                          # block 0 is now the most recently used
        client.put(blocks[9:12])                                        # over capacity: the LRU ones go
        present = {h for h in hashes if client.lookup([h])}
        assert hashes[0] in present and set(hashes[9:12]) <= present
        assert hashes[1] not in present and len(present) <= 10
        gauges = client.stats()[proc.address].gauges
        assert gauges["evictions"] >= 2 and gauges["bytes"] <= 2**20
    finally:
        proc.stop()


def test_consistent_hashing_spreads_blocks_over_three_servers_and_a_client_finds_them(tmp_path):
    procs = [start_cache(tmp_path, f"shard{i}") for i in range(3)]
    try:
        addresses = [p.address for p in procs]
        blocks = blocks_for(16 * 90, seed=3, block_bytes=512)
        hashes = [b.block_hash for b in blocks]
        writer = CacheClient(addresses)
        assert writer.put(blocks) == (90, 0)
        per_server = {a: s.gauges["blocks"] for a, s in writer.stats().items()}
        assert sum(per_server.values()) == 90 and min(per_server.values()) >= 10, per_server
        reader = CacheClient(",".join(reversed(addresses)))             # another client, addresses in another order
        assert reader.lookup(hashes) == 90
        assert reader.get_prefix(hashes) == blocks
        procs[1].stop()                                                 # a server down: counts as empty
        holder = reader.ring.server_for
        first_lost = next(i for i, h in enumerate(hashes) if holder(h) == addresses[1])
        assert reader.lookup(hashes) == first_lost
        assert len(reader.get(hashes)) == 90 - sum(1 for h in hashes if holder(h) == addresses[1])
    finally:
        for proc in procs:
            proc.stop()


def test_blocks_are_named_by_their_chain_so_another_version_misses(server):
    client = CacheClient([server.address])
    old = blocks_for(64, seed=11, version=0)
    client.put(old)
    new = blocks_for(64, seed=11, version=1)                # same tokens, next weight version
    assert client.lookup([b.block_hash for b in old]) == 4
    assert client.lookup([b.block_hash for b in new]) == 0
    assert hashlib.sha256(old[0].data).digest() == old[0].meta.sha256
