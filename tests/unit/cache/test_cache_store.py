"""The L3 cache's pieces in process: block checks and chunking, the block store (LRU at capacity, restart, corrupted
files, one server per directory, one checksum per block on its way in), the consistent-hash ring, the actors' KV
event log, and the leading run of a chain that every caller counts the same way."""

from __future__ import annotations

import hashlib
import os
import random
from collections import Counter
from dataclasses import replace

import pytest

from forge.cache.store import BlockStore, DirectoryInUse
from forge.kv.blocks import Assembler, BlockMeta, InvalidBlock, KVBlock, check_meta, to_chunks
from forge.kv.events import EVICTED, STORED, KVEventLog
from forge.kv.ring import HashRing
from forge.kvhash import chain_hashes, kv_salt, leading


def block(seed: int, size: int = 4096) -> KVBlock:
    rng = random.Random(seed)
    data = rng.randbytes(size)
    return KVBlock.build(hashlib.blake2b(str(seed).encode(), digest_size=16).digest(), 16, "float32", (size // 4,),
                         data)


def test_block_metadata_checks_name_the_problem():
    good = block(0).meta
    with pytest.raises(InvalidBlock, match="16 bytes"):
        check_meta(BlockMeta(b"short", 16, "float32", (4,), 16, good.sha256))
    with pytest.raises(InvalidBlock, match="unknown dtype"):
        check_meta(BlockMeta(good.block_hash, 16, "float13", (4,), 16, good.sha256))
    with pytest.raises(InvalidBlock, match="is 16 bytes, but total_bytes says 20"):
        check_meta(BlockMeta(good.block_hash, 16, "float32", (2, 2), 20, good.sha256))
    with pytest.raises(InvalidBlock, match="positive dimensions"):
        check_meta(BlockMeta(good.block_hash, 16, "float32", (0, 4), 16, good.sha256))
    with pytest.raises(InvalidBlock, match="num_tokens"):
        check_meta(BlockMeta(good.block_hash, 0, "float32", (4,), 16, good.sha256))


def test_chunks_reassemble_and_damage_is_refused():
    blocks = [block(i, 10_000) for i in range(3)]
    assembler = Assembler()
    chunks = [c for b in blocks for c in to_chunks(b, chunk_bytes=3000)]
    assert len(chunks) == 12
    out = [b for c in chunks if (b := assembler.feed(c)) is not None]
    assembler.finish()
    assert out == blocks

    bad = list(to_chunks(blocks[0], 3000))
    bad[1].data = b"x" * len(bad[1].data)
    damaged = Assembler()
    with pytest.raises(InvalidBlock, match="checksum mismatch"):
        for chunk in bad:
            damaged.feed(chunk)
    gap = list(to_chunks(blocks[0], 3000))
    fresh = Assembler()
    fresh.feed(gap[0])
    with pytest.raises(InvalidBlock, match="expected 3000"):
        fresh.feed(gap[2])
    cut = Assembler()
    cut.feed(gap[0])
    with pytest.raises(InvalidBlock, match="ended inside block"):
        cut.finish()
    interleaved = Assembler()
    interleaved.feed(gap[0])
    with pytest.raises(InvalidBlock, match="ended after 3000"):
        interleaved.feed(next(to_chunks(blocks[1], 3000)))


def test_store_evicts_least_recently_used_at_capacity(tmp_path):
    first = block(0)
    per_block = len(first.data) + 400             # payload plus a header of a few hundred bytes
    store = BlockStore(tmp_path, capacity_bytes=3 * per_block)
    blocks = [block(i) for i in range(4)]
    for b in blocks[:3]:
        assert store.put(b)
    assert not store.put(blocks[0])               # already stored: counts as a use
    assert store.get(blocks[1].block_hash) == blocks[1]
    store.put(blocks[3])                          # evicts the least recently used: block 2
    assert blocks[2].block_hash not in store and not store.path_of(blocks[2].block_hash).exists()
    assert all(b.block_hash in store for b in (blocks[0], blocks[1], blocks[3]))
    assert store.evictions == 1 and store.used_bytes <= store.capacity_bytes
    with pytest.raises(InvalidBlock, match="exceeds the cache's capacity"):
        store.put(block(9, size=8 * per_block))
    store.close()


def test_store_keeps_its_blocks_across_a_restart_and_drops_damaged_files(tmp_path):
    store = BlockStore(tmp_path, capacity_bytes=1 << 20)
    blocks = [block(i) for i in range(5)]
    for b in blocks:
        store.put(b)
    with pytest.raises(DirectoryInUse):
        BlockStore(tmp_path, capacity_bytes=1 << 20)
    store.close()
    damaged = store.path_of(blocks[4].block_hash)
    damaged.write_bytes(damaged.read_bytes()[:-10])            # truncated on disk
    (damaged.parent / "leftover.tmp").write_bytes(b"half a block")

    reopened = BlockStore(tmp_path, capacity_bytes=1 << 20)
    assert len(reopened) == 4 and reopened.dropped_files == 1 and not (damaged.parent / "leftover.tmp").exists()
    assert [reopened.get(b.block_hash) for b in blocks[:4]] == blocks[:4]
    assert reopened.get(blocks[4].block_hash) is None
    reopened.close()
    os.utime(store.path_of(blocks[2].block_hash), (1e9, 1e9))   # the least recently used: evicted first at start
    shrunk = BlockStore(tmp_path, capacity_bytes=3 * (len(blocks[0].data) + 400))
    assert len(shrunk) == 3 and blocks[2].block_hash not in shrunk
    shrunk.close()


def test_a_block_corrupted_on_disk_is_never_served(tmp_path):
    store = BlockStore(tmp_path, capacity_bytes=1 << 20)
    b = block(1)
    store.put(b)
    path = store.path_of(b.block_hash)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert store.get(b.block_hash) is None and b.block_hash not in store
    store.close()


def test_a_block_is_checksummed_once_on_its_way_in_and_a_mismatch_is_never_served(tmp_path, monkeypatch):
    blocks = [block(i, 10_000) for i in range(3)]
    chunks = [c for b in blocks for c in to_chunks(b, chunk_bytes=3000)]
    store = BlockStore(tmp_path, capacity_bytes=1 << 20)
    digests = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda data=b"": digests.append(len(data)) or real(data))
    assembler = Assembler()                       # the service's Put: chunks in, checked blocks to the store
    for chunk in chunks:
        if (got := assembler.feed(chunk)) is not None:
            assert store.put(got)
    assert len(digests) == len(blocks)            # the Assembler verified each checksum; the store trusts it
    monkeypatch.setattr(hashlib, "sha256", real)
    liar = KVBlock(replace(block(7).meta, sha256=bytes(32)), block(7).data)
    assert store.put(liar)                        # not hashed on the way in, but checked on every read
    assert store.get(liar.block_hash) is None and liar.block_hash not in store
    assert [store.get(b.block_hash) for b in blocks] == blocks
    store.close()


def test_leading_counts_the_held_run_at_the_start_of_a_chain():
    hashes = chain_hashes(list(range(16 * 40)), 16, kv_salt("m", 0))
    for held in (0, 1, 17, 40):
        assert leading(hashes, set(hashes[:held]).__contains__) == held
    with_holes = set(hashes[:10]) | set(hashes[12:30]) | {hashes[39]}
    assert leading(hashes, with_holes.__contains__) == 10
    assert leading(hashes, set(hashes[1:]).__contains__) == 0 and leading([], bool) == 0


def test_the_ring_spreads_blocks_and_is_the_same_for_every_client():
    servers = ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]
    hashes = chain_hashes(list(range(16 * 3000)), 16, kv_salt("m", 0))
    ring = HashRing(servers)
    counts = Counter(ring.server_for(h) for h in hashes)
    assert set(counts) == set(servers) and min(counts.values()) > 0.2 * len(hashes)
    reordered = HashRing(servers[::-1])
    assert all(reordered.server_for(h) == ring.server_for(h) for h in hashes)
    smaller = HashRing(servers[:2])
    moved = sum(ring.server_for(h) != smaller.server_for(h) for h in hashes)
    assert moved == counts[servers[2]]            # only the removed server's blocks move
    assert sorted(i for indices in ring.split(hashes).values() for i in indices) == list(range(len(hashes)))


def test_kv_event_log_gives_deltas_and_snapshots():
    events = KVEventLog(max_events=8)
    a, b, c = (bytes([i]) * 16 for i in range(3))
    events.record([a, b], [])
    first = events.poll("", 0)                    # a new poller gets a snapshot
    assert first.snapshot and list(first.events[0].block_hashes) == [a, b] and first.sequence == 2
    events.record([c], [a])
    delta = events.poll(first.epoch, first.sequence)
    assert not delta.snapshot and [(e.kind, list(e.block_hashes)) for e in delta.events] == [(EVICTED, [a]),
                                                                                           (STORED, [c])]
    assert not events.poll(delta.epoch, delta.sequence).events
    events.record([bytes([9]) * 16] * 10, [])     # more than the log keeps: a late poller gets a snapshot
    late = events.poll(delta.epoch, delta.sequence)
    assert late.snapshot and set(late.events[0].block_hashes) == {b, c, bytes([9]) * 16}
    assert events.poll("another epoch", 4).snapshot
