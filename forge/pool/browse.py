"""Browsing a pool's recorded trajectories: sessions listed newest first with filters and pages, one session as a
transcript, and one row per call for export (``forge pool export``) and for ``forge dash``.

A page costs what it shows, not what the pool holds: the list walks the queue's entries from the tail and decodes
a session record (and its first and last call, for the weight versions) only until the page is full. ``Work``
counts what was decoded, so tests and benches can check that without a clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.pool import layout
from forge.pool.errors import InvalidRequestError, NotFoundError
from forge.pool.layout import EntryState
from forge.pool.pool import PoolReader
from forge.pool.sessions import SESSION_STATUS_NAMES
from forge.pool.store import Txn
from forge.v1 import common_pb2, pool_pb2

STATUSES = {name: value for value, name in SESSION_STATUS_NAMES.items()}
MAX_PAGE_SIZE = 500
MAX_PAGE = 1_000_000
EXPORT_ENTRIES_PER_READ = 64        # a long export reads in many short snapshots, not one long-lived one

Decode = Callable[[Sequence[int]], str]


@dataclass
class Work:
    """What a browse decoded: queue entries, session records and call records."""

    entries: int = 0
    sessions: int = 0
    calls: int = 0


def _bounds(low: float | None, high: float | None, what: str) -> None:
    for value in (low, high):
        if value is not None and not math.isfinite(value):
            raise InvalidRequestError(f"the {what} bounds must be finite numbers, got {value}")
    if low is not None and high is not None and low > high:
        raise InvalidRequestError(f"the {what} range is empty: minimum {low} > maximum {high}")


@dataclass(frozen=True)
class SessionFilter:
    """Which sessions to show. ``reward``: the sum of the session's outcome rewards (a session without any has
    none and is left out by a reward bound). ``version``: the weight versions of its tokens; a session matches
    when they overlap [min_version, max_version] (a session without calls is left out by a version bound)."""

    domain: str | None = None
    status: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    min_version: int | None = None
    max_version: int | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise InvalidRequestError(f"unknown status {self.status!r} (one of {', '.join(STATUSES)})")
        _bounds(self.min_reward, self.max_reward, "reward")
        _bounds(self.min_version, self.max_version, "weight version")

    @property
    def needs_versions(self) -> bool:
        return self.min_version is not None or self.max_version is not None

    @property
    def empty(self) -> bool:
        return self == SessionFilter()

    def matches_session(self, session: pool_pb2.SessionRecord) -> bool:
        if self.domain is not None and session.domain != self.domain:
            return False
        if self.status is not None and session.status != STATUSES[self.status]:
            return False
        if self.min_reward is not None or self.max_reward is not None:
            if not session.outcome_rewards:
                return False
            reward = reward_of(session)
            if (self.min_reward is not None and reward < self.min_reward) or (
                    self.max_reward is not None and reward > self.max_reward):
                return False
        return True

    def matches_versions(self, versions: tuple[int, int] | None) -> bool:
        if not self.needs_versions:
            return True
        if versions is None:
            return False
        low, high = versions
        return not ((self.min_version is not None and high < self.min_version)
                    or (self.max_version is not None and low > self.max_version))


def reward_of(session: pool_pb2.SessionRecord) -> float:
    return float(sum(session.outcome_rewards.values()))


def _call(tx: Txn, key: bytes, number: bytes, work: Work) -> pool_pb2.CallRecord:
    work.calls += 1
    call = pool_pb2.CallRecord.FromString(tx.record(number))
    call.index = layout.call_index_of(key)
    return call


def version_span(tx: Txn, session_id: str, work: Work) -> tuple[int, int] | None:
    """(lowest, highest) weight version of a session's tokens, from its first and last call only: an actor's
    versions never go down, so those two bound the rest."""
    prefix = layout.call_prefix(session_id)
    cursor = tx.cursor("calls")
    if not cursor.set_range(prefix) or not cursor.key().startswith(prefix):
        return None
    first = _call(tx, cursor.key(), cursor.value(), work)
    found = cursor.set_range(session_id.encode() + b"\x01")
    found = cursor.prev() if found else cursor.last()
    last = _call(tx, cursor.key(), cursor.value(), work) if found and cursor.key() != layout.call_key(
        session_id, first.index) else first
    versions = [*first.weight_versions, *last.weight_versions]
    return (min(versions), max(versions)) if versions else None


def _entries_newest_first(tx: Txn, work: Work) -> Iterator[EntryState]:
    cursor = tx.cursor("entries")
    if not cursor.last():
        return
    while True:
        work.entries += 1
        yield EntryState.from_bytes(cursor.value())
        if not cursor.prev():
            return


def session_summary(session: pool_pb2.SessionRecord, versions: tuple[int, int] | None) -> dict[str, Any]:
    return {
        "session_id": session.session_id, "task_id": session.task_id, "domain": session.domain,
        "group_id": session.group_id, "group_size": session.group_size, "queue_position": session.queue_position,
        "status": SESSION_STATUS_NAMES.get(session.status, "unknown"),
        "reward": reward_of(session) if session.outcome_rewards else None,
        "outcome_rewards": dict(sorted(session.outcome_rewards.items())),
        "metrics": dict(sorted(session.metrics.items())), "num_calls": session.num_calls,
        "started_at": session.started_at, "ended_at": session.ended_at, "failure_reason": session.failure_reason,
        "min_version": versions[0] if versions else None, "max_version": versions[1] if versions else None,
    }


@dataclass
class Page:
    """One page of the list. ``total``: the matching sessions, when known without reading them all (no filter, or
    the walk reached the queue's start)."""

    page: int
    page_size: int
    sessions: list[dict[str, Any]]
    has_more: bool
    total: int | None
    work: Work = field(default_factory=Work)


def _check_page(page: int, page_size: int) -> None:
    if not 1 <= page <= MAX_PAGE:
        raise InvalidRequestError(f"page must be in [1, {MAX_PAGE}], got {page}")
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise InvalidRequestError(f"page size must be in [1, {MAX_PAGE_SIZE}], got {page_size}")


def list_sessions(reader: PoolReader, where: SessionFilter | None = None, page: int = 1, page_size: int = 50,
                  work: Work | None = None) -> Page:
    """Page ``page`` (from 1) of the sessions matching ``where``, newest queue entry first (a group's sessions in
    the order they opened)."""
    _check_page(page, page_size)
    where, work = where or SessionFilter(), work if work is not None else Work()
    skip, rows, more = (page - 1) * page_size, [], False
    with reader.store.read() as tx:
        stored = tx.count("sessions")
        if where.empty and skip >= stored:
            return Page(page, page_size, [], False, stored, work)
        matched, walked_all = 0, True
        for entry in _entries_newest_first(tx, work):
            if where.empty and matched + len(entry.members) <= skip:
                matched += len(entry.members)          # a whole entry before the page: no record decoded
                continue
            for session_id in entry.members:
                session = _matching_session(tx, session_id, where, work)
                if session is None:
                    continue
                versions = version_span(tx, session_id, work) if where.needs_versions else None
                if not where.matches_versions(versions):
                    continue
                matched += 1
                if matched <= skip:
                    continue
                if len(rows) == page_size:
                    more = True
                    break
                if not where.needs_versions:
                    versions = version_span(tx, session_id, work)
                rows.append(session_summary(session, versions))
            if more:
                walked_all = False
                break
    total = stored if where.empty else (matched if walked_all else None)
    return Page(page, page_size, rows, more, total, work)


def read_session(reader: PoolReader, session_id: str) -> pool_pb2.SessionWithCalls:
    """The session ``session_id`` with its calls; NotFoundError for an id the pool does not hold."""
    if not session_id or len(session_id.encode()) > layout.MAX_ID_BYTES or "\0" in session_id:
        raise NotFoundError(f"unknown session {session_id!r}")
    return reader.get_session(session_id)


def split_messages(text: str) -> list[dict[str, str]]:
    """A rendered ChatML span (``<|im_start|>role\\n…<|im_end|>``) as messages; any other text as one untitled
    part (role "")."""
    if "<|im_start|>" not in text:
        return [{"role": "", "content": text}] if text else []
    out: list[dict[str, str]] = []
    head, *parts = text.split("<|im_start|>")
    if head.strip():
        out.append({"role": "", "content": head})
    for part in parts:
        role, _, content = part.partition("\n")
        out.append({"role": role.strip(), "content": content.replace("<|im_end|>", "").rstrip("\n")})
    return out


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def finish_name(value: int) -> str:
    try:
        return common_pb2.FinishReason.Name(value).removeprefix("FINISH_REASON_").lower()
    except ValueError:
        return str(value)


def _call_view(call: pool_pb2.CallRecord, previous: list[int], decode: Decode | None,
               piece: Callable[[int], str] | None) -> dict[str, Any]:
    prompt, completion = list(call.prompt_ids), list(call.completion_ids)
    shared = shared_prefix(previous, prompt)
    rewrite = bool(previous) and shared < len(previous)
    added = prompt[shared:]
    view: dict[str, Any] = {
        "index": call.index, "actor": call.actor, "finish_reason": finish_name(call.finish_reason),
        "adapter": call.adapter, "created_at": call.created_at, "total_s": call.timing.total_s,
        "prompt_tokens": len(prompt), "completion_tokens": len(completion),
        "shared_tokens": shared, "added_ids": added,
        "rewrite": {"kept": shared, "dropped": len(previous) - shared} if rewrite else None,
        "completion_ids": completion, "logprobs": [float(v) for v in call.logprobs],
        "weight_versions": list(call.weight_versions), "process_rewards": list(call.process_rewards),
    }
    if decode is not None:
        added_text = decode(added)
        view["added_text"] = added_text
        view["added_messages"] = split_messages(added_text)
        view["completion_text"] = decode(completion)
    if piece is not None:
        view["pieces"] = [piece(token) for token in completion]
    return view


def transcript(reader: PoolReader, session_id: str, decode: Decode | None = None,
               piece: Callable[[int], str] | None = None) -> dict[str, Any]:
    """A session as the pool recorded it: its summary and, per call, what its prompt added to the previous call's
    prompt and completion (or, after a context-management rewrite, how much of them it kept and dropped), its
    completion with the log-prob and weight version of every token, and its process rewards. ``decode`` (token
    ids to text) adds the text; ``piece`` (one token id to its text) the text of every completion token."""
    found = read_session(reader, session_id)
    calls = sorted(found.calls, key=lambda c: c.index)
    versions = [v for c in calls for v in c.weight_versions]
    out = session_summary(found.session, (min(versions), max(versions)) if versions else None)
    views, previous = [], []
    for call in calls:
        views.append(_call_view(call, previous, decode, piece))
        previous = list(call.prompt_ids) + list(call.completion_ids)
    out["calls"] = views
    return out


def group_sessions(reader: PoolReader, session_id: str) -> list[pool_pb2.SessionWithCalls]:
    """Every stored session (with its calls) of the group of ``session_id`` (that session alone when it has no
    group)."""
    found = read_session(reader, session_id)
    if not found.session.group_id:
        return [found]
    with reader.store.read() as tx:
        entry = tx.entry(found.session.queue_position)
        members = entry.members if entry is not None else [session_id]
        out = []
        for member in members:
            if tx.get("sessions", layout.session_key(member)) is not None:
                out.append(tx.session_with_calls(member))
    return out


def call_row(session: pool_pb2.SessionRecord, call: pool_pb2.CallRecord, decode: Decode | None) -> dict[str, Any]:
    """One exported row: a call with its session's and group's keys and rewards."""
    row: dict[str, Any] = {
        "session_id": session.session_id, "call_index": call.index, "group_id": session.group_id,
        "task_id": session.task_id, "domain": session.domain, "queue_position": session.queue_position,
        "status": SESSION_STATUS_NAMES.get(session.status, "unknown"),
        "reward": reward_of(session) if session.outcome_rewards else None,
        "outcome_rewards": json.dumps(dict(sorted(session.outcome_rewards.items()))),
        "process_rewards": [float(r) for r in call.process_rewards],
        "prompt_ids": list(call.prompt_ids), "completion_ids": list(call.completion_ids),
        "logprobs": [float(v) for v in call.logprobs], "weight_versions": list(call.weight_versions),
        "actor": call.actor, "finish_reason": finish_name(call.finish_reason), "created_at": call.created_at,
    }
    if decode is not None:
        row["prompt_text"] = decode(call.prompt_ids)
        row["completion_text"] = decode(call.completion_ids)
    return row


def _matching_session(tx: Txn, session_id: str, where: SessionFilter, work: Work) -> pool_pb2.SessionRecord | None:
    """The session's record (decoded and counted) when it passes ``where``'s session filters, else None."""
    data = tx.get("sessions", layout.session_key(session_id))
    if data is None:
        return None
    work.sessions += 1
    session = pool_pb2.SessionRecord.FromString(data)
    return session if where.matches_session(session) else None


def _matching_in(tx: Txn, entries: list[EntryState], where: SessionFilter,
                 work: Work) -> Iterator[pool_pb2.SessionWithCalls]:
    for entry in entries:
        for session_id in entry.members:
            session = _matching_session(tx, session_id, where, work)
            if session is None:
                continue
            if where.needs_versions and not where.matches_versions(version_span(tx, session_id, work)):
                continue
            found = pool_pb2.SessionWithCalls(session=session)
            tx.fill_calls(found, session_id)
            work.calls += len(found.calls)
            yield found


def matching_sessions(reader: PoolReader, where: SessionFilter | None = None,
                      work: Work | None = None) -> Iterator[pool_pb2.SessionWithCalls]:
    """Every session matching ``where`` with its calls, oldest queue entry first; read in short snapshots, so a
    long export never holds the writer's old pages."""
    where, work = where or SessionFilter(), work if work is not None else Work()
    start = 0
    while True:
        with reader.store.read() as tx:
            entries = []
            for entry in tx.entries(start, 1 << 63):
                work.entries += 1
                entries.append(entry)
                if len(entries) == EXPORT_ENTRIES_PER_READ:
                    break
            batch = list(_matching_in(tx, entries, where, work))
        yield from batch
        if len(entries) < EXPORT_ENTRIES_PER_READ:
            return
        start = entries[-1].position + 1


def call_rows(reader: PoolReader, where: SessionFilter | None = None, decode: Decode | None = None,
              work: Work | None = None) -> Iterator[dict[str, Any]]:
    """One row per call of the matching sessions (see ``call_row``), oldest first."""
    for found in matching_sessions(reader, where, work):
        for call in sorted(found.calls, key=lambda c: c.index):
            yield call_row(found.session, call, decode)
