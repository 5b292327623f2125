"""The on-disk layout of the pool: LMDB named databases, key encodings and the small internal records.

Databases (all keys byte-ordered, so cursors iterate in queue and call order):

- ``meta``      ``b"state"`` -> :class:`PoolState` (JSON): head, tail, consume seq, committed cursor, counters.
- ``sessions``  session id (UTF-8) -> ``forge.v1.SessionRecord``.
- ``calls``     session id + ``b"\\0"`` + index (u32 big-endian) -> the call's record number (u64 big-endian).
- ``records``   record number + piece (u32 big-endian) -> a piece of a ``forge.v1.CallRecord`` as appended (a
  creation time or an assigned index, when missing, merged in as protobuf fields appended to the bytes), its prompt
  ids after those it shares with the previous call's prompt and completion (``forge.pool.shared_prompts``). Numbers
  are given in append order and records are cut in pieces that fit in a page (``forge.pool.records``), so records fill
  their pages whole however many sessions are appending at once and however long they are; keyed by session, as
  ``calls`` is, they would land at random and leave a third of each page empty.
- ``entries``   queue position (u64 big-endian) -> :class:`EntryState` (JSON): group, size, members, counts, status.
- ``groups``    group id (UTF-8) -> queue position of the group's entry.
- ``open``      session id -> last activity (f64 big-endian, unix seconds) of every open session.
- ``pending``   queue position -> b"" for every PENDING entry.
- ``consumes``  consume seq (u64 big-endian) -> :class:`ConsumeLog` (JSON), kept until the cursor is committed.
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass, field, fields
from typing import Any

from forge.v1 import pool_pb2

FORMAT_VERSION = 3          # 2: a call's prompt may be stored after the ids it shares with the previous call;
                            # 3: records are keyed by record number (``forge.pool.migrate`` moves older pools)
DATABASES = ("meta", "sessions", "calls", "records", "entries", "groups", "open", "pending", "consumes")
STATE_KEY = b"state"
MAX_ID_BYTES = 256          # LMDB keys are at most 511 bytes

PENDING = pool_pb2.ENTRY_STATUS_PENDING
COMPLETED = pool_pb2.ENTRY_STATUS_COMPLETED
CONSUMED = pool_pb2.ENTRY_STATUS_CONSUMED
FAILED = pool_pb2.ENTRY_STATUS_FAILED

_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_U32 = struct.Struct(">I")


def position_key(position: int) -> bytes:
    return _U64.pack(position)


def position_of(key: bytes) -> int:
    return _U64.unpack(key)[0]


def seq_key(seq: int) -> bytes:
    return _U64.pack(seq)


def session_key(session_id: str) -> bytes:
    return session_id.encode()


def call_prefix(session_id: str) -> bytes:
    return session_id.encode() + b"\0"


def call_key(session_id: str, index: int) -> bytes:
    return call_prefix(session_id) + _U32.pack(index)


def call_index_of(key: bytes) -> int:
    return _U32.unpack(key[-4:])[0]


def record_key(number: int) -> bytes:
    return _U64.pack(number)


def record_number(key: bytes) -> int:
    return _U64.unpack(key)[0]


def pack_time(t: float) -> bytes:
    return _F64.pack(t)


def unpack_time(data: bytes) -> float:
    return _F64.unpack(data)[0]


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


class _Json:
    """JSON (de)serialisation of a flat dataclass; unknown keys are ignored, missing ones take their defaults."""

    def to_bytes(self) -> bytes:
        # The instance's fields as they are, in field order: asdict() would deep-copy each value first, and the
        # pool's state is written in every transaction.
        return json.dumps(vars(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Any:
        names = _field_names(cls)
        return cls(**{k: v for k, v in json.loads(data).items() if k in names})


@dataclass
class PoolState(_Json):
    """Everything about the queue as a whole, rewritten in every write transaction."""

    version: int = FORMAT_VERSION
    head: int = 0                 # first position neither consumed nor failed
    tail: int = 0                 # next position to assign
    retained_from: int = 0        # first position whose entry retention has not deleted
    seq: int = 0                  # consumes applied
    committed_seq: int = 0
    committed_head: int = 0
    pending: int = 0              # entries by status (consumed and failed count deleted entries too)
    completed: int = 0
    consumed: int = 0
    failed: int = 0
    sessions: int = 0             # opened, ever
    calls: int = 0                # appended, ever
    records: int = 0              # record numbers given, ever (the next record's number)
    created_at: float = 0.0


@dataclass
class EntryState(_Json):
    """One queue entry: a group of ``size`` sessions (a single session when the group id is empty)."""

    position: int
    group_id: str = ""
    size: int = 1
    status: int = PENDING
    members: list[str] = field(default_factory=list)
    closed: int = 0
    failed: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0       # last open or close of one of its sessions
    done_at: float = 0.0          # completed or failed
    consumed_at: float = 0.0      # consumed or declared failed by the learner

    @property
    def completed_sessions(self) -> int:
        return self.closed - self.failed

    def header(self) -> pool_pb2.QueueEntry:
        return pool_pb2.QueueEntry(position=self.position, group_id=self.group_id, status=self.status)


@dataclass
class ConsumeLog(_Json):
    """What one consume changed, so that it can be undone until the cursor is committed."""

    seq: int
    status: int                   # CONSUMED or FAILED
    previous: list[list[int]]     # [position, status before]
    head_after: int
    at: float = 0.0
