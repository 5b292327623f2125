"""Group commit: one writer thread drains the queue of pending write requests, applies them in one LMDB
transaction (each in a nested transaction, so a refused request changes nothing), commits durably, and only then
runs what the applied requests asked to follow their commit (``Txn.on_commit``) and resolves their futures. A full
map is grown and the batch replayed."""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import lmdb

from forge.pool.errors import PoolClosedError, PoolError
from forge.pool.layout import PoolState
from forge.pool.store import Store, Txn, lmdb_failure

log = logging.getLogger(__name__)

Operation = Callable[[Txn, PoolState], Any]


@dataclass
class _Request:
    apply: Operation
    kind: str
    future: Future = field(default_factory=Future)
    submitted: float = field(default_factory=time.perf_counter)


class WriterMetrics:
    """Figures of the writer since it started, and over the last ``horizon_s`` seconds."""

    def __init__(self, horizon_s: float = 10.0, samples: int = 1024) -> None:
        self.horizon_s = horizon_s
        self.started = time.monotonic()
        self.commits = 0
        self.requests = 0
        self.appends = 0
        self.failed_commits = 0
        self.map_grows = 0
        self._recent: collections.deque[tuple[float, int]] = collections.deque()    # (time, appends) per commit
        self._commit_s: collections.deque[float] = collections.deque(maxlen=samples)
        self._batch: collections.deque[int] = collections.deque(maxlen=samples)
        self._ack_s: collections.deque[float] = collections.deque(maxlen=samples)
        self._lock = threading.Lock()

    def record(self, batch: int, appends: int, commit_s: float, ack_s: list[float]) -> None:
        now = time.monotonic()
        with self._lock:
            self._ack_s.extend(ack_s)
            self.commits += 1
            self.requests += batch
            self.appends += appends
            self._recent.append((now, appends))
            while self._recent and self._recent[0][0] < now - self.horizon_s:
                self._recent.popleft()
            self._commit_s.append(commit_s)
            self._batch.append(batch)

    def gauges(self) -> dict[str, float]:
        now = time.monotonic()
        with self._lock:
            span = min(self.horizon_s, max(now - self.started, 1e-3))
            recent = [(t, n) for t, n in self._recent if t >= now - self.horizon_s]
            latencies = sorted(self._commit_s)
            acks = sorted(self._ack_s)
            batches = list(self._batch)
            figures = {"appends_per_s": sum(n for _, n in recent) / span, "commits_per_s": len(recent) / span,
                       "commits_total": float(self.commits), "requests_total": float(self.requests),
                       "appends_total": float(self.appends), "failed_commits": float(self.failed_commits),
                       "map_grows": float(self.map_grows)}
        for name, values in (("commit_latency_ms", latencies), ("append_latency_ms", acks)):
            if values:
                figures[f"{name}_p50"] = 1e3 * values[len(values) // 2]
                figures[f"{name}_p99"] = 1e3 * values[min(len(values) - 1, int(0.99 * len(values)))]
        if batches:
            figures["batch_size_mean"] = sum(batches) / len(batches)
        return figures


class GroupCommitWriter:
    """The single writer of a pool in this process. ``submit`` returns a future resolved after the commit."""

    def __init__(self, store: Store, max_batch: int = 1024, name: str = "forge-pool-writer") -> None:
        self.store = store
        self.max_batch = max(1, max_batch)
        self.metrics = WriterMetrics()
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, apply: Operation, kind: str = "other") -> Future:
        request = _Request(apply, kind)
        with self._close_lock:
            if self._closed:
                raise PoolClosedError("the pool is closed")
            self._queue.put(request)
        return request.future

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, finish the queued ones, stop the thread."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    request = self._queue.get_nowait()
                except queue.Empty:
                    break
                if request is None:
                    stopping = True
                    break
                batch.append(request)
            try:
                self._commit(batch)
            except BaseException as exc:   # never let the writer thread die with requests waiting
                log.exception("pool writer failed")
                self._fail(batch, exc if isinstance(exc, PoolError) else PoolError(f"pool writer failed: {exc}"))

    def _fail(self, batch: list[_Request], error: BaseException) -> None:
        self.metrics.failed_commits += 1
        for request in batch:
            if not request.future.done():
                request.future.set_exception(type(error)(*error.args))

    def _commit(self, batch: list[_Request]) -> None:
        while True:
            started = time.perf_counter()
            try:
                outcomes = self._apply(batch)
                break
            except lmdb.MapFullError:
                self.store.grow()          # PoolFullError at the configured maximum: fails the batch
                self.metrics.map_grows += 1
            except lmdb.Error as exc:
                log.error("pool commit failed: %s", exc)
                self._fail(batch, lmdb_failure(exc, "commit"))
                return
        done = time.perf_counter()
        acks = [done - r.submitted for r, (ok, _) in zip(batch, outcomes, strict=True) if ok and r.kind == "append"]
        self.metrics.record(len(batch), len(acks), done - started, acks)
        for request, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                request.future.set_result(value)
            else:
                request.future.set_exception(value)

    def _apply(self, batch: list[_Request]) -> list[tuple[bool, Any]]:
        """Apply the batch in one transaction and commit it; MapFullError (and other LMDB errors) abort it all."""
        env = self.store.env
        txn = self.store.begin_write()
        try:
            tx = Txn(txn, self.store.dbs)
            state = tx.state()
            outcomes: list[tuple[bool, Any]] = []
            for request in batch:
                trial = dataclasses.replace(state)
                child = env.begin(write=True, parent=txn)
                child_tx = Txn(child, self.store.dbs)
                try:
                    value = request.apply(child_tx, trial)
                except lmdb.Error:
                    child.abort()
                    raise
                except PoolError as exc:
                    child.abort()
                    outcomes.append((False, exc))
                    continue
                except Exception as exc:
                    child.abort()
                    log.exception("pool request %s failed", request.kind)
                    outcomes.append((False, PoolError(f"internal error in {request.kind}: {exc}")))
                    continue
                child.commit()
                tx.on_commit.extend(child_tx.on_commit)
                state = trial
                outcomes.append((True, value))
            tx.put_state(state)
            txn.commit()
            txn = None
            for action in tx.on_commit:
                try:
                    action()
                except Exception:      # the batch is committed: its requests succeeded whatever happens here
                    log.exception("an action after a pool commit failed")
            return outcomes
        finally:
            if txn is not None:
                txn.abort()
