"""What a router knows of each actor: the KV blocks it holds (from its KV events, plus the blocks of calls just
routed to it, predicted before the events confirm them), its cache layout, and its speeds measured online.

The L3 cache is modelled the same way: a block any L3-publishing actor stored is assumed to be in L3 until the
model's bound pushes it out (the cache's own LRU is not observed; the actor checks with a Lookup before fetching).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence, ValuesView
from dataclasses import dataclass
from functools import cached_property

from forge.kvhash import chain_hashes, kv_salt, leading
from forge.meters import Ewma
from forge.v1 import router_pb2

STORED, EVICTED = router_pb2.KVEvent.KIND_STORED, router_pb2.KVEvent.KIND_EVICTED


@dataclass(frozen=True)
class Layout:
    model_id: str = ""
    weight_version: int = 0
    variant: str = ""
    block_size: int = 16
    block_bytes: int = 0
    num_blocks: int = 0
    max_running: int = 64
    l3: bool = False

    @cached_property
    def salt(self) -> bytes:
        return kv_salt(self.model_id, self.weight_version, self.variant)

    @property
    def key(self) -> tuple[int, bytes]:
        return self.block_size, self.salt

    @classmethod
    def from_proto(cls, message: router_pb2.KVCacheLayout) -> Layout:
        return cls(message.model_id, message.weight_version, message.variant, message.block_size or 16,
                   message.block_bytes, message.num_blocks, message.max_running or 64, message.l3)


def prompt_hashes(prompt_ids: Sequence[int], layout: Layout) -> list[bytes]:
    """The blocks an actor can reuse for this prompt: every full block before its last token."""
    return chain_hashes(prompt_ids[:-1], layout.block_size, layout.salt)


class BlockSet:
    """A bounded LRU set of block hashes, each with the time it was last added (used)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._hashes: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._hashes

    def add(self, hashes: Sequence[bytes], now: float = 0.0) -> None:
        for block_hash in hashes:
            self._hashes[block_hash] = now
            self._hashes.move_to_end(block_hash)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def discard(self, hashes: Sequence[bytes]) -> list[float]:
        """Remove ``hashes``; the last-use times of those that were present."""
        removed = []
        for block_hash in hashes:
            used = self._hashes.pop(block_hash, None)
            if used is not None:
                removed.append(used)
        return removed

    def clear(self) -> None:
        self._hashes.clear()

    def prefix(self, hashes: Sequence[bytes]) -> int:
        return leading(hashes, self._hashes.__contains__)


@dataclass
class Pending:
    """A call routed to an actor whose first token has not come yet."""

    compute_tokens: int
    estimate_s: float
    raw_s: float                # the estimate before the actor's calibration factor


class PendingCalls:
    """An actor's pending calls by request, with the sum of the tokens they have to prefill kept as they come and go:
    the router reads it at every call, and thousands of calls may be pending at once."""

    def __init__(self, calls: dict[int, Pending] | None = None) -> None:
        self._calls: dict[int, Pending] = dict(calls or {})
        self.compute_tokens = sum(p.compute_tokens for p in self._calls.values())

    def __setitem__(self, key: int, call: Pending) -> None:
        self.pop(key)
        self._calls[key] = call
        self.compute_tokens += call.compute_tokens

    def __getitem__(self, key: int) -> Pending:
        return self._calls[key]

    def pop(self, key: int, default: Pending | None = None) -> Pending | None:
        call = self._calls.pop(key, None)
        if call is None:
            return default
        self.compute_tokens -= call.compute_tokens
        return call

    def __len__(self) -> int:
        return len(self._calls)

    def values(self) -> ValuesView[Pending]:
        return self._calls.values()


class ActorModel:
    def __init__(self, address: str, prior_prefill_tps: float = 2000.0, default_capacity: int = 65536) -> None:
        self.address = address
        self.layout: Layout | None = None
        self.blocks = BlockSet(default_capacity)
        self.prefill_tps = Ewma(prior_prefill_tps, alpha=0.3)
        self.fetch_bps = Ewma(1e9, alpha=0.3)
        self.lookup_s = Ewma(1e-3, alpha=0.3)
        self.step_s = Ewma(0.0, alpha=0.3)
        self.service_s = Ewma(1.0, alpha=0.1)
        self.calibration = Ewma(1.0, alpha=0.1)     # actual / estimated time to first token
        self.wait_s = Ewma(0.0, alpha=0.1)          # time to first token beyond the call's own prefill
        self.eviction_age = Ewma(math.inf, alpha=0.01)   # time since last use of the blocks the actor evicts
        self.pending = PendingCalls()                # calls routed here whose first token has not come yet
        self.active_blocks = 0                       # prompt blocks of this gateway's calls in flight here
        self.live: Counter[bytes] = Counter()        # blocks of the live sessions whose home this actor is
        self.sessions = 0                            # live sessions whose home this actor is
        self.epoch = ""
        self.sequence = 0
        self.events_supported = True

    @property
    def block_size(self) -> int:
        return self.layout.block_size if self.layout else 16

    def hold(self, hashes: Sequence[bytes], sign: int) -> None:
        """Count a live session and its blocks in (``sign`` 1) or out of (-1) this actor's live footprint."""
        self.sessions += sign
        live = self.live
        for block_hash in hashes:
            count = live[block_hash] + sign
            if count > 0:
                live[block_hash] = count
            else:
                live.pop(block_hash, None)

    @property
    def pending_tokens(self) -> int:
        return self.pending.compute_tokens

    def apply(self, answer: router_pb2.KVEvents, now: float | None = None) -> None:
        """Take in one poll's answer (received at ``now``): layout, figures, and the events (or snapshot) since
        the last one."""
        layout = Layout.from_proto(answer.layout) if answer.HasField("layout") else self.layout
        if layout is not None and (self.layout is None or layout.key != self.layout.key):
            self.blocks = BlockSet(max(1024, 2 * layout.num_blocks))   # other hashes: what we knew is moot
        self.layout = layout
        if answer.snapshot:
            self.blocks.clear()
        for event in answer.events:
            if event.kind == STORED:
                self.blocks.add(event.block_hashes, now or 0.0)
            elif event.kind == EVICTED:
                for used in self.blocks.discard(event.block_hashes):
                    if now is not None and used:
                        self.eviction_age.update(now - used)
        self.epoch, self.sequence = answer.epoch, answer.sequence
        self.update_figures(answer.figures)

    def horizon_s(self) -> float:
        """How long a block nobody uses survives in the actor's LRU cache: the measured time since last use of
        the blocks it evicts (the router's own record of uses: KV events and the calls it routed); infinite
        until it evicts."""
        return self.eviction_age.value

    def update_figures(self, figures: dict[str, float]) -> None:
        if figures.get("prefill_tokens_per_s", 0) > 0:
            self.prefill_tps.update(figures["prefill_tokens_per_s"])
        if figures.get("l3_fetch_bytes_per_s", 0) > 0:
            self.fetch_bps.update(figures["l3_fetch_bytes_per_s"])
        if figures.get("l3_lookup_s", 0) > 0:
            self.lookup_s.update(figures["l3_lookup_s"])
        if "decode_step_s" in figures:
            self.step_s.update(figures["decode_step_s"])


class L3Model:
    """The blocks believed to be in the L3 cache (published by any L3-enabled actor)."""

    def __init__(self, capacity: int = 1 << 20) -> None:
        self.blocks = BlockSet(capacity)

    def observe(self, answer: router_pb2.KVEvents) -> None:
        if answer.layout.l3:
            for event in answer.events:
                if event.kind == STORED:
                    self.blocks.add(event.block_hashes)


class Sample:
    """The last ``size`` values of a quantity, for its empirical survival function."""

    def __init__(self, size: int = 1024) -> None:
        self._order: deque[float] = deque(maxlen=size)
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, value: float) -> None:
        if len(self._order) == self._order.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self._order[0])]
        self._order.append(value)
        bisect.insort(self._sorted, value)

    def survival(self, value: float) -> float:
        """The fraction of values above ``value``."""
        if not self._sorted:
            return 0.0
        return (len(self._sorted) - bisect.bisect_right(self._sorted, value)) / len(self._sorted)
