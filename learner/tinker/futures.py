"""The futures every accepted Tinker request answers with: a request id at once, its result later, fetched by
``retrieve_future`` (a poll held open up to the server's hold time, then ``try_again``) or, for a sampling session's
requests, noticed through ``retrieve_futures``' completion queue. A result is JSON or protobuf bytes (the SDK asks
for protobuf for forward_backward and sample results) or a failure with its category.

Bounded: at most ``max_pending`` requests unfinished (beyond: 429, which the SDK retries later); a finished result is
kept ``keep_s`` seconds (a client may poll again after a lost reply), and at most ``max_kept`` of them. A future
belongs to the key that made the request; another key's poll finds nothing."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from forge.learner.tinker.errors import ApiError, failure


@dataclass(frozen=True)
class Outcome:
    """A finished request's reply: JSON (a result, or a failure with ``error`` and ``category``) or protobuf."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None

    @property
    def failed(self) -> bool:
        return self.json is not None and "error" in self.json and "category" in self.json

    def size(self) -> int:
        return len(self.proto) if self.proto is not None else 0


@dataclass
class Future:
    request_id: str
    owner: str
    what: str
    created: float = field(default_factory=time.monotonic)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Outcome | None = None
    finished: float | None = None
    listeners: list[Callable[[Future], None]] = field(default_factory=list)


class FutureStore:
    """Lives on the server's event loop; every method is called there."""

    def __init__(self, max_pending: int = 4096, keep_s: float = 900.0, max_kept: int = 20_000) -> None:
        self.max_pending = max_pending
        self.keep_s = keep_s
        self.max_kept = max_kept
        self._futures: OrderedDict[str, Future] = OrderedDict()
        self._tasks: set[asyncio.Task] = set()
        self.pending = 0
        self.completed = 0
        self.failed = 0

    def create(self, owner: str, what: str) -> Future:
        """A new unfinished future; raises ApiError(429) when too many are unfinished."""
        self.prune()
        if self.pending >= self.max_pending:
            raise ApiError(429, f"the server has {self.pending} requests in progress; try again shortly")
        future = Future(f"req-{uuid.uuid4().hex}", owner, what)
        self._futures[future.request_id] = future
        self.pending += 1
        return future

    def finish(self, future: Future, outcome: Outcome) -> None:
        if future.outcome is not None:
            return
        future.outcome = outcome
        future.finished = time.monotonic()
        self.pending -= 1
        self.completed += 1
        self.failed += outcome.failed
        future.done.set()
        for listener in future.listeners:
            listener(future)

    def fail(self, future: Future, exc: BaseException) -> None:
        self.finish(future, Outcome(json=failure(exc, future.what)))

    def start(self, future: Future, work: Callable[[], Awaitable[Outcome]]) -> None:
        """Run ``work`` in a task of its own; its outcome (or its exception, as a failure) finishes ``future``."""
        async def run() -> None:
            try:
                outcome = await work()
            except asyncio.CancelledError:
                self.finish(future, Outcome(json={"error": "the server stopped", "category": "server"}))
                raise
            except BaseException as exc:      # every failure goes to the client, none kills the server
                self.fail(future, exc)
            else:
                self.finish(future, outcome)

        task = asyncio.get_running_loop().create_task(run(), name=future.what)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def get(self, request_id: str, owner: str) -> Future | None:
        future = self._futures.get(request_id)
        return future if future is not None and future.owner == owner else None

    async def wait(self, request_id: str, owner: str, hold_s: float) -> Outcome | None:
        """The outcome of ``request_id`` once finished, waiting up to ``hold_s``; None if still running. Raises
        ApiError(404) for an id this key does not own (absent, expired, or another key's)."""
        future = self.get(request_id, owner)
        if future is None:
            raise ApiError(404, f"request {request_id!r} not found")
        if future.outcome is None and hold_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future.done.wait(), hold_s)
        return future.outcome

    def prune(self) -> None:
        """Drop finished futures kept past ``keep_s``, and the oldest finished ones beyond ``max_kept``."""
        now = time.monotonic()
        finished = [f for f in self._futures.values() if f.finished is not None]
        excess = len(finished) - self.max_kept
        for future in finished:
            if excess > 0 or now - future.finished > self.keep_s:
                del self._futures[future.request_id]
                excess -= 1

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class CompletionQueue:
    """One sampling session's finished requests in order, for ``retrieve_futures``: each with a cursor; a poll
    returns those after its ``prev_cursor`` (dropping the ones at or before it, which the client has seen)."""

    def __init__(self, max_kept: int = 10_000) -> None:
        self.max_kept = max_kept
        self._events: list[tuple[int, int, dict[str, Any]]] = []     # (cursor, clone id, completion)
        self._cursor = 0
        self._changed = asyncio.Event()

    def add(self, clone: int, completion: dict[str, Any]) -> None:
        self._cursor += 1
        self._events.append((self._cursor, clone, completion))
        del self._events[:max(0, len(self._events) - self.max_kept)]
        self._changed.set()

    def after(self, prev_cursor: int, clone: int) -> tuple[list[dict[str, Any]], int]:
        self._events = [e for e in self._events if e[0] > prev_cursor or e[1] != clone]
        found = [e for e in self._events if e[1] == clone]
        return [e[2] for e in found], (found[-1][0] if found else max(prev_cursor, 0))

    async def poll(self, prev_cursor: int, clone: int, hold_s: float) -> tuple[list[dict[str, Any]], int]:
        deadline = time.monotonic() + hold_s
        while True:
            completions, cursor = self.after(prev_cursor, clone)
            left = deadline - time.monotonic()
            if completions or left <= 0:
                return completions, cursor
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
