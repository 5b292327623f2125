"""The LMDB environment of a pool: opening it (read-write or read-only), typed access to its databases, map growth,
and reads that stay safe while the map grows."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lmdb

from forge.pool import layout, records
from forge.pool.errors import NotFoundError, PoolError, PoolFullError
from forge.pool.layout import EntryState, PoolState
from forge.pool.migrate import update_format
from forge.pool.shared_prompts import expand
from forge.v1 import pool_pb2

log = logging.getLogger(__name__)

DEFAULT_MAP_SIZE = 1 << 30          # 1 GiB to start; the file on disk only grows as records are written
DEFAULT_MAX_MAP_SIZE = 1 << 40      # 1 TiB
MAX_READERS = 1024


class _ResizeLock:
    """Many readers, or one resizer: the map may only be moved while no read transaction of this process is open."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._resizing = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


def lmdb_failure(exc: lmdb.Error, what: str) -> PoolError:
    """A pool error for an LMDB failure: PoolFullError when the disk (or file size limit) is full."""
    text = str(exc)
    full = isinstance(exc, lmdb.DiskError) or any(
        os.strerror(code) in text for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG))
    if full:
        return PoolFullError(f"pool is full ({what}: {text}); nothing of this request was recorded")
    if isinstance(exc, lmdb.PanicError):
        return PoolError(f"pool storage failed earlier and must be reopened ({what}: {text})")
    return PoolError(f"pool storage error ({what}: {text})")


class Txn:
    """A transaction with the pool's databases: typed reads for both kinds, writes for write transactions.
    ``on_commit``: what a write asks to be done once its changes are durably committed (the writer runs it)."""

    def __init__(self, txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> None:
        self.txn = txn
        self.dbs = dbs
        self.on_commit: list[Callable[[], None]] = []

    def get(self, db: str, key: bytes) -> bytes | None:
        return self.txn.get(key, db=self.dbs[db])

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self.txn.put(key, value, db=self.dbs[db])

    def delete(self, db: str, key: bytes) -> None:
        self.txn.delete(key, db=self.dbs[db])

    def cursor(self, db: str) -> lmdb.Cursor:
        return self.txn.cursor(db=self.dbs[db])

    def count(self, db: str) -> int:
        return self.txn.stat(self.dbs[db])["entries"]

    def state(self) -> PoolState:
        data = self.get("meta", layout.STATE_KEY)
        if data is None:
            raise PoolError("not a pool: its state record is missing")
        state = PoolState.from_bytes(data)
        if state.version > layout.FORMAT_VERSION:
            raise PoolError(f"pool format {state.version} is newer than this Forge understands "
                            f"({layout.FORMAT_VERSION})")
        return state

    def put_state(self, state: PoolState) -> None:
        self.put("meta", layout.STATE_KEY, state.to_bytes())

    def session(self, session_id: str) -> pool_pb2.SessionRecord | None:
        data = self.get("sessions", layout.session_key(session_id))
        return None if data is None else pool_pb2.SessionRecord.FromString(data)

    def require_session(self, session_id: str) -> pool_pb2.SessionRecord:
        session = self.session(session_id)
        if session is None:
            raise NotFoundError(f"unknown session {session_id!r}")
        return session

    def put_session(self, session: pool_pb2.SessionRecord) -> None:
        self.put("sessions", layout.session_key(session.session_id), session.SerializeToString())

    def entry(self, position: int) -> EntryState | None:
        data = self.get("entries", layout.position_key(position))
        return None if data is None else EntryState.from_bytes(data)

    def put_entry(self, entry: EntryState) -> None:
        self.put("entries", layout.position_key(entry.position), entry.to_bytes())

    def entries(self, start: int, stop: int) -> Iterator[EntryState]:
        """Entries with start <= position < stop, in queue order."""
        cursor = self.cursor("entries")
        if not cursor.set_range(layout.position_key(start)):
            return
        for key, value in cursor:
            if layout.position_of(key) >= stop:
                return
            yield EntryState.from_bytes(value)

    def call_numbers(self, session_id: str) -> Iterator[tuple[int, bytes]]:
        """(index, record key) of a session's calls, in order."""
        prefix = layout.call_prefix(session_id)
        cursor = self.cursor("calls")
        if not cursor.set_range(prefix):
            return
        for key, number in cursor:
            if not key.startswith(prefix):
                return
            yield layout.call_index_of(key), number

    def call_items(self, session_id: str) -> Iterator[tuple[int, bytes]]:
        """(index, stored CallRecord bytes) of a session's calls, in order."""
        for index, number in self.call_numbers(session_id):
            yield index, self.record(number)

    def record(self, number: bytes) -> bytes:
        """A stored CallRecord by its record key."""
        data = records.read_record(self.txn, self.dbs["records"], number)
        if data is None:
            raise PoolError(f"pool is damaged: record {layout.record_number(number)} is missing")
        return data

    def call_number(self, session_id: str, index: int) -> bytes | None:
        """The record key of one call, None when the session has no such call."""
        return self.get("calls", layout.call_key(session_id, index))

    def call_record(self, session_id: str, index: int) -> bytes | None:
        """The stored CallRecord bytes of one call, None when the session has no such call."""
        number = self.call_number(session_id, index)
        return None if number is None else self.record(number)

    def add_call(self, state: PoolState, session_id: str, index: int, data: bytes) -> None:
        """Store a new call's record under the next record number (after every record: it fills the last page)."""
        number = layout.record_key(state.records)
        records.put_record(self.txn, self.dbs["records"], number, data)
        self.put("calls", layout.call_key(session_id, index), number)
        state.records += 1

    def add_to_record(self, number: bytes, data: bytes) -> None:
        records.add_to_record(self.txn, self.dbs["records"], number, data)

    def delete_calls(self, session_id: str) -> None:
        for index, number in list(self.call_numbers(session_id)):
            records.delete_record(self.txn, self.dbs["records"], number)
            self.delete("calls", layout.call_key(session_id, index))

    def fill_calls(self, out: pool_pb2.SessionWithCalls, session_id: str) -> None:
        """The session's calls, each with its whole prompt (``forge.pool.shared_prompts``)."""
        first = len(out.calls)
        for index, data in self.call_items(session_id):
            call = out.calls.add()
            call.ParseFromString(data)
            call.session_id = session_id
            call.index = index
        expand(out.calls[first:])

    def session_with_calls(self, session_id: str, out: pool_pb2.SessionWithCalls | None = None
                           ) -> pool_pb2.SessionWithCalls:
        out = pool_pb2.SessionWithCalls() if out is None else out
        out.session.CopyFrom(self.require_session(session_id))
        self.fill_calls(out, session_id)
        return out


class Store:
    """The pool's LMDB environment at ``path`` (a directory). Read-only stores never create or change anything."""

    def __init__(self, path: str | os.PathLike, *, readonly: bool = False, map_size: int = DEFAULT_MAP_SIZE,
                 max_map_size: int = DEFAULT_MAX_MAP_SIZE, sync: bool = True) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._key, self._users = os.path.realpath(self.path), 1
        self.has_writer = False
        self.max_map_size = max(max_map_size, map_size)
        self._lock = _ResizeLock()
        if readonly and not (self.path / "data.mdb").exists():
            raise FileNotFoundError(f"{self.path} is not a pool (no data.mdb)")
        if not readonly:
            self.path.mkdir(parents=True, exist_ok=True)
        try:
            self.env = lmdb.open(str(self.path), map_size=map_size, max_dbs=len(layout.DATABASES) + 1,
                                 max_readers=MAX_READERS, readonly=readonly, create=not readonly, sync=sync,
                                 metasync=sync, readahead=False, subdir=True)
        except lmdb.Error as exc:
            raise lmdb_failure(exc, f"opening {self.path}") from exc
        self.env.reader_check()
        try:
            while True:
                try:
                    self.dbs = self._open_databases()
                    break
                except lmdb.MapResizedError:    # another process grew the map meanwhile
                    self.env.set_mapsize(0)
                except lmdb.MapFullError:       # moving an older pool's calls needs more room
                    self.grow()
        except lmdb.NotFoundError as exc:
            self.env.close()
            raise PoolError(f"{self.path} is not a pool (missing database: {exc})") from exc
        except Exception:
            self.env.close()
            raise

    def _open_databases(self) -> dict[str, lmdb._Database]:
        if self.readonly:
            meta = self.env.open_db(b"meta", create=False)
            with self.env.begin(db=meta) as txn:
                state = Txn(txn, {"meta": meta}).state()
            if state.version < layout.FORMAT_VERSION:
                raise PoolError(f"{self.path} is a pool of format {state.version}, written by an older Forge: open it "
                                f"once for writing (`forge pool serve`, or a gateway with --pool) to move it to "
                                f"format {layout.FORMAT_VERSION}")
            return {name: self.env.open_db(name.encode(), create=False) for name in layout.DATABASES}
        with self.env.begin(write=True) as txn:
            dbs = {name: self.env.open_db(name.encode(), txn=txn) for name in layout.DATABASES}
            tx = Txn(txn, dbs)
            if tx.get("meta", layout.STATE_KEY) is None:
                tx.put_state(PoolState(created_at=time.time()))
            state = tx.state()
            if state.version < layout.FORMAT_VERSION:
                update_format(txn, dbs, state)
                tx.put_state(state)
        return dbs

    @contextlib.contextmanager
    def read(self) -> Iterator[Txn]:
        """A read transaction (a consistent snapshot) that the map cannot move under."""
        while True:
            with self._lock.shared():
                try:
                    txn = self.env.begin(write=False, buffers=False)
                except lmdb.MapResizedError:
                    txn = None
                if txn is not None:
                    tx = Txn(txn, self.dbs)
                    try:
                        yield tx
                    finally:
                        txn.abort()
                        # An aborted read transaction keeps its reader slot until the object is freed, and a raised
                        # error's traceback holds this frame and the caller's until the garbage collector runs:
                        # enough failed reads in between would fill the reader table (MDB_READERS_FULL).
                        tx.txn = txn = None
                    return
            self.adopt_map_size()

    def begin_write(self) -> lmdb.Transaction:
        while True:
            try:
                return self.env.begin(write=True)
            except lmdb.MapResizedError:
                self.adopt_map_size()

    def adopt_map_size(self) -> None:
        """Another process grew the map: take over its size."""
        with self._lock.exclusive():
            self.env.set_mapsize(0)

    @property
    def map_size(self) -> int:
        return self.env.info()["map_size"]

    def grow(self) -> int:
        """Double the map (up to ``max_map_size``); PoolFullError when it already is that large."""
        current = self.map_size
        if current >= self.max_map_size:
            raise PoolFullError(f"pool is full: its map reached the configured maximum of {self.max_map_size} bytes")
        new = min(self.max_map_size, current * 2)
        with self._lock.exclusive():
            self.env.set_mapsize(new)
        log.info("grew the pool map of %s from %d to %d bytes", self.path, current, new)
        return new

    def bytes_on_disk(self) -> int:
        try:
            return (self.path / "data.mdb").stat().st_blocks * 512
        except OSError:
            return 0

    def bytes_used(self) -> int:
        return (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]

    def close(self) -> None:
        with _REGISTRY_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            _REGISTRY.pop(self._key, None)
        self.env.close()


_REGISTRY: dict[str, Store] = {}
_REGISTRY_LOCK = threading.Lock()


def open_store(path: str | os.PathLike, *, readonly: bool = False, **settings: Any) -> Store:
    """The store at ``path``, shared within this process (LMDB allows one environment per file and process): a
    read-only user gets the environment already open here; a writer needs it open read-write."""
    key = os.path.realpath(path)
    with _REGISTRY_LOCK:
        store = _REGISTRY.get(key)
        if store is not None:
            if store.readonly and not readonly:
                raise PoolError(f"{path} is open read-only in this process; close its readers before opening it "
                                "for writing")
            store._users += 1
            return store
        store = Store(path, readonly=readonly, **settings)
        _REGISTRY[store._key] = store
        return store
