"""The paged KV cache's bookkeeping: fixed-size blocks, reference counts, and prefix reuse by chained block hashes.

A full block whose KV is computed is registered under the chained hash of its prefix (``forge.kvhash``) salted by
the weight version that computed it. A new request reuses every leading block whose hash is registered *and* whose
stored token ids equal its own (a hash hit is verified, never trusted). Freed blocks keep their contents and hash
until they are handed out again, least recently freed first, so recently used prefixes survive longest (LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from forge.actors.engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None
    token_ids: tuple[int, ...] = field(default_factory=tuple)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.by_hash: dict[bytes, int] = {}
        self.lookups = 0
        self.hit_tokens = 0
        self.lookup_tokens = 0
        self.record_events = False           # a KV connector drains them; without one they are not kept
        self.evicted: list[bytes] = []       # hashes dropped since the last drain (KV events for the router)
        self.stored: list[bytes] = []

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def used_fraction(self) -> float:
        return 1.0 - len(self.free) / len(self.blocks)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_free(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            if self.by_hash.get(block.hash) == block_id:
                del self.by_hash[block.hash]
                if self.record_events:
                    self.evicted.append(block.hash)
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id

    def _prefix_hits(self, seq: Sequence, salt: bytes) -> list[int]:
        hits: list[int] = []
        size = self.block_size
        for index, parent in enumerate(self.prompt_block_hashes(seq, salt)):
            block_id = self.by_hash.get(parent)
            tokens = seq.token_ids[index * size:(index + 1) * size]
            if block_id is None or self.blocks[block_id].token_ids != tuple(tokens):
                break
            hits.append(block_id)
        return hits

    def prompt_block_hashes(self, seq: Sequence, salt: bytes) -> list[bytes]:
        """Chained hashes of the full blocks ``seq`` may take from the cache at admission: those before the first
        position whose logits it needs (its last token's, to sample the next one; a scoring request's, before the
        first token it scores). Hashed once per request (``Sequence.hashes``)."""
        if not self.prefix_caching:
            return []
        count = seq.logits_from // self.block_size
        return seq.hashes(salt, self.block_size, count)[:count]

    @staticmethod
    def slots_at_admission(seq: Sequence) -> int:
        """Positions a sequence needs when admitted: its tokens, the next one, and with a pending draft the
        draft's and the bonus token's."""
        return len(seq) + (2 if seq.draft is not None else 1)

    def can_allocate(self, seq: Sequence, salt: bytes, reserve: int = 0) -> bool:
        hits = self._prefix_hits(seq, salt)
        reusable_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        needed = self.blocks_needed(self.slots_at_admission(seq)) - len(hits) + reusable_free
        return needed + reserve <= len(self.free)

    def allocate(self, seq: Sequence, salt: bytes) -> None:
        """Give ``seq`` blocks for its positions at admission, reusing cached prefix blocks."""
        if seq.block_table:
            raise RuntimeError(f"{seq.request_id} already holds blocks")
        hits = self._prefix_hits(seq, salt)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
        seq.block_table = list(hits)
        seq.num_cached_blocks = len(hits)
        seq.num_computed = len(hits) * self.block_size
        seq.prefix_hit_tokens = seq.num_computed
        self.lookups += 1
        self.lookup_tokens += len(seq)
        self.hit_tokens += seq.num_computed
        self.ensure_slots(seq, self.slots_at_admission(seq))

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) - len(seq.block_table) <= len(self.free)

    def ensure_slots(self, seq: Sequence, num_tokens: int) -> None:
        """Make sure ``seq`` has blocks for positions [0, num_tokens)."""
        while len(seq.block_table) < self.blocks_needed(num_tokens):
            seq.block_table.append(self._take_free())

    def register_full_blocks(self, seq: Sequence, salt: bytes) -> None:
        """Register every block of ``seq`` whose KV is now completely computed under the given salt's chain."""
        size = self.block_size
        full = min(seq.num_computed, len(seq.token_ids)) // size
        if full <= seq.num_cached_blocks:
            return
        chain = seq.hashes(salt, size, full)
        for index in range(seq.num_cached_blocks, full):
            parent = chain[index]
            block = self.blocks[seq.block_table[index]]
            block.hash, block.token_ids = parent, tuple(seq.token_ids[index * size:(index + 1) * size])
            if self.prefix_caching and parent not in self.by_hash:
                self.by_hash[parent] = block.block_id
                if self.record_events:
                    self.stored.append(parent)
        seq.num_cached_blocks = max(seq.num_cached_blocks, full)

    def free_sequence(self, seq: Sequence) -> None:
        """Drop ``seq``'s references; blocks nobody holds go to the back of the free list (evicted last)."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is None or self.by_hash.get(block.hash) != block_id:
                    block.hash, block.token_ids = None, ()
                    self.free[block_id] = None
                    self.free.move_to_end(block_id, last=False)   # contents useless: hand out first
                else:
                    self.free[block_id] = None
        seq.block_table = []
        seq.num_computed = 0
        seq.num_cached_blocks = 0

    # ---- L3 cache hooks (actors/engine/l3.py)
    def touch(self, block_hash: bytes) -> None:
        """Mark a cached block that nobody holds as most recently used (evicted last)."""
        block_id = self.by_hash.get(block_hash)
        if block_id is not None and block_id in self.free:
            self.free.move_to_end(block_id)

    def install(self, block_hash: bytes, token_ids: list[int]) -> int | None:
        """Take a free block for KV computed elsewhere and register it, unreferenced and most recently used, under
        ``block_hash``; the caller writes its KV. None when the hash is registered already or no block is free."""
        if not self.prefix_caching or not self.free or block_hash in self.by_hash:
            return None
        block_id = self._take_free()
        block = self.blocks[block_id]
        block.ref_count, block.hash, block.token_ids = 0, block_hash, tuple(token_ids)
        self.by_hash[block_hash] = block_id
        self.free[block_id] = None
        if self.record_events:
            self.stored.append(block_hash)
        return block_id
    # ---- end of L3 cache hooks

    def drain_events(self) -> tuple[list[bytes], list[bytes]]:
        stored, evicted = self.stored, self.evicted
        self.stored, self.evicted = [], []
        return stored, evicted
