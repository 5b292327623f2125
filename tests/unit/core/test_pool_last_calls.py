"""The writer's memory of each session's last call (``forge.pool.last_calls``): appending through it stores exactly
what reading the session's calls back stores, with the memory large, off, or so small it forgets at every call, on
random sessions appended in shared batches; it never answers for a call other than the one it holds; and the writer
runs a request's after-commit actions only once its batch is committed, never for a refused request or twice for a
replayed batch."""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.pool import ConflictError, Pool
from forge.pool.last_calls import LastCall, LastCalls
from forge.v1 import pool_pb2

from helpers.pool_util import same_call, snapshot, varied_session_calls


def ids(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def test_it_answers_only_for_the_call_it_holds():
    last = LastCalls(1 << 10)
    last.put("s", LastCall(3, 1, ids(1, 2), ids(3)))
    assert list(last.get("s", 3, 1).prompt) == [1, 2] and list(last.get("s", 3, 1).completion) == [3]
    assert last.get("s", 3, 0) is None            # an earlier call
    assert last.get("s", 3, 2) is None            # a call appended by another writer since
    assert last.get("s", 4, 1) is None            # a session recreated under the same id
    assert last.get("t", 3, 1) is None
    last.put("s", LastCall(3, 2, ids(1, 2, 3), ids(4)))
    assert last.get("s", 3, 1) is None and list(last.get("s", 3, 2).prompt) == [1, 2, 3] and last.bytes == 16
    last.forget("s")
    assert last.get("s", 3, 2) is None and last.bytes == 0 and len(last) == 0


def test_it_keeps_to_its_bytes_and_forgets_the_least_recent_first():
    last = LastCalls(40)
    for name in "abc":
        last.put(name, LastCall(0, 0, ids(*range(3)), ids(3)))      # 16 bytes each: the third pushes out the first
    assert last.get("a", 0, 0) is None and last.get("b", 0, 0) is not None and last.bytes == 32
    last.put("b", LastCall(0, 1, ids(*range(4)), ids()))     # b is now the most recent: c goes next
    last.put("d", LastCall(0, 0, ids(*range(4)), ids()))
    assert last.get("c", 0, 0) is None and last.get("b", 0, 1) is not None and last.bytes == 32
    last.put("e", LastCall(0, 0, ids(*range(10)), ids(1)))  # more than all it may hold: not kept, nothing lost
    assert last.get("e", 0, 0) is None and last.bytes == 32 and len(last) == 2
    assert LastCalls(0).max_bytes == 0


def append_interleaved(pool: Pool, sessions: dict[str, list[pool_pb2.CallRecord]], rng: random.Random) -> None:
    """Every session's calls in order, sessions interleaved, in bursts submitted together so that one commit holds
    several calls of a session."""
    for sid in sessions:
        pool.open_session(session_id=sid)
    cursors = dict.fromkeys(sessions, 0)
    while any(cursors[sid] < len(calls) for sid, calls in sessions.items()):
        burst: list[Future] = []
        for _ in range(rng.randrange(1, 8)):
            sid = rng.choice([s for s, calls in sessions.items() if cursors[s] < len(calls)] or [None])
            if sid is None:
                break
            burst.append(pool.append_call_async(sessions[sid][cursors[sid]]))
            cursors[sid] += 1
        for future in burst:
            future.result()


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32))
def test_appends_store_the_same_with_the_memory_large_off_or_forgetting(tmp_path_factory, seed):
    stored = []
    for memory in (64 << 20, 0, 96):
        rng = random.Random(seed)
        sessions = {f"s{k}": varied_session_calls(rng, f"s{k}", rng.randrange(1, 10)) for k in range(4)}
        with Pool(tmp_path_factory.mktemp("pool"), sync=False, last_calls_bytes=memory) as pool:
            append_interleaved(pool, sessions, rng)
            if memory > 1000:
                assert len(pool.last_calls) == len(sessions)        # each session's last call
            else:
                assert pool.last_calls.bytes <= memory and (memory or not len(pool.last_calls))
            for sid, calls in sessions.items():
                got = pool.get_session(sid).calls
                assert len(got) == len(calls) and all(same_call(g, c) for g, c in zip(got, calls, strict=True))
            stored.append(snapshot(pool)["calls"])
    assert stored[0] == stored[1] == stored[2]


def test_a_refused_append_leaves_the_memory_as_it_was(tmp_path):
    calls = varied_session_calls(random.Random(3), "s", 3)
    with Pool(tmp_path / "pool", sync=False) as pool:
        pool.open_session(session_id="s")
        pool.append_call(calls[0])
        twice = pool.append_call_async(calls[0])                  # refused in the same batch as the next call
        following = pool.append_call_async(calls[1])
        with pytest.raises(ConflictError, match="already recorded"):
            twice.result()
        assert following.result() == 1
        assert pool.last_calls.get("s", 0, 1) is not None and pool.last_calls.get("s", 0, 0) is None
        pool.close_session(session_id="s")
        assert len(pool.last_calls) == 0


def test_after_commit_actions_run_once_and_only_for_committed_requests(tmp_path):
    seen: list[tuple[str, bool]] = []          # (request, its write visible to a new reader when the action ran)
    with Pool(tmp_path / "pool", sync=False, map_size=1 << 16) as pool:
        def write(name: str, size: int, refuse: bool = False):
            def apply(tx, state):
                key = f"big-{name}".encode()
                tx.put("meta", key, b"x" * size)          # fills the map: the batch is grown and replayed

                def after() -> None:
                    with pool.store.read() as reader:
                        seen.append((name, reader.get("meta", key) is not None))
                tx.on_commit.append(after)
                if refuse:
                    raise ConflictError("refused")
                return name
            return apply

        gate = threading.Event()
        held = pool.writer.submit(lambda tx, state: gate.wait())     # so that the next three share one batch
        futures = [pool.writer.submit(write("a", 1 << 15)), pool.writer.submit(write("b", 1 << 15, refuse=True)),
                   pool.writer.submit(write("c", 1 << 17))]
        gate.set()
        held.result()
        assert futures[0].result() == "a" and futures[2].result() == "c"
        with pytest.raises(ConflictError):
            futures[1].result()
        assert pool.writer.metrics.map_grows >= 1
        assert seen == [("a", True), ("c", True)]
