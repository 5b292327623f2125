"""vLLM's KV cache events as Forge's: the blocks a vLLM actor stores and evicts, renamed into Forge's hash chain
(``forge.kvhash``) and kept in a ``KVEventLog``, so that the cost-aware router sees a vLLM actor's cache as it sees
the torch engine's.

vLLM publishes its events on a ZeroMQ PUB socket (``KVEventsConfig``): each stored block comes with its token ids
and its parent's hash in vLLM's own scheme. The chain is rebuilt from those: a block's Forge hash is
``block_hash(parent's Forge hash, its token ids)``, rooted at the salt of the model and weight version. A block
whose parent is unknown (its event was missed: PUB/SUB drops under pressure) is skipped with its descendants; the
router then under-counts that actor's cache, which costs routing quality, never correctness. A weight swap clears
vLLM's prefix cache and changes the salt, so the log forgets every block.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import zmq

from forge.kv.events import KVEventLog
from forge.kvhash import block_hash, kv_salt
from forge.v1 import router_pb2

log = logging.getLogger(__name__)


class VllmKVEvents:
    """Follows vLLM's KV event stream at ``endpoint`` (vLLM binds it) into ``self.log``."""

    def __init__(self, endpoint: str, model_id: str, weight_version: Callable[[], int]) -> None:
        self.endpoint = endpoint
        self.model_id = model_id
        self.weight_version = weight_version
        self.log = KVEventLog()
        self._lock = threading.Lock()
        self._ours: dict[Any, bytes] = {}            # vLLM's block hash -> Forge's, for blocks vLLM holds
        self._salt_version = weight_version()
        self.counters = {"kv_events_received": 0, "kv_blocks_unchained": 0}
        self._closed = threading.Event()
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(endpoint)
        self._thread = threading.Thread(target=self._follow, name="vllm-kv-events", daemon=True)
        self._thread.start()

    def forget_all(self, version: int) -> None:
        """vLLM's prefix cache was cleared for ``version``: every block known so far is gone."""
        with self._lock:
            gone, self._ours = list(self._ours.values()), {}
            self._salt_version = version
        self.log.record((), gone)

    def _follow(self) -> None:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        while not self._closed.is_set():
            if not self._socket.poll(200):
                continue
            try:
                *_, payload = self._socket.recv_multipart()
                batch = decoder.decode(payload)
            except (zmq.ZMQError, msgspec.DecodeError) as exc:
                if not self._closed.is_set():
                    log.warning("unreadable KV event from vLLM: %s", exc)
                continue
            self.apply(batch.events)

    def apply(self, events: list[Any]) -> None:
        """Record vLLM's events (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) in Forge's names."""
        stored: list[bytes] = []
        evicted: list[bytes] = []
        with self._lock:
            salt = kv_salt(self.model_id, self._salt_version)
            for event in events:
                self.counters["kv_events_received"] += 1
                kind = type(event).__name__
                if kind == "BlockStored":
                    stored += self._chain(event, salt)
                elif kind == "BlockRemoved":
                    for theirs in event.block_hashes:
                        ours = self._ours.pop(theirs, None)
                        if ours is not None:
                            evicted.append(ours)
                elif kind == "AllBlocksCleared":
                    evicted += list(self._ours.values())
                    self._ours.clear()
        if stored or evicted:
            self.log.record(stored, evicted)

    def _chain(self, event: Any, salt: bytes) -> list[bytes]:
        parent = salt if event.parent_block_hash is None else self._ours.get(event.parent_block_hash)
        size = event.block_size
        hashes: list[bytes] = []
        for index, theirs in enumerate(event.block_hashes):
            if parent is None:
                self.counters["kv_blocks_unchained"] += len(event.block_hashes) - index
                break
            parent = block_hash(parent, event.token_ids[index * size:(index + 1) * size])
            self._ours[theirs] = parent
            hashes.append(parent)
        return hashes

    def layout(self, block_size: int, num_blocks: int, max_running: int) -> router_pb2.KVCacheLayout:
        return router_pb2.KVCacheLayout(model_id=self.model_id, weight_version=self._salt_version,
                                        block_size=block_size, num_blocks=num_blocks, max_running=max_running)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._socket.close()
        self._context.term()
