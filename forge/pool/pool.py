"""The in-process pool API: ``Pool`` (the writer: sessions, calls, the learner's consumes and cursor) and
``PoolReader`` (read-only, e.g. from another process on the same host: window fetch, sessions, cursor, figures)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from forge.pool import fifo, sessions
from forge.pool.config import PoolConfig
from forge.pool.errors import PoolClosedError, PoolError
from forge.pool.last_calls import LastCalls
from forge.pool.layout import EntryState, PoolState
from forge.pool.store import Store, Txn, open_store
from forge.pool.writer import GroupCommitWriter
from forge.v1 import pool_pb2

log = logging.getLogger(__name__)


class PoolReader:
    """A read-only view of the pool at ``path``. Each call reads one consistent snapshot; LMDB readers never block
    the writer nor wait for it, in this process or another one."""

    def __init__(self, path: str | os.PathLike, *, _store: Store | None = None) -> None:
        self.store = _store or open_store(path, readonly=True)
        self.path = self.store.path
        self.started = time.time()

    def _read(self) -> contextlib.AbstractContextManager[Txn]:
        if getattr(self, "_closed", False):
            raise PoolClosedError("the pool is closed")
        return self.store.read()

    def fetch(self, window: int, max_entries: int = 0, include_calls: bool = False,
              max_bytes: int = 0) -> pool_pb2.FetchResponse:
        """Completed entries in [head, head + window - 1], in queue order (nothing beyond the window, even if
        complete); with ``include_calls`` each entry carries its sessions and their calls. ``max_bytes`` (> 0): only
        the leading entries that fit a response of that size (see ``fifo.fetch``)."""
        with self._read() as tx:
            return fifo.fetch(tx, window, max_entries, include_calls, max_bytes)

    def get_session(self, session_id: str) -> pool_pb2.SessionWithCalls:
        with self._read() as tx:
            return tx.session_with_calls(session_id)

    def cursor(self) -> pool_pb2.Cursor:
        with self._read() as tx:
            return fifo.cursor_of(tx.state())

    def state(self) -> PoolState:
        with self._read() as tx:
            return tx.state()

    def entries(self, start: int | None = None, limit: int = 100) -> list[EntryState]:
        """Queue entries from ``start`` (default: the head) on, any status, at most ``limit``."""
        with self._read() as tx:
            first = tx.state().head if start is None else start
            found = []
            for entry in tx.entries(first, 1 << 63):
                if len(found) >= limit:
                    break
                found.append(entry)
            return found

    def stats(self) -> dict[str, float]:
        """Figures of the pool (names as in the Stats RPC's gauges, see docs/pool.md)."""
        now = time.time()
        with self._read() as tx:
            state = tx.state()
            head = tx.entry(state.head) if state.head < state.tail else None
            figures = {
                "head": state.head, "tail": state.tail, "queued": state.pending, "completed": state.completed,
                "consumed": state.consumed, "failed": state.failed, "in_queue": state.tail - state.head,
                "seq": state.seq, "committed_seq": state.committed_seq, "sessions": state.sessions,
                "calls": state.calls, "sessions_open": tx.count("open"), "sessions_stored": tx.count("sessions"),
                "calls_stored": tx.count("calls"), "entries_stored": tx.count("entries"),
                "head_age_s": max(0.0, now - head.created_at) if head else 0.0,
            }
        figures.update(bytes_on_disk=self.store.bytes_on_disk(), bytes_used=self.store.bytes_used(),
                       map_size=self.store.map_size)
        return {name: float(value) for name, value in figures.items()}

    def close(self) -> None:
        if not getattr(self, "_closed", False):
            self._closed = True
            self.store.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Pool(PoolReader):
    """The pool at ``path`` (a directory, created if missing), open for writing.

    Every write is applied by one writer thread that commits many requests per durable transaction (group commit)
    and returns only after the commit: an acknowledged call survives any crash. Bad requests raise a
    :class:`~forge.pool.errors.InvalidRequestError` (a ``ValueError``) and change nothing."""

    def __init__(self, path: str | os.PathLike, config: PoolConfig | None = None, **settings: Any) -> None:
        self.config = dataclasses.replace(config or PoolConfig(), **settings)
        store = open_store(path, map_size=self.config.map_size, max_map_size=self.config.max_map_size,
                           sync=self.config.sync)
        if store.has_writer:
            store.close()
            raise PoolError(f"{path} is already open for writing in this process; share that Pool")
        store.has_writer = True
        super().__init__(path, _store=store)
        self.writer = GroupCommitWriter(store, self.config.max_batch)
        self.last_calls = LastCalls(self.config.last_calls_bytes)     # the writer thread's alone
        self._stop = threading.Event()
        self._housekeeper: threading.Thread | None = None
        if self.config.session_timeout_s is not None or not self.config.retains_everything:
            self._housekeeper = threading.Thread(target=self._housekeep, name="forge-pool-housekeeping",
                                                 daemon=True)
            self._housekeeper.start()

    def _write(self, kind: str, apply: Any) -> Any:
        return self.writer.submit(apply, kind).result()

    # -- sessions and calls (the gateway) --

    def open_session(self, request: pool_pb2.OpenSessionRequest | None = None, /, **fields: Any
                     ) -> pool_pb2.SessionRecord:
        """Open a session (fields of OpenSessionRequest); its queue entry is its group's, created by the group's
        first session."""
        return self.open_session_async(request, **fields).result()

    def open_session_async(self, request: pool_pb2.OpenSessionRequest | None = None, /, **fields: Any) -> Future:
        """Queue a session's opening; the future gives its record once durably committed (or the error)."""
        checked = sessions.prepare_open(request if request is not None else pool_pb2.OpenSessionRequest(**fields))
        now = time.time()
        return self.writer.submit(lambda tx, st: sessions.open_session(tx, st, checked, now), "open")

    def append_call_async(self, record: pool_pb2.CallRecord) -> Future:
        """Queue a call; the future gives its index once it is durably committed (or the error)."""
        now = time.time()
        prepared = sessions.prepare_call(record, now)
        last = self.last_calls
        return self.writer.submit(lambda tx, st: sessions.append_call(tx, st, prepared, now, last), "append")

    def append_call(self, record: pool_pb2.CallRecord) -> int:
        """Record one call (its index must be the session's next, or negative for "the next") and return its index
        once durably committed."""
        return self.append_call_async(record).result()

    def add_process_reward(self, session_id: str, call_index: int, reward: float) -> None:
        request = pool_pb2.ProcessReward(session_id=session_id, call_index=call_index, reward=reward)
        self._write("reward", lambda tx, st: sessions.add_process_reward(tx, st, request))

    def close_session(self, request: pool_pb2.CloseSessionRequest | None = None, /, **fields: Any
                      ) -> pool_pb2.SessionRecord:
        """Close a session as completed (with outcome rewards and metrics) or failed (``failed=True``)."""
        return self.close_session_async(request, **fields).result()

    def close_session_async(self, request: pool_pb2.CloseSessionRequest | None = None, /, **fields: Any) -> Future:
        """Queue a session's closing; the future gives its record once durably committed (or the error)."""
        checked = sessions.prepare_close(request if request is not None else pool_pb2.CloseSessionRequest(**fields))
        now, least = time.time(), self.config.min_completed
        last = self.last_calls
        return self.writer.submit(lambda tx, st: sessions.close_session(tx, st, checked, least, now, last), "close")

    def expire_sessions(self, older_than_s: float) -> list[str]:
        """Close as failed ("timeout") the open sessions idle longer than ``older_than_s`` seconds; also settle
        groups that never filled up. Returns the expired session ids."""
        now, least = time.time(), self.config.min_completed
        last = self.last_calls
        expired = self._write("expire", lambda tx, st: sessions.expire(tx, st, older_than_s, least, now, last))
        if expired:
            log.info("expired %d idle sessions", len(expired))
        return expired

    # -- the learner's side --

    def consume(self, positions: Iterable[int], failed: bool = False, expected_seq: int | None = None,
                commit: bool = False) -> pool_pb2.Cursor:
        """Mark entries consumed (or failed) as one consume, numbered cursor.seq; the head moves past every
        leading consumed or failed entry. ``expected_seq``: refuse (CursorConflictError) if the cursor moved.
        ``commit``: also commit the cursor (no rewind past it)."""
        positions, now = list(positions), time.time()

        def apply(tx: Txn, st: PoolState) -> pool_pb2.Cursor:
            cursor = fifo.consume(tx, st, positions, failed, expected_seq, commit, now)
            if commit:
                fifo.retain(tx, st, self.config, now)
                cursor = fifo.cursor_of(st)
            return cursor

        return self._write("consume", apply)

    def commit_cursor(self, seq: int) -> pool_pb2.Cursor:
        """Declare that the learner's checkpoint holds every consume up to ``seq``: they become final and retention
        may delete their records."""
        now = time.time()

        def apply(tx: Txn, st: PoolState) -> pool_pb2.Cursor:
            fifo.commit_cursor(tx, st, seq)
            fifo.retain(tx, st, self.config, now)
            return fifo.cursor_of(st)

        return self._write("commit", apply)

    def rewind(self, seq: int) -> pool_pb2.Cursor:
        """Undo every consume after ``seq`` (at least the committed seq): a learner restarted from a checkpoint
        rewinds to the seq it saved, so it neither skips nor repeats entries."""
        now, least = time.time(), self.config.min_completed
        return self._write("rewind", lambda tx, st: fifo.rewind(tx, st, seq, least, now))

    def apply_retention(self) -> int:
        """Delete consumed records beyond the retention policy now; returns the number of entries deleted."""
        total = 0
        while True:
            now = time.time()
            deleted = self._write("retain", lambda tx, st, now=now: fifo.retain(tx, st, self.config, now))
            total += deleted
            if deleted < self.config.retention_batch:
                return total

    def stats(self) -> dict[str, float]:
        figures = super().stats()
        figures.update(self.writer.metrics.gauges())
        return figures

    def _housekeep(self) -> None:
        while not self._stop.wait(self.config.housekeeping_s):
            try:
                if self.config.session_timeout_s is not None:
                    self.expire_sessions(self.config.session_timeout_s)
                self.apply_retention()
            except PoolError as exc:
                log.warning("pool housekeeping failed: %s", exc)

    def close(self) -> None:
        """Finish the queued writes, then close the environment."""
        self._stop.set()
        if self._housekeeper is not None:
            self._housekeeper.join()
        self.writer.close()
        self.store.has_writer = False
        super().close()
