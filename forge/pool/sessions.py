"""Sessions and their calls: checking requests, opening a session into its group's queue entry, appending calls,
process rewards, closing, and expiring abandoned sessions. The write functions run inside one transaction."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

import numpy as np

from forge import expert_routing
from forge.pool import layout
from forge.pool.errors import ConflictError, InvalidRequestError, NotFoundError
from forge.pool.fifo import STATUS_NAMES, new_entry, settle
from forge.pool.last_calls import LastCall, LastCalls
from forge.pool.layout import COMPLETED, PENDING, PoolState
from forge.pool.shared_prompts import StoredIds, begins_with, ids_of, shared_with_previous
from forge.pool.store import Txn
from forge.v1 import pool_pb2

OPEN = pool_pb2.SESSION_STATUS_OPEN
SESSION_STATUS_NAMES = {pool_pb2.SESSION_STATUS_OPEN: "open", pool_pb2.SESSION_STATUS_COMPLETED: "completed",
                        pool_pb2.SESSION_STATUS_FAILED: "failed"}
MAX_LOGPROB = 1e-3      # log-probabilities are <= 0; allow rounding
ACTIVITY_RESOLUTION_S = 1.0     # last activity of a session is stored this coarsely (saves a write per call)


def check_id(value: str, what: str, required: bool = True) -> None:
    if not value:
        if required:
            raise InvalidRequestError(f"{what} is empty")
        return
    if "\0" in value or len(value.encode()) > layout.MAX_ID_BYTES:
        raise InvalidRequestError(f"{what} must be at most {layout.MAX_ID_BYTES} bytes without NUL characters")


def _check_finite(values: object, what: str) -> None:
    array = np.asarray(values, dtype=np.float64)
    if array.size and not np.isfinite(array).all():
        raise InvalidRequestError(f"{what} must be finite numbers")


def prepare_open(request: pool_pb2.OpenSessionRequest) -> pool_pb2.OpenSessionRequest:
    """A checked copy of the request, with a fresh session id when it had none."""
    check_id(request.session_id, "session_id", required=False)
    check_id(request.group_id, "group_id", required=False)
    if request.group_size < 0:
        raise InvalidRequestError(f"group_size must be >= 0 (got {request.group_size})")
    if not request.group_id and request.group_size > 1:
        raise InvalidRequestError(f"group_size {request.group_size} needs a group_id")
    checked = pool_pb2.OpenSessionRequest()
    checked.CopyFrom(request)
    if not checked.session_id:
        checked.session_id = uuid.uuid4().hex
    return checked


@dataclass(frozen=True)
class PreparedCall:
    session_id: str
    index: int              # < 0: the next index of the session
    payload: bytes          # the serialised CallRecord but its prompt ids
    prompt: np.ndarray      # its prompt ids, int32 (stored after those it shares with the previous call)
    completion: np.ndarray  # its completion ids, int32
    # A record of its prompt ids alone, copied from the call's own field (at C speed, where the array's ids would
    # each become a Python int first): what is stored when nothing is shared with the previous call.
    whole_prompt: pool_pb2.CallRecord


def check_call(record: pool_pb2.CallRecord, prompt: np.ndarray | None = None) -> None:
    """Check a call on its own (lengths, ids, numbers); InvalidRequestError says what is wrong. A gateway checks
    before it opens a call's session, so that a call the pool would refuse leaves no empty session behind.
    ``prompt``: its prompt ids as an array, where the caller has them."""
    check_id(record.session_id, "session_id")
    n = len(record.completion_ids)
    if len(record.logprobs) != n:
        raise InvalidRequestError(f"{len(record.logprobs)} logprobs for {n} completion ids (one per token needed)")
    if len(record.weight_versions) != n:
        raise InvalidRequestError(f"{len(record.weight_versions)} weight versions for {n} completion ids "
                                  "(one per token needed)")
    if not record.prompt_ids:
        raise InvalidRequestError("prompt_ids is empty")
    if record.prompt_shared:
        raise InvalidRequestError("prompt_shared is the pool's own (how it stores a prompt): send whole prompt_ids")
    if (ids_of(record.prompt_ids) if prompt is None else prompt).min() < 0 or (
            n and ids_of(record.completion_ids).min() < 0):
        raise InvalidRequestError("token ids must be >= 0")
    if n:
        logprobs = np.asarray(record.logprobs, dtype=np.float64)
        if not np.isfinite(logprobs).all() or logprobs.max() > MAX_LOGPROB:
            raise InvalidRequestError("logprobs must be finite log-probabilities (<= 0)")
        if np.asarray(record.weight_versions, dtype=np.int64).min() < 0:
            raise InvalidRequestError("weight versions must be >= 0")
    if record.process_rewards:
        _check_finite(record.process_rewards, "process_rewards")
    if record.HasField("routed_experts"):
        _check_routing(record)


def _check_routing(record: pool_pb2.CallRecord) -> None:
    """A routing record must decode and cover exactly the positions the call fed (all but its last token)."""
    try:
        covered = expert_routing.check(record.routed_experts)
    except ValueError as exc:
        raise InvalidRequestError(f"routed_experts: {exc}") from exc
    fed = len(record.prompt_ids) + len(record.completion_ids) - 1
    if covered != fed:
        raise InvalidRequestError(f"routed_experts covers {covered} positions; the call fed {fed} (prompt and "
                                  "completion but the last token)")


def prepare_call(record: pool_pb2.CallRecord, now: float) -> PreparedCall:
    """Check a call on its own and serialise it; the session is checked by the writer."""
    prompt = ids_of(record.prompt_ids)
    check_call(record, prompt)
    rest = _without_prompt(record)
    if not rest.created_at:
        rest.created_at = now
    return PreparedCall(record.session_id, record.index, rest.SerializeToString(), prompt,
                        ids_of(record.completion_ids), pool_pb2.CallRecord(prompt_ids=record.prompt_ids))


def _without_prompt(record: pool_pb2.CallRecord) -> pool_pb2.CallRecord:
    """A copy of the record but its prompt ids, made field by field: copying the whole record and clearing them would
    copy the whole context, one protobuf value at a time."""
    rest = pool_pb2.CallRecord()
    for field, value in record.ListFields():
        if field.name == "prompt_ids":
            continue
        if field.is_repeated:
            getattr(rest, field.name).extend(value)
        elif field.message_type is not None:
            getattr(rest, field.name).CopyFrom(value)
        else:
            setattr(rest, field.name, value)
    return rest


def prepare_close(request: pool_pb2.CloseSessionRequest) -> pool_pb2.CloseSessionRequest:
    check_id(request.session_id, "session_id")
    _check_finite(list(request.outcome_rewards.values()), "outcome_rewards")
    _check_finite(list(request.metrics.values()), "metrics")
    return request


def open_session(tx: Txn, state: PoolState, request: pool_pb2.OpenSessionRequest, now: float
                 ) -> pool_pb2.SessionRecord:
    session_id = request.session_id
    if tx.get("sessions", layout.session_key(session_id)) is not None:
        raise ConflictError(f"session {session_id!r} already exists")
    entry = None
    if request.group_id:
        found = tx.get("groups", request.group_id.encode())
        entry = None if found is None else tx.entry(layout.position_of(found))
    if entry is not None:
        if request.group_size and request.group_size != entry.size:
            raise InvalidRequestError(f"group {request.group_id!r} was opened with group_size {entry.size}, "
                                      f"not {request.group_size}")
        if entry.status != PENDING:
            raise ConflictError(f"group {request.group_id!r} is no longer open (its queue entry "
                                f"{entry.position} is {STATUS_NAMES[entry.status]})")
        if len(entry.members) >= entry.size:
            raise ConflictError(f"group {request.group_id!r} already has its {entry.size} sessions")
    else:
        entry = new_entry(tx, state, request.group_id, max(request.group_size, 1), now)
    entry.members.append(session_id)
    entry.updated_at = now
    tx.put_entry(entry)
    session = pool_pb2.SessionRecord(session_id=session_id, task_id=request.task_id, domain=request.domain,
                                     group_id=request.group_id, group_size=entry.size,
                                     queue_position=entry.position, status=OPEN, started_at=now,
                                     metadata=request.metadata)
    tx.put_session(session)
    tx.put("open", layout.session_key(session_id), layout.pack_time(now))
    state.sessions += 1
    return session


def _open_session(tx: Txn, session_id: str, action: str) -> pool_pb2.SessionRecord:
    session = tx.require_session(session_id)
    if session.status != OPEN:
        raise ConflictError(f"session {session_id!r} is closed ({SESSION_STATUS_NAMES.get(session.status, '?')}); "
                            f"cannot {action}")
    return session


def append_call(tx: Txn, state: PoolState, call: PreparedCall, now: float, last_calls: LastCalls | None = None
                ) -> int:
    """Record the call; ``last_calls``: the writer's memory of sessions' last calls, read and (after the commit)
    updated."""
    session = _open_session(tx, call.session_id, "append calls")
    expected = session.num_calls
    index = expected if call.index < 0 else call.index
    if index != expected:
        kind = "already recorded" if index < expected else "out of order"
        raise ConflictError(f"call {index} of session {call.session_id!r} is {kind}: the next index is {expected}")
    position = session.queue_position
    previous = None if last_calls is None or index == 0 else last_calls.get(call.session_id, position, index - 1)
    if previous is not None:
        shared = begins_with(call.prompt, previous.prompt, previous.completion)
    else:
        shared = shared_with_previous(call.prompt, index, lambda k: StoredIds.of(pool_pb2.CallRecord.FromString(
            tx.call_record(call.session_id, k) or b"")))
    if last_calls is not None:
        remembered = LastCall(position, index, call.prompt, call.completion)
        tx.on_commit.append(lambda: last_calls.put(call.session_id, remembered))
    if shared:
        ids = pool_pb2.CallRecord(index=index, prompt_ids=call.prompt[shared:].tolist(), prompt_shared=shared)
    else:
        ids = call.whole_prompt
        ids.index = index
    tx.add_call(state, call.session_id, index, call.payload + ids.SerializeToString())
    session.num_calls = index + 1
    tx.put_session(session)
    key = layout.session_key(call.session_id)
    last = tx.get("open", key)
    if last is None or now - layout.unpack_time(last) > ACTIVITY_RESOLUTION_S:
        tx.put("open", key, layout.pack_time(now))
    state.calls += 1
    return index


def add_process_reward(tx: Txn, state: PoolState, reward: pool_pb2.ProcessReward) -> None:
    if not math.isfinite(reward.reward):
        raise InvalidRequestError("reward must be a finite number")
    session = tx.require_session(reward.session_id)
    number = tx.call_number(reward.session_id, reward.call_index) if reward.call_index >= 0 else None
    if number is None:
        raise NotFoundError(f"session {reward.session_id!r} has no call {reward.call_index}")
    entry = tx.entry(session.queue_position)
    if entry is None or entry.status not in (PENDING, COMPLETED):
        raise ConflictError(f"session {reward.session_id!r} was already taken by the learner; its rewards are final")
    tx.add_to_record(number, pool_pb2.CallRecord(process_rewards=[reward.reward]).SerializeToString())


def close_session(tx: Txn, state: PoolState, request: pool_pb2.CloseSessionRequest, min_completed: int,
                  now: float, last_calls: LastCalls | None = None) -> pool_pb2.SessionRecord:
    session = _open_session(tx, request.session_id, "close it again")
    if last_calls is not None:
        tx.on_commit.append(lambda: last_calls.forget(request.session_id))
    session.status = pool_pb2.SESSION_STATUS_FAILED if request.failed else pool_pb2.SESSION_STATUS_COMPLETED
    session.failure_reason = request.failure_reason if request.failed else ""
    session.outcome_rewards.update(request.outcome_rewards)
    session.metrics.update(request.metrics)
    session.ended_at = now
    tx.put_session(session)
    tx.delete("open", layout.session_key(session.session_id))
    entry = tx.entry(session.queue_position)
    if entry is not None:
        entry.closed += 1
        entry.failed += int(request.failed)
        entry.updated_at = now
        settle(tx, state, entry, min_completed, now)
    return session


def expire(tx: Txn, state: PoolState, idle_s: float, min_completed: int, now: float,
           last_calls: LastCalls | None = None) -> list[str]:
    """Close as failed ("timeout") every open session idle for longer than ``idle_s``; settle every group that never
    filled up (fewer than G sessions opened, all closed, idle as long) with the sessions it has."""
    if not idle_s >= 0:
        raise InvalidRequestError(f"idle_s must be >= 0 (got {idle_s})")
    cutoff = now - idle_s
    idle = [key.decode() for key, value in tx.cursor("open") if layout.unpack_time(value) < cutoff]
    for session_id in idle:
        close_session(tx, state, pool_pb2.CloseSessionRequest(session_id=session_id, failed=True,
                                                              failure_reason="timeout"), min_completed, now,
                      last_calls)
    stale = [layout.position_of(key) for key, _ in tx.cursor("pending")]
    for position in stale:
        entry = tx.entry(position)
        if (entry is not None and entry.status == PENDING and len(entry.members) < entry.size
                and entry.closed >= len(entry.members) and entry.updated_at < cutoff):
            entry.size = len(entry.members)
            settle(tx, state, entry, min_completed, now)
    return idle
