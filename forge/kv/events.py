"""KV events: which prefix blocks an actor stored and evicted, kept in a numbered log that routers poll
(``forge.v1.KVEventSource``).

Routers pull rather than actors push: a router that starts late, restarts or misses polls asks again and gets a
snapshot of every block held (its ``epoch`` differs, or the events it lacks were dropped from the bounded log), so
nothing needs acknowledging and no actor depends on a router being up.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable

import grpc

from forge.v1 import router_pb2, router_pb2_grpc

STORED, EVICTED = router_pb2.KVEvent.KIND_STORED, router_pb2.KVEvent.KIND_EVICTED


class KVEventLog:
    def __init__(self, max_events: int = 200_000) -> None:
        self.epoch = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._live: dict[bytes, None] = {}
        self._events: deque[tuple[int, int, bytes]] = deque(maxlen=max_events)
        self._sequence = 0

    @property
    def sequence(self) -> int:
        return self._sequence

    def __len__(self) -> int:
        return len(self._live)

    def record(self, stored: Iterable[bytes], evicted: Iterable[bytes]) -> None:
        """Evictions first: a block is evicted before its slot is reused for a block stored in the same step."""
        with self._lock:
            for kind, hashes in ((EVICTED, evicted), (STORED, stored)):
                for block_hash in hashes:
                    if kind == STORED:
                        self._live[block_hash] = None
                    else:
                        self._live.pop(block_hash, None)
                    self._sequence += 1
                    self._events.append((self._sequence, kind, block_hash))

    def poll(self, epoch: str, after: int, max_hashes: int = 100_000) -> router_pb2.KVEvents:
        """Events after ``after`` (at most ``max_hashes``), or a snapshot when they cannot be given."""
        with self._lock:
            oldest = self._events[0][0] if self._events else self._sequence + 1
            if epoch != self.epoch or after > self._sequence or after + 1 < oldest:
                return router_pb2.KVEvents(epoch=self.epoch, sequence=self._sequence, snapshot=True,
                                           events=[router_pb2.KVEvent(kind=STORED, block_hashes=list(self._live))])
            picked = []
            for event in reversed(self._events):
                if event[0] <= after:
                    break
                picked.append(event)
            picked = picked[::-1][:max_hashes]
        answer = router_pb2.KVEvents(epoch=self.epoch, sequence=picked[-1][0] if picked else after)
        for _, kind, block_hash in picked:
            if not answer.events or answer.events[-1].kind != kind:
                answer.events.add(kind=kind)
            answer.events[-1].block_hashes.append(block_hash)
        return answer


class KVEventSourceServicer(router_pb2_grpc.KVEventSourceServicer):
    """Serves an actor's KV event log, with its cache layout and load figures in every answer."""

    def __init__(self, log: KVEventLog, describe: Callable[[], tuple[router_pb2.KVCacheLayout, dict[str, float]]],
                 instance: str = "actor") -> None:
        self.log = log
        self.describe = describe
        self.instance = instance

    def PollKVEvents(self, request: router_pb2.PollKVEventsRequest, context: grpc.ServicerContext
                     ) -> router_pb2.KVEvents:
        if request.max_hashes < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_hashes must not be negative")
        answer = self.log.poll(request.epoch, request.after, request.max_hashes or 100_000)
        layout, figures = self.describe()
        answer.actor = self.instance
        answer.layout.CopyFrom(layout)
        answer.figures.update({k: float(v) for k, v in figures.items()})
        return answer
