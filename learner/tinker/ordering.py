"""One model's requests run in the client's order. A training client numbers its requests (``seq_id``, 1, 2, ...;
a batch split into several forward_backward requests takes consecutive numbers sent at once, the first last), and
the server runs request N only after N - 1, one at a time, whatever order they arrive in. A number already taken is
the same request sent again (a retry after a lost reply): it answers the first one's future. A request refused at
the door keeps its number (``skip``), so those after it do not wait for it; a number that never comes fails the
ones waiting behind it after ``gap_timeout_s``.

Requests with no number (unload, a session's end) run after every one already queued."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from forge.learner.tinker.errors import ApiError

log = logging.getLogger(__name__)

Job = Callable[[], Awaitable[None]]
REMEMBERED_SEQS = 4096
REFUSED = "refused"          # the request id a turn refused at the door is remembered by
SKIP_AHEAD = 4096            # a refused turn further ahead than this is not kept


@dataclass
class _Queued:
    request_id: str
    job: Job | None              # None: refused at the door, its turn is skipped
    fail: Callable[[str], None] | None = None     # how the job's future fails if its turn never comes


class OrderedRunner:
    def __init__(self, name: str, first_seq: int = 1, gap_timeout_s: float = 300.0) -> None:
        self.name = name
        self.next_seq = first_seq
        self.gap_timeout_s = gap_timeout_s
        self._pending: dict[int, _Queued] = {}
        self._seen: OrderedDict[int, str] = OrderedDict()        # seq → request id, for repeats
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.closed = False

    def known(self, seq: int | None) -> str | None:
        """The request id already given to ``seq`` (a repeated request), if any; raises for a refused turn."""
        found = None if seq is None else self._seen.get(seq)
        if found == REFUSED:
            raise ApiError(400, f"seq_id {seq} of {self.name} was refused earlier; send the next one")
        return found

    def skip(self, seq: int) -> None:
        """Keep ``seq``'s turn for a request refused at the door (when it is a plausible next number)."""
        if seq not in self._seen and self.next_seq <= seq <= self.next_seq + SKIP_AHEAD:
            self.submit(seq, REFUSED, None)

    def check_seq(self, seq: int | None) -> None:
        """Refuse a number already run and forgotten, or one absurdly far ahead."""
        if seq is None:
            return
        if seq < self.next_seq and seq not in self._seen:
            raise ApiError(400, f"seq_id {seq} of {self.name} was already used (next is {self.next_seq})")
        if seq > self.next_seq + 1_000_000:
            raise ApiError(400, f"seq_id {seq} of {self.name} is far ahead of the next one ({self.next_seq})")

    def submit(self, seq: int | None, request_id: str, job: Job | None,
               fail: Callable[[str], None] | None = None) -> None:
        """Queue ``job`` at ``seq`` (None: after everything queued); ``job`` None keeps the turn and skips it."""
        if self.closed:
            raise ApiError(404, f"model {self.name} not found")
        if seq is None:
            seq = max([self.next_seq - 1, *self._pending]) + 1
        self.check_seq(seq)
        self._pending[seq] = _Queued(request_id, job, fail)
        self._seen[seq] = request_id
        while len(self._seen) > REMEMBERED_SEQS:
            self._seen.popitem(last=False)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"model {self.name}")

    async def _run(self) -> None:
        while not self.closed:
            queued = self._pending.pop(self.next_seq, None)
            if queued is None:
                await self._wait_for_turn()
                continue
            self.next_seq += 1
            if queued.job is not None:
                await queued.job()          # the job finishes its own future, failures included

    async def _wait_for_turn(self) -> None:
        self._wake.clear()
        if not self._pending:
            await self._wake.wait()
            return
        try:
            await asyncio.wait_for(self._wake.wait(), self.gap_timeout_s)
        except TimeoutError:
            missing = self.next_seq
            waiting = sorted((seq, q) for seq, q in self._pending.items() if q.job is not None)
            self._pending.clear()                   # refused turns alone: forgotten, the order stays where it was
            if not waiting:
                return
            log.warning("%s: seq_id %d never came in %.0f s; failing the %d requests behind it", self.name, missing,
                        self.gap_timeout_s, len(waiting))
            self.next_seq = waiting[-1][0] + 1
            for _, queued in waiting:
                if queued.fail is not None:
                    queued.fail(f"seq_id {missing} of {self.name} never arrived")

    def retire(self, message: str) -> None:
        """No more requests: those still waiting fail with ``message`` (called by the model's last job)."""
        self.closed = True
        waiting, self._pending = self._pending, {}
        for queued in waiting.values():
            if queued.fail is not None:
                queued.fail(message)

    async def close(self) -> None:
        self.retire("the server stopped")
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
