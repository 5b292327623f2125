"""The generation queue and the windowed FIFO: queue entries and their life cycle, the window fetch, consumes, the
cursor (commit and rewind) and retention of consumed entries. Every function runs inside one transaction."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from forge.pool import layout
from forge.pool.config import PoolConfig
from forge.pool.errors import ConflictError, CursorConflictError, InvalidRequestError, NotFoundError
from forge.pool.layout import COMPLETED, CONSUMED, FAILED, PENDING, ConsumeLog, EntryState, PoolState
from forge.pool.store import Txn
from forge.v1 import pool_pb2

_COUNTER = {PENDING: "pending", COMPLETED: "completed", CONSUMED: "consumed", FAILED: "failed"}
STATUS_NAMES = {PENDING: "pending", COMPLETED: "completed", CONSUMED: "consumed", FAILED: "failed"}


def set_status(tx: Txn, state: PoolState, entry: EntryState, status: int) -> None:
    """Move an entry to ``status``, keeping the counters and the pending index in step (the caller saves it)."""
    if entry.status == status:
        return
    setattr(state, _COUNTER[entry.status], getattr(state, _COUNTER[entry.status]) - 1)
    setattr(state, _COUNTER[status], getattr(state, _COUNTER[status]) + 1)
    key = layout.position_key(entry.position)
    if entry.status == PENDING:
        tx.delete("pending", key)
    elif status == PENDING:
        tx.put("pending", key, b"")
    entry.status = status


def new_entry(tx: Txn, state: PoolState, group_id: str, size: int, now: float) -> EntryState:
    entry = EntryState(position=state.tail, group_id=group_id, size=size, created_at=now, updated_at=now)
    state.tail += 1
    state.pending += 1
    tx.put("pending", layout.position_key(entry.position), b"")
    if group_id:
        tx.put("groups", group_id.encode(), layout.position_key(entry.position))
    return entry


def settle(tx: Txn, state: PoolState, entry: EntryState, min_completed: int, now: float) -> None:
    """A PENDING entry whose G sessions have all closed becomes COMPLETED, or FAILED when fewer than
    ``min_completed`` of them completed; a failed entry at the head moves the head on. Saves the entry."""
    if entry.status == PENDING and entry.closed >= entry.size:
        ok = entry.completed_sessions >= min(max(min_completed, 1), entry.size)
        set_status(tx, state, entry, COMPLETED if ok else FAILED)
        entry.done_at = now
    tx.put_entry(entry)
    if entry.status == FAILED and entry.position == state.head:
        advance_head(tx, state)


def advance_head(tx: Txn, state: PoolState) -> None:
    """Move the head past every leading consumed or failed entry."""
    for entry in tx.entries(state.head, state.tail):
        if entry.position != state.head or entry.status not in (CONSUMED, FAILED):
            break
        state.head += 1


def cursor_of(state: PoolState) -> pool_pb2.Cursor:
    return pool_pb2.Cursor(head=state.head, tail=state.tail, seq=state.seq, committed_seq=state.committed_seq,
                           committed_head=state.committed_head)


def _field_bytes(size: int) -> int:
    """Bytes a message of ``size`` bytes takes as an element of a repeated field numbered below 16."""
    return 1 + (max(size.bit_length(), 1) + 6) // 7 + size


def fetch(tx: Txn, window: int, max_entries: int = 0, include_calls: bool = False,
          max_bytes: int = 0) -> pool_pb2.FetchResponse:
    """Completed entries in [head, head + window - 1], in queue order; nothing beyond the window. With ``max_bytes``
    (a message limit), only the leading entries whose response fits in it: the caller fetches again for the others;
    an entry that alone does not fit is refused (InvalidRequestError), since no response could carry it."""
    if window < 1:
        raise InvalidRequestError(f"window must be at least 1 (got {window})")
    if max_entries < 0:
        raise InvalidRequestError(f"max_entries must be >= 0 (got {max_entries})")
    state = tx.state()
    response = pool_pb2.FetchResponse(head=state.head, tail=state.tail, seq=state.seq)
    size = response.ByteSize()
    for entry in tx.entries(state.head, min(state.tail, state.head + window)):
        if entry.status != COMPLETED:
            continue
        out = response.entries.add(position=entry.position, group_id=entry.group_id, status=entry.status)
        if include_calls:
            for session_id in entry.members:
                tx.session_with_calls(session_id, out.sessions.add())
        if max_bytes:
            size += _field_bytes(out.ByteSize())
            if size > max_bytes:
                if len(response.entries) == 1:
                    raise InvalidRequestError(
                        f"queue entry {entry.position} with its calls takes {size} bytes, more than one response may "
                        f"carry ({max_bytes}); read this pool in process (PoolReader or Pool on its directory)")
                del response.entries[-1]
                break
        if max_entries and len(response.entries) >= max_entries:
            break
    return response


def consume(tx: Txn, state: PoolState, positions: Iterable[int], failed: bool = False,
            expected_seq: int | None = None, commit: bool = False, now: float = 0.0) -> pool_pb2.Cursor:
    """Mark entries consumed (COMPLETED ones) or failed (COMPLETED or PENDING ones) as consume number seq + 1,
    then move the head past every leading consumed or failed entry."""
    positions = list(positions)
    if expected_seq is not None and expected_seq != state.seq:
        raise CursorConflictError(f"the cursor moved: its seq is {state.seq}, not the expected {expected_seq}")
    if not positions:
        raise InvalidRequestError("no positions to consume")
    if len(set(positions)) != len(positions):
        raise InvalidRequestError("a position is listed more than once")
    entries = []
    for position in positions:
        if position < 0 or position >= state.tail:
            raise NotFoundError(f"no queue entry at position {position} (the tail is {state.tail})")
        entry = tx.entry(position)
        if entry is None or entry.status in (CONSUMED, FAILED):
            now_status = "deleted" if entry is None else STATUS_NAMES[entry.status]
            raise ConflictError(f"queue entry {position} is already {now_status}")
        if entry.status == PENDING and not failed:
            raise ConflictError(f"queue entry {position} is not complete yet ({entry.closed} of {entry.size} "
                                f"sessions closed); only failed=True may take it")
        entries.append(entry)
    status = FAILED if failed else CONSUMED
    previous = []
    for entry in entries:
        previous.append([entry.position, entry.status])
        set_status(tx, state, entry, status)
        entry.consumed_at = now
        tx.put_entry(entry)
    state.seq += 1
    advance_head(tx, state)
    tx.put("consumes", layout.seq_key(state.seq),
           ConsumeLog(seq=state.seq, status=status, previous=previous, head_after=state.head, at=now).to_bytes())
    if commit:
        commit_cursor(tx, state, state.seq)
    return cursor_of(state)


def commit_cursor(tx: Txn, state: PoolState, seq: int) -> pool_pb2.Cursor:
    """Make every consume up to ``seq`` final: it can no longer be rewound and retention may delete it."""
    if seq > state.seq:
        raise InvalidRequestError(f"cannot commit seq {seq}: only {state.seq} consumes were applied")
    if seq < state.committed_seq:
        raise ConflictError(f"cannot commit seq {seq}: the cursor is already committed up to {state.committed_seq}")
    if seq > state.committed_seq:
        data = tx.get("consumes", layout.seq_key(seq))
        if data is None:
            raise NotFoundError(f"no log of consume {seq}")
        state.committed_head = ConsumeLog.from_bytes(data).head_after
        for number in range(state.committed_seq + 1, seq + 1):
            tx.delete("consumes", layout.seq_key(number))
        state.committed_seq = seq
    return cursor_of(state)


def rewind(tx: Txn, state: PoolState, seq: int, min_completed: int, now: float) -> pool_pb2.Cursor:
    """Undo every consume after ``seq``: their entries get back the status they had, and the head moves back."""
    if seq > state.seq:
        raise InvalidRequestError(f"cannot rewind to seq {seq}: only {state.seq} consumes were applied")
    if seq < state.committed_seq:
        raise ConflictError(f"cannot rewind to seq {seq}: consumes up to {state.committed_seq} are committed")
    for number in range(state.seq, seq, -1):
        data = tx.get("consumes", layout.seq_key(number))
        if data is None:
            raise NotFoundError(f"no log of consume {number}")
        for position, before in ConsumeLog.from_bytes(data).previous:
            entry = tx.entry(position)
            if entry is None:
                raise NotFoundError(f"queue entry {position} of consume {number} was deleted")
            set_status(tx, state, entry, before)
            entry.consumed_at = 0.0
            state.head = min(state.head, position)
            settle(tx, state, entry, min_completed, now)
        tx.delete("consumes", layout.seq_key(number))
    state.seq = seq
    advance_head(tx, state)
    return cursor_of(state)


def delete_entry(tx: Txn, entry: EntryState) -> None:
    """Delete an entry with its sessions and their calls."""
    for session_id in entry.members:
        tx.delete_calls(session_id)
        tx.delete("sessions", layout.session_key(session_id))
        tx.delete("open", layout.session_key(session_id))
    if entry.group_id and tx.get("groups", entry.group_id.encode()) == layout.position_key(entry.position):
        tx.delete("groups", entry.group_id.encode())
    tx.delete("pending", layout.position_key(entry.position))
    tx.delete("entries", layout.position_key(entry.position))


def retain(tx: Txn, state: PoolState, config: PoolConfig, now: float) -> int:
    """Delete the oldest committed consumed (or failed) entries beyond the retention policy, in queue order, at
    most ``config.retention_batch`` of them; returns how many were deleted."""
    if config.retains_everything:
        return 0
    deleted = 0
    candidates = list(itertools.islice(tx.entries(state.retained_from, state.committed_head), config.retention_batch))
    for entry in candidates:
        too_many = config.keep_consumed is not None and entry.position < state.committed_head - config.keep_consumed
        too_old = (config.keep_consumed_s is not None
                   and max(entry.consumed_at, entry.done_at) < now - config.keep_consumed_s)
        if entry.status not in (CONSUMED, FAILED) or not (too_many or too_old):
            break
        delete_entry(tx, entry)
        state.retained_from = entry.position + 1
        deleted += 1
    return deleted
