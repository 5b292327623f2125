"""The writer's memory of each open session's last call: its whole ids (prompt and completion), so that appending
the session's next call compares the new prompt with them at C speed instead of reading the session's stored calls
back (``forge.pool.shared_prompts``). Recording a call then costs its new tokens in Python steps, whatever the
number of calls before it.

Only committed calls are remembered: the writer adds an entry after the transaction holding the call has committed,
and an entry counts only for the call it names (session, its queue position, index), so a call appended by another
writer, or a session recreated under the same id, is read from storage as before. The memory is bounded in bytes and
forgets the least recently appended sessions first; a forgotten session costs one walk back, not a wrong answer.
Used from the writer thread alone, so it takes no lock."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

DEFAULT_BYTES = 64 << 20


@dataclass(frozen=True)
class LastCall:
    """Which call the ids are of, and its prompt's and completion's ids (whole: its prompt includes what it shares)."""

    queue_position: int
    index: int
    prompt: np.ndarray
    completion: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.prompt.nbytes + self.completion.nbytes


class LastCalls:
    """Each session's last committed call ids, at most ``max_bytes`` of ids in all (0: remember nothing)."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._calls: OrderedDict[str, LastCall] = OrderedDict()

    def __len__(self) -> int:
        return len(self._calls)

    def get(self, session_id: str, queue_position: int, index: int) -> LastCall | None:
        """Call ``index`` of the session at ``queue_position``, if remembered."""
        last = self._calls.get(session_id)
        if last is None or last.index != index or last.queue_position != queue_position:
            return None
        return last

    def put(self, session_id: str, last: LastCall) -> None:
        """Remember the session's call (committed) in place of its earlier one."""
        self.forget(session_id)
        if last.nbytes > self.max_bytes:
            return
        self._calls[session_id] = last
        self.bytes += last.nbytes
        while self.bytes > self.max_bytes:
            _, oldest = self._calls.popitem(last=False)
            self.bytes -= oldest.nbytes

    def forget(self, session_id: str) -> None:
        last = self._calls.pop(session_id, None)
        if last is not None:
            self.bytes -= last.nbytes
