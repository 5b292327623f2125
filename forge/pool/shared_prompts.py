"""How the pool stores a session's prompts: a call whose prompt begins with the whole of the previous call (its
prompt and completion ids, as a multi-turn session's prompts do) stores only the ids after them, with their count in
``CallRecord.prompt_shared``, so recording a call costs its new tokens, not its context. Readers are given whole
prompts; a call whose prompt does not begin so (an agent that rewrote its history) is stored whole.

The writer checks the new prompt against the previous call's ids. It keeps each open session's last call ids in
memory (``forge.pool.last_calls``), so most appends compare with them alone, at C speed. Otherwise it walks the
session's stored calls back from the last without building the whole ids, comparing each call's own ids with the
matching stretch of the prompt: an append that shares reads and compares O(context) ids once, and one that does not
stops at the first difference, most often within the last call. Ids are held as numpy arrays: protobuf hands a
repeated field to numpy at C speed, where building an ``array`` or a list from it costs a Python step an id."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from forge.pool.errors import PoolError
from forge.v1 import pool_pb2


@dataclass(frozen=True)
class StoredIds:
    """The ids one stored call holds: its shared count, the rest of its prompt, its completion."""

    shared: int
    prompt_tail: np.ndarray
    completion: np.ndarray

    @classmethod
    def of(cls, call: pool_pb2.CallRecord) -> StoredIds:
        return cls(call.prompt_shared, ids_of(call.prompt_ids), ids_of(call.completion_ids))

    @property
    def whole(self) -> int:
        """How many ids the call's prompt and completion hold together."""
        return self.shared + len(self.prompt_tail) + len(self.completion)


def ids_of(values: Iterable[int]) -> np.ndarray:
    """Token ids (a protobuf repeated field, a list) as an int32 array."""
    return np.asarray(values, dtype=np.int32)


def begins_with(prompt: np.ndarray, previous_prompt: np.ndarray, previous_completion: np.ndarray) -> int:
    """How many ids the previous call holds (its whole prompt and completion) if ``prompt`` begins with all of them,
    else 0."""
    split, n = len(previous_prompt), len(previous_prompt) + len(previous_completion)
    if len(prompt) < n or not np.array_equal(prompt[:split], previous_prompt):
        return 0
    return n if np.array_equal(prompt[split:n], previous_completion) else 0


def shared_with_previous(prompt: np.ndarray, index: int, stored_call: Callable[[int], StoredIds]) -> int:
    """How many of ``prompt``'s first ids are the whole ids of the session's call ``index - 1`` (the prompt begins
    with all of them), else 0. ``stored_call(k)``: call k as stored. The calls are read from the last back, each only
    while the prompt still matches and the stretch it is compared with lies in an earlier call: a prompt that does
    not begin with the previous call costs one call's read."""
    if index <= 0:
        return 0
    k = index - 1
    stored = stored_call(k)
    n = end = stored.whole
    if n == 0 or len(prompt) < n:
        return 0
    while True:
        if end > stored.shared:
            tail_end = stored.shared + len(stored.prompt_tail)
            upto = min(end, tail_end)
            if not np.array_equal(prompt[stored.shared:upto], stored.prompt_tail[:upto - stored.shared]):
                return 0
            if end > tail_end and not np.array_equal(prompt[tail_end:end], stored.completion[:end - tail_end]):
                return 0
            end = stored.shared
            if end == 0:
                return n
        k -= 1
        if k < 0:
            raise PoolError("a stored call shares more ids than the calls before it hold")
        stored = stored_call(k)


def expand(calls: Iterable[pool_pb2.CallRecord]) -> None:
    """Give each of a session's calls (read in order, edited in place) its whole prompt."""
    previous: pool_pb2.CallRecord | None = None
    for call in calls:
        shared = call.prompt_shared
        if shared:
            if previous is None or shared > len(previous.prompt_ids) + len(previous.completion_ids):
                raise PoolError(f"call {call.index} of session {call.session_id!r} shares {shared} ids with a call "
                                "that holds fewer")
            head = list(previous.prompt_ids[:shared])
            if shared > len(head):
                head += previous.completion_ids[:shared - len(head)]
            tail = list(call.prompt_ids)
            del call.prompt_ids[:]
            call.prompt_ids.extend(head)
            call.prompt_ids.extend(tail)
            call.prompt_shared = 0
        previous = call
