"""Sessions as the gateway sees them: opened explicitly (StartSession) or implicitly by a black-box agent's first
call, ended with outcome rewards (EndSession) or expired as failed. Each keeps a memory of its recent calls for
token-in-token-out splicing; a session the gateway does not hold (e.g. after a restart) is rebuilt from the pool.

An implicit session is opened in the pool only when its first call is about to be recorded, so a request refused
for bad input leaves nothing behind."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from forge.gateway.async_pool import AsyncPool
from forge.gateway.errors import BadRequest, Conflict, GatewayError, NotFound
from forge.gateway.keys import KeyRing
from forge.gateway.metrics import Metrics
from forge.gateway.tito import CallHistory
from forge.pool import SESSION_STATUS_NAMES, InvalidRequestError, prepare_open
from forge.v1 import pool_pb2

log = logging.getLogger(__name__)

OPEN = pool_pb2.SESSION_STATUS_OPEN


@dataclass
class SessionState:
    session_id: str
    history: CallHistory
    opened: bool
    open_request: pool_pb2.OpenSessionRequest | None = None
    last_end: float | None = None           # wall time the session's previous call ended
    last_active: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    failures: list[str] = field(default_factory=list)
    opening: asyncio.Future | None = None
    group_id: str = ""                      # the session's rollout group (routers place a group together)

    def touch(self) -> None:
        self.last_active = time.monotonic()


class SessionRegistry:
    def __init__(self, pool: AsyncPool, keys: KeyRing, metrics: Metrics, tito_max_calls: int = 64,
                 fail_on_call_error: bool = True) -> None:
        self.pool = pool
        self.keys = keys
        self.metrics = metrics
        self.tito_max_calls = tito_max_calls
        self.fail_on_call_error = fail_on_call_error
        self.sessions: dict[str, SessionState] = {}
        self.on_forget: list = []

    def open_count(self) -> int:
        return sum(1 for s in self.sessions.values() if s.opened)

    async def start(self, request: pool_pb2.OpenSessionRequest, issue_key: bool
                    ) -> tuple[pool_pb2.SessionRecord, str | None]:
        record = await self.pool.open_session(request)
        self.sessions[record.session_id] = SessionState(record.session_id, CallHistory(self.tito_max_calls), True,
                                                        group_id=record.group_id)
        self.metrics.count("sessions_started")
        log.debug("session %s started (queue position %d)", record.session_id, record.queue_position)
        return record, self.keys.issue(record.session_id) if issue_key else None

    async def resolve(self, session_id: str, implicit: pool_pb2.OpenSessionRequest | None = None) -> SessionState:
        """The session ``session_id``; if the pool does not know it either: with ``implicit``, a new session to
        be opened with those fields at its first call, else NotFound."""
        state = self.sessions.get(session_id)
        if state is not None:
            state.touch()
            return state
        try:
            stored = await self.pool.get_session(session_id)
        except NotFound:
            if implicit is None:
                raise NotFound(f"unknown session {session_id!r}", "session_id") from None
            request = pool_pb2.OpenSessionRequest()
            request.CopyFrom(implicit)
            request.session_id = session_id
            try:
                prepare_open(request)
            except InvalidRequestError as exc:
                raise BadRequest(str(exc), "session_id") from exc
            state = SessionState(session_id, CallHistory(self.tito_max_calls), False, request,
                                 group_id=request.group_id)
        else:
            if stored.session.status != OPEN:
                status = SESSION_STATUS_NAMES.get(stored.session.status, "closed")
                raise Conflict(f"session {session_id!r} is {status}; it takes no more calls", "session_id")
            state = SessionState(session_id, CallHistory(self.tito_max_calls), True,
                                 group_id=stored.session.group_id)
            calls = list(stored.calls)[-self.tito_max_calls:]
            state.history.extend((c.index, c.prompt_ids, c.completion_ids) for c in calls)
            if calls:
                state.last_end = calls[-1].created_at
            log.debug("session %s rebuilt from the pool (%d calls)", session_id, len(stored.calls))
        return self.sessions.setdefault(session_id, state)

    async def ensure_open(self, state: SessionState) -> None:
        """Open an implicit session in the pool (once, however many calls race to it)."""
        if state.opened:
            return
        if state.opening is None:
            state.opening = asyncio.ensure_future(self._open_implicit(state))
        await asyncio.shield(state.opening)

    async def _open_implicit(self, state: SessionState) -> None:
        try:
            await self.pool.open_session(state.open_request)
            self.metrics.count("sessions_started")
            log.debug("session %s opened implicitly", state.session_id)
        except Conflict as exc:
            if "already exists" not in exc.message:
                state.opening = None
                raise
        except GatewayError:
            state.opening = None
            raise
        state.opened = True

    async def end(self, request: pool_pb2.CloseSessionRequest) -> pool_pb2.SessionRecord:
        state = self.sessions.get(request.session_id)
        if state is not None and state.failures:
            request.metrics["gateway_failed_calls"] = float(len(state.failures))
            if self.fail_on_call_error and not request.failed:
                request.failed = True
                request.failure_reason = f"gateway: a call failed: {state.failures[0]}"
        record = await self.pool.close_session(request)
        self.forget(request.session_id)
        self.metrics.count("sessions_ended")
        return record

    def forget(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        for callback in self.on_forget:
            callback(session_id)

    async def expire(self, timeout_s: float) -> list[str]:
        """Close idle sessions as failed in the pool and drop idle ones from memory."""
        expired = await self.pool.expire_sessions(timeout_s)
        for session_id in expired:
            self.forget(session_id)
        self.metrics.count("sessions_expired", len(expired))
        now = time.monotonic()
        for session_id, state in list(self.sessions.items()):
            if state.in_flight == 0 and now - state.last_active > timeout_s:
                self.forget(session_id)
        return expired
