"""Moving a pool written by an older Forge to the current layout (``forge.pool.layout``).

Formats 1 and 2 kept each call's record in ``calls``, under its session's key; format 3 keeps it in ``records``, under
a record number given in append order, in pieces (``forge.pool.records``), and ``calls`` holds the number. The writer
that opens an older pool moves it in its first transaction, so a pool is either wholly moved or untouched, whenever
the process is stopped. A read-only opening cannot move it, and says so.
"""

from __future__ import annotations

import logging

import lmdb

from forge.pool import layout
from forge.pool.layout import PoolState
from forge.pool.records import put_record

log = logging.getLogger(__name__)

PROGRESS_EVERY = 100_000


def update_format(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database], state: PoolState) -> None:
    """Bring the calls of a pool of an older format to ``layout.FORMAT_VERSION`` (in ``txn``, a write transaction),
    and ``state`` with them; the caller writes the state."""
    total = txn.stat(dbs["calls"])["entries"]
    if total:
        log.info("moving the %d calls of this pool from format %d to %d", total, state.version, layout.FORMAT_VERSION)
    records = dbs["records"]
    calls = txn.cursor(db=dbs["calls"])
    moved, found = 0, calls.first()
    while found:
        number = layout.record_key(state.records)
        put_record(txn, records, number, calls.value())
        calls.put(calls.key(), number)          # the cursor stays on this call
        state.records += 1
        moved += 1
        if moved % PROGRESS_EVERY == 0:
            log.info("moved %d of %d calls", moved, total)
        found = calls.next()
    state.version = layout.FORMAT_VERSION
    if total:
        log.info("moved the pool's %d calls to format %d", moved, layout.FORMAT_VERSION)
