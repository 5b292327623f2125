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

from forge.pool.errors import PoolError

PIECE_BYTES = 400           # a page's unused end against a piece's 22 bytes of key and node: least lost about here
_NUMBER = struct.Struct(">Q")
_PIECE = struct.Struct(">QI")


def _pieces(data: bytes) -> list[bytes]:
    return [data[start:start + PIECE_BYTES] for start in range(0, max(len(data), 1), PIECE_BYTES)]


def put_record(txn: lmdb.Transaction, db: lmdb._Database, number: int, data: bytes) -> None:
    """Write record ``number``, which must come after every stored record."""
    pieces = [(_PIECE.pack(number, piece), part) for piece, part in enumerate(_pieces(data))]
    _, added = txn.cursor(db=db).putmulti(pieces, append=True)
    if added != len(pieces):
        raise PoolError(f"pool is damaged: record {number} is not after every stored record")


def _piece_keys(cursor: lmdb.Cursor, number: int) -> bool:
    """Put ``cursor`` on the record's first piece; False when it has none."""
    return cursor.set_range(_NUMBER.pack(number)) and cursor.key()[:8] == _NUMBER.pack(number)


def read_record(txn: lmdb.Transaction, db: lmdb._Database, number: int) -> bytes | None:
    cursor = txn.cursor(db=db)
    if not _piece_keys(cursor, number):
        return None
    prefix, parts = _NUMBER.pack(number), []
    for key, part in cursor:
        if key[:8] != prefix:
            break
        parts.append(part)
    return b"".join(parts)


def add_to_record(txn: lmdb.Transaction, db: lmdb._Database, number: int, data: bytes) -> None:
    """Add ``data`` to the end of a stored record, as its next pieces."""
    cursor = txn.cursor(db=db)
    if not _piece_keys(cursor, number):
        raise PoolError(f"pool is damaged: record {number} is missing")
    prefix, count = _NUMBER.pack(number), 0
    for key in cursor.iternext(values=False):
        if key[:8] != prefix:
            break
        count += 1
    for piece, part in enumerate(_pieces(data), start=count):
        txn.put(_PIECE.pack(number, piece), part, db=db)


def delete_record(txn: lmdb.Transaction, db: lmdb._Database, number: int) -> None:
    cursor = txn.cursor(db=db)
    if not _piece_keys(cursor, number):
        return
    prefix = _NUMBER.pack(number)
    while cursor.key()[:8] == prefix and cursor.delete():
        pass


def record_number_of(key: bytes) -> int:
    """The record a piece's key belongs to."""
    return _NUMBER.unpack(key[:8])[0]
