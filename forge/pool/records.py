"""How a call's record is kept in the pool's ``records`` database: under its record number, given in append order, in
small pieces, written after every other record.

LMDB stores a value larger than half a page (about 2 KB of a 4 KiB page) apart, in whole pages of its own, so a
2.1 KB record would take 4 KiB and one of 8.1 KB 12 KiB; and appended values fill a page until the next one does not
fit, so a page ends short by up to a value. Pieces of at most ``PIECE_BYTES`` stay in the pages, and a page ends at
most a small piece short: whatever the records' lengths, about 88 % of the pages hold records (a piece's key and
LMDB's node cost 22 bytes), where whole records left 56-88 % (records of 2.3 KB: 56 %). A record is its pieces joined;
bytes added to a record later (a process reward: protobuf fields merge when messages are concatenated) are its next
pieces.
"""

from __future__ import annotations

import struct

import lmdb

from forge.pool import layout
from forge.pool.errors import PoolError

PIECE_BYTES = 400           # a page's unused end against a piece's 22 bytes of key and node: least lost about here
_PIECE = struct.Struct(">I")
_RECORD_KEY_BYTES = len(layout.record_key(0))


def _pieces(data: bytes) -> list[bytes]:
    return [data[start:start + PIECE_BYTES] for start in range(0, max(len(data), 1), PIECE_BYTES)]


def _damaged(record: bytes, what: str) -> PoolError:
    return PoolError(f"pool is damaged: record {layout.record_number(record)} {what}")


def put_record(txn: lmdb.Transaction, db: lmdb._Database, record: bytes, data: bytes) -> None:
    """Write the record whose key is ``record`` (``layout.record_key``), which must come after every stored record."""
    pieces = [(record + _PIECE.pack(piece), part) for piece, part in enumerate(_pieces(data))]
    _, added = txn.cursor(db=db).putmulti(pieces, append=True)
    if added != len(pieces):
        raise _damaged(record, "is not after every stored record")


def _pieces_of(cursor: lmdb.Cursor, record: bytes) -> list[tuple[bytes, bytes]]:
    """The record's (piece key, piece), in order; empty when it has none."""
    if not cursor.set_range(record):
        return []
    found = []
    for key, part in cursor:
        if key[:_RECORD_KEY_BYTES] != record:
            break
        found.append((key, part))
    return found


def read_record(txn: lmdb.Transaction, db: lmdb._Database, record: bytes) -> bytes | None:
    pieces = _pieces_of(txn.cursor(db=db), record)
    return b"".join(part for _, part in pieces) if pieces else None


def add_to_record(txn: lmdb.Transaction, db: lmdb._Database, record: bytes, data: bytes) -> None:
    """Add ``data`` to the end of a stored record, as its next pieces."""
    count = len(_pieces_of(txn.cursor(db=db), record))
    if not count:
        raise _damaged(record, "is missing")
    for piece, part in enumerate(_pieces(data), start=count):
        txn.put(record + _PIECE.pack(piece), part, db=db)


def delete_record(txn: lmdb.Transaction, db: lmdb._Database, record: bytes) -> None:
    for key, _ in _pieces_of(txn.cursor(db=db), record):
        txn.delete(key, db=db)


def record_of(piece_key: bytes) -> bytes:
    """The key of the record a piece belongs to."""
    return piece_key[:_RECORD_KEY_BYTES]
