"""The torch engine's link to the shared KV world: KV events for routers, online speed figures, and the
L3 KV cache.

- **Events and speeds.** After every step the blocks the engine registered and evicted go to a ``KVEventLog``
  that routers poll (``forge.v1.KVEventSource``), and the step's duration updates the prefill throughput and the
  decode step time (EWMAs), which routers read with the events.
- **Publish.** Newly registered full blocks are copied out of the paged KV tensors in the engine thread (a device
  copy) and put on a bounded queue; a worker thread serialises them and puts them to the L3 cache. A full queue
  drops blocks: publishing never slows the engine. Blocks that mix weight versions (a request that continued
  across a weight swap) are never published.
- **Fetch.** A new request whose prompt's leading blocks are not cached locally is held back while a worker asks
  the L3 cache how many of them it holds and, when fetching is estimated cheaper than recomputing (bytes / measured
  fetch bandwidth + lookup time against tokens / measured prefill throughput), fetches them. Back in the engine
  thread the blocks are written into freshly taken KV blocks and registered like locally computed ones, so the
  request starts after them exactly as after a local prefix hit. Blocks are named by chained hashes salted with
  the model, the weight version and the variant ("mtp" when the MTP layer's KV is cached), so KV of another
  version is never used; blocks fetched under a version the engine no longer runs are dropped.
- **Routing.** For a model with experts a block's routing (the experts each sparse layer chose at its positions)
  travels with its KV, as a small block of its own named by ``forge.kvhash.routing_block_hash``: published and
  handed over beside the KV block when every position's routing is known, fetched in the same request, and
  installed with the KV, so a fetched prefix's positions carry the routing the KV was computed under. A routing
  block that is missing (evicted apart) or malformed leaves those positions unknown (-1); the KV is used anyway.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from forge.actors.backend import RequestStream, TokenChunk
from forge.actors.engine.connector import EngineConnector
from forge.actors.engine.sequence import Sequence, Status
from forge.kv.blocks import KVBlock
from forge.kv.client import FETCH_POLICIES, CacheClient
from forge.kv.events import KVEventLog
from forge.kvhash import leading, routing_block_hash
from forge.meters import Ewma
from forge.v1 import router_pb2

if TYPE_CHECKING:
    from forge.actors.engine.engine import TorchEngine
    from forge.actors.engine.runner import Work

log = logging.getLogger(__name__)


@dataclass
class _Fetch:
    seq: Sequence
    salt: bytes
    hashes: list[bytes]                 # every full prompt block's chained hash
    local: int                          # leading blocks cached locally when the request arrived
    always: bool = False                # fetch whatever L3 holds (a handover), not only where it is estimated cheaper
    tensors: list[torch.Tensor] = field(default_factory=list)
    routing: list[torch.Tensor | None] = field(default_factory=list)     # per fetched block; None: not known


class KVConnector(EngineConnector):
    def __init__(self, engine: TorchEngine, client: CacheClient | None = None, fetch: str = "auto",
                 publish_queue: int = 1024, fetch_workers: int = 2, prior_prefill_tps: float = 2000.0) -> None:
        if fetch not in FETCH_POLICIES:
            raise ValueError(f"fetch policy {fetch!r} is not one of {FETCH_POLICIES}")
        self.engine = engine
        self.blocks = engine.blocks
        self.kv = engine.cache
        self.client = client
        self.blocks.record_events = True     # drained after every step (after_step)
        self.fetch_policy = fetch if client is not None else "never"
        keys = engine.cache.keys
        self.block_shape = (2, keys.shape[0], *keys.shape[2:])
        self.dtype = keys.dtype
        self.dtype_name = str(keys.dtype).removeprefix("torch.")
        self.block_bytes = keys[:, 0].numel() * keys.element_size() * 2
        routing, experts = engine.cache.routing, engine.model.config.num_experts
        self.routing_shape = None if routing is None else (self.blocks.block_size, *routing.shape[1:])
        self.num_experts = experts
        self.routing_dtype = torch.uint8 if experts <= 256 else torch.int16
        self.routing_dtype_name = str(self.routing_dtype).removeprefix("torch.")
        self.events = KVEventLog()
        self.prefill_tps = Ewma(prior_prefill_tps)
        self.decode_step_s = Ewma(0.0)
        self.fetch_bps = Ewma(1e9)         # optimistic priors: the first fetches measure the real figures
        self.lookup_s = Ewma(1e-3)
        self.counters = dict(l3_lookups=0, l3_fetched_blocks=0, l3_fetch_skipped=0, l3_fetch_failures=0,
                             l3_published_blocks=0, l3_publish_dropped=0, l3_publish_failures=0, l3_stale_dropped=0,
                             l3_handovers=0, l3_handover_failures=0, l3_published_routing=0, l3_fetched_routing=0)
        self._in_l3: OrderedDict[bytes, None] = OrderedDict()   # published or fetched: not published again
        self._ready: deque[_Fetch] = deque()
        self._delivered: list[tuple[RequestStream, TokenChunk]] = []     # handovers stored, their chunk not sent
        self._lock = threading.Lock()
        self._closed = False
        self._publish: queue.Queue = queue.Queue(maxsize=publish_queue)
        self._fetchers = ThreadPoolExecutor(fetch_workers, thread_name_prefix="l3-fetch") if client else None
        self._handovers = ThreadPoolExecutor(fetch_workers, thread_name_prefix="l3-handover") if client else None
        self._publisher = threading.Thread(target=self._publish_loop, name="l3-publish", daemon=True) \
            if client else None
        if self._publisher is not None:
            self._publisher.start()
        engine.connector = self

    # ------------------------------------------------------------------ engine thread

    @property
    def hands_over(self) -> bool:
        return self.client is not None

    def intercept(self, seq: Sequence) -> bool:
        """Hold a new request back while its missing prompt blocks are looked up (and maybe fetched) in L3."""
        if self.fetch_policy == "never" or not self.blocks.prefix_caching or self._closed:
            return False
        salt = self.engine.salt_of(seq)
        hashes = self.blocks.prompt_block_hashes(seq, salt)
        local = leading(hashes, self.blocks.by_hash.__contains__)
        missing_s = (len(hashes) - local) * self.blocks.block_size / self.prefill_tps.value
        handed_over = seq.handover_version is not None     # its blocks were put to L3 for it: always fetched
        if local == len(hashes) or (self.fetch_policy == "auto" and not handed_over
                                    and missing_s <= self.lookup_s.value):
            return False
        self._fetchers.submit(self._fetch, _Fetch(seq, salt, hashes, local, always=handed_over))
        return True

    def has_ready(self) -> bool:
        return bool(self._ready or self._delivered)

    def take_ready(self) -> list[Sequence]:
        """Requests whose lookup is done, their fetched blocks installed; the engine schedules them. Handed-over
        prefills whose blocks are stored get their final chunk here."""
        with self._lock:
            jobs, self._ready = list(self._ready), deque()
            delivered, self._delivered = self._delivered, []
        for stream, chunk in delivered:
            stream.put(chunk)
        admitted = []
        for job in jobs:
            if job.seq.status is Status.FINISHED:       # aborted while held
                continue
            if job.tensors:
                if job.salt == self.engine.salt_of(job.seq):
                    self._install(job)
                else:
                    self.counters["l3_stale_dropped"] += len(job.tensors)
            admitted.append(job.seq)
        return admitted

    def _install(self, job: _Fetch) -> None:
        blocks, size = self.blocks, self.blocks.block_size
        local = [h for h in job.hashes[:job.local] if h in blocks.by_hash]
        for block_hash in local:
            blocks.touch(block_hash)                  # installing must not evict the local prefix
        local_free = sum(1 for h in local if blocks.blocks[blocks.by_hash[h]].ref_count == 0)
        rest = blocks.blocks_needed(blocks.slots_at_admission(job.seq)) - job.local - len(job.tensors)
        room = blocks.num_free - local_free - max(0, rest)
        for offset, tensor in enumerate(job.tensors[:max(0, room)]):
            index = job.local + offset
            tokens = job.seq.token_ids[index * size:(index + 1) * size]
            block_id = blocks.install(job.hashes[index], tokens)
            if block_id is not None:
                self.kv.keys[:, block_id].copy_(tensor[0])
                self.kv.values[:, block_id].copy_(tensor[1])
                routing = job.routing[offset] if offset < len(job.routing) else None
                self.kv.install_routing(block_id, routing)
                self.counters["l3_fetched_blocks"] += 1
                self.counters["l3_fetched_routing"] += routing is not None
            self._mark_in_l3(job.hashes[index])

    def after_step(self, work: list[Work], seconds: float) -> None:
        """Update the speed figures, log the step's KV events, and queue new blocks for publishing."""
        fed = sum(item.end - item.start for item in work)
        if fed > len(work):
            if fed >= 16 and seconds > 0:
                self.prefill_tps.update(fed / seconds)
        else:
            self.decode_step_s.update(seconds)
        stored, evicted = self.blocks.drain_events()
        self.events.record(stored, evicted)
        if self.client is None or not stored:
            return
        version = self.engine.weight_version
        if any(item.seq.kv_version != version for item in work):
            return          # a request continued across a weight swap: its new blocks mix versions
        keys, values = self.kv.keys, self.kv.values
        for block_hash in stored:
            block_id = self.blocks.by_hash.get(block_hash)
            if block_hash in self._in_l3 or block_id is None:
                continue
            if self._publish.full():
                self.counters["l3_publish_dropped"] += 1
                continue
            self._publish.put_nowait((block_hash, torch.stack((keys[:, block_id], values[:, block_id])),
                                      self._routing_copy(block_id)))
            self._mark_in_l3(block_hash)

    def hand_over(self, seq: Sequence) -> Callable[[TokenChunk], None]:
        """For a prefill-only request as it finishes (engine thread, its blocks still held): copy its prompt's full
        blocks and return how to deliver its final chunk: once a worker has stored the blocks in L3, with their
        count in ``handover_blocks`` (0 where storing failed: the decode actor then recomputes them)."""
        size = self.blocks.block_size
        count = (seq.num_prompt - 1) // size      # a prompt's last token is always computed: its block is not reused
        hashes = list(seq.hashes(self.engine.salt(seq.kv_version), size, count)[:count])
        block_ids = seq.block_table[:count]
        tensors = [torch.stack((self.kv.keys[:, b], self.kv.values[:, b])) for b in block_ids]
        routing = [self._routing_copy(b) for b in block_ids]
        stream = seq.stream

        def store_then_deliver(chunk: TokenChunk) -> None:
            def run() -> None:
                try:
                    if hashes:
                        self._put(list(zip(hashes, tensors, routing, strict=True)), raise_errors=True)
                        for block_hash in hashes:
                            self._mark_in_l3(block_hash)
                    chunk.handover_blocks = len(hashes)
                    self.counters["l3_handovers"] += 1
                except Exception:
                    self.counters["l3_handover_failures"] += 1
                    log.exception("handing %d prompt blocks over through L3 failed; the decode actor recomputes them",
                                  len(hashes))
                with self._lock:              # delivered by the engine thread, like every other chunk
                    self._delivered.append((stream, chunk))
                self.engine.wake()

            self._handovers.submit(run)

        return store_then_deliver

    def _routing_copy(self, block_id: int) -> torch.Tensor | None:
        """A copy of a block's routing for a worker to publish (checked there, off the engine thread)."""
        return None if self.routing_shape is None else self.kv.block_routing(block_id).clone()

    def _mark_in_l3(self, block_hash: bytes) -> None:
        self._in_l3[block_hash] = None
        self._in_l3.move_to_end(block_hash)
        while len(self._in_l3) > 4 * len(self.blocks.blocks) + 1024:
            self._in_l3.popitem(last=False)

    # ------------------------------------------------------------------ workers

    def _fetch(self, job: _Fetch) -> None:
        try:
            wanted = job.hashes[job.local:]
            started = time.perf_counter()
            count = self.client.lookup(wanted)
            self.lookup_s.update(time.perf_counter() - started)
            self.counters["l3_lookups"] += 1
            if count and self.fetch_policy == "auto" and not job.always:
                fetch_s = self.lookup_s.value + count * self.block_bytes / self.fetch_bps.value
                if fetch_s >= count * self.blocks.block_size / self.prefill_tps.value:
                    self.counters["l3_fetch_skipped"] += 1
                    count = 0
            if count:
                chain = wanted[:count]
                names = chain + ([routing_block_hash(h) for h in chain] if self.routing_shape else [])
                started = time.perf_counter()
                found = self.client.get(names)
                took = time.perf_counter() - started
                fetched = [found[h] for h in chain[:leading(chain, found.__contains__)]]
                if fetched and took > 0:
                    self.fetch_bps.update(len(fetched) * self.block_bytes / took)
                job.tensors = self._tensors(fetched)
                if self.routing_shape is not None:
                    job.routing = [self._routing_ids(found.get(routing_block_hash(block.block_hash)))
                                   for block in fetched[:len(job.tensors)]]
        except Exception:
            self.counters["l3_fetch_failures"] += 1
            log.exception("L3 fetch failed; the request recomputes its prompt")
        finally:
            with self._lock:
                self._ready.append(job)
            self.engine.wake()

    def _tensors(self, fetched: list[KVBlock]) -> list[torch.Tensor]:
        tensors = []
        for block in fetched:
            meta = block.meta
            if meta.dtype != self.dtype_name or meta.shape != self.block_shape:
                log.error("L3 block %s has %s %s, this engine needs %s %s: not used", meta.block_hash.hex()[:12],
                          meta.dtype, list(meta.shape), self.dtype_name, list(self.block_shape))
                break
            raw = torch.frombuffer(bytearray(block.data), dtype=torch.uint8)
            tensors.append(raw.view(self.dtype).reshape(self.block_shape).to(self.kv.keys.device))
        return tensors

    def _routing_ids(self, block: KVBlock | None) -> torch.Tensor | None:
        """A fetched routing block as the KV cache keeps routing, or None where it is absent or malformed."""
        if block is None:
            return None
        meta = block.meta
        if meta.dtype != self.routing_dtype_name or meta.shape != self.routing_shape:
            log.error("L3 routing block %s has %s %s, this engine needs %s %s: its positions' routing is unknown",
                      meta.block_hash.hex()[:12], meta.dtype, list(meta.shape), self.routing_dtype_name,
                      list(self.routing_shape))
            return None
        raw = torch.frombuffer(bytearray(block.data), dtype=torch.uint8)
        ids = raw.view(self.routing_dtype).reshape(self.routing_shape).to(torch.int32)
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_experts:
            log.error("L3 routing block %s names experts outside [0, %d): its positions' routing is unknown",
                      meta.block_hash.hex()[:12], self.num_experts)
            return None
        return ids.to(self.kv.keys.device)

    def _publish_loop(self) -> None:
        while True:
            item = self._publish.get()
            batch = [item]
            while item is not None and len(batch) < 64:
                try:
                    item = self._publish.get_nowait()
                except queue.Empty:
                    break
                batch.append(item)
            live = [b for b in batch if b is not None]
            if live:
                self._put(live)
            if len(live) < len(batch):
                return

    def _put(self, batch: list[tuple[bytes, torch.Tensor, torch.Tensor | None]], raise_errors: bool = False) -> None:
        try:
            blocks, routed = [], 0
            for block_hash, tensor, routing in batch:
                blocks.append(KVBlock.build(block_hash, self.blocks.block_size, self.dtype_name, self.block_shape,
                                            tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()))
                routing = None if routing is None else routing.cpu()
                if routing is not None and bool((routing >= 0).all()):     # a block fetched without routing: none
                    blocks.append(KVBlock.build(routing_block_hash(block_hash), self.blocks.block_size,
                                                self.routing_dtype_name, self.routing_shape,
                                                routing.to(self.routing_dtype).contiguous().numpy().tobytes()))
                    routed += 1
            self.client.put(blocks)
            self.counters["l3_published_blocks"] += len(batch)
            self.counters["l3_published_routing"] += routed
        except Exception:
            if raise_errors:
                raise
            self.counters["l3_publish_failures"] += 1
            log.exception("publishing %d blocks to L3 failed", len(batch))

    # ------------------------------------------------------------------ figures

    def layout(self) -> router_pb2.KVCacheLayout:
        engine = self.engine
        return router_pb2.KVCacheLayout(
            model_id=engine.config.model_id, weight_version=engine.weight_version, variant=engine.variant,
            block_size=self.blocks.block_size, block_bytes=self.block_bytes, num_blocks=len(self.blocks.blocks),
            max_running=engine.config.max_num_seqs, l3=self.client is not None)

    def stats(self) -> dict[str, float]:
        return {"prefill_tokens_per_s": self.prefill_tps.value, "decode_step_s": self.decode_step_s.value,
                "l3_fetch_bytes_per_s": self.fetch_bps.value if self.client else 0.0,
                "l3_lookup_s": self.lookup_s.value if self.client else 0.0,
                **{k: float(v) for k, v in self.counters.items()}}

    def describe(self) -> tuple[router_pb2.KVCacheLayout, dict[str, float]]:
        """For the KV event source: the layout and the figures a router needs."""
        stats = self.engine.stats()
        keep = ("running", "waiting", "kv_used_frac", "prefill_tokens_per_s", "decode_step_s", "l3_fetch_bytes_per_s",
                "l3_lookup_s", "tokens_per_s")
        return self.layout(), {k: stats[k] for k in keep if k in stats}

    def close(self) -> None:
        self._closed = True
        if self._fetchers is not None:
            self._fetchers.shutdown(wait=True, cancel_futures=True)
        if self._handovers is not None:
            self._handovers.shutdown(wait=True)          # a finished prefill's chunk is delivered, not dropped
            with self._lock:
                delivered, self._delivered = self._delivered, []
            for stream, chunk in delivered:
                stream.put(chunk)
        if self._publisher is not None:
            try:
                self._publish.put(None, timeout=5)
            except queue.Full:
                log.warning("the L3 publish queue did not drain; dropping what is left")
            self._publisher.join(timeout=10)
        if self.client is not None:
            self.client.close()


def kv_connector(engine, l3_cache: str | None, fetch: str, api_key: str | None):
    """The torch engine's KV connector: KV events for routers always, the L3 cache when ``l3_cache`` names its
    servers; raises ValueError for a bad server list."""
    from forge.actors.engine.l3 import KVConnector

    client = None
    if l3_cache:
        from forge.kv.client import CacheClient

        client = CacheClient(l3_cache, api_key=api_key)
        log.info("L3 KV cache on %s (fetch: %s)", ", ".join(client.servers), fetch)
    return KVConnector(engine, client, fetch=fetch)
