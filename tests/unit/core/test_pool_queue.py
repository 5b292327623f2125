"""The Data Pool in process: groups and queue entries, the windowed FIFO, consumes and the cursor (persisted,
committed, rewound), retention, expiry, map growth, and bad input that leaves the pool unchanged."""

from __future__ import annotations

import math
import time

import pytest

from forge.pool import (
    ConflictError,
    CursorConflictError,
    InvalidRequestError,
    NotFoundError,
    Pool,
    PoolClosedError,
    PoolFullError,
    PoolReader,
)
from forge.v1 import pool_pb2

from helpers.pool_util import make_call, same_call, snapshot
from helpers.waiting import wait_for

COMPLETED = pool_pb2.ENTRY_STATUS_COMPLETED
CONSUMED = pool_pb2.ENTRY_STATUS_CONSUMED
FAILED = pool_pb2.ENTRY_STATUS_FAILED
PENDING = pool_pb2.ENTRY_STATUS_PENDING


@pytest.fixture
def pool(tmp_path):
    with Pool(tmp_path / "pool") as opened:
        yield opened


def entry_status(pool: Pool, position: int) -> int:
    return next(e.status for e in pool.entries(position, 1))


def singletons(pool: Pool, n: int) -> list[str]:
    return [pool.open_session(session_id=f"s{i}", task_id=f"t{i}").session_id for i in range(n)]


def fetched(pool: Pool, window: int, **kwargs) -> list[int]:
    return [e.position for e in pool.fetch(window, **kwargs).entries]


def test_sessions_of_a_group_share_one_entry_that_completes_when_all_have_closed(pool):
    solo = pool.open_session(session_id="solo")
    group = [pool.open_session(task_id="t", group_id="g", group_size=3) for _ in range(3)]
    assert solo.queue_position == 0 and {s.queue_position for s in group} == {1}
    assert all(s.group_size == 3 and s.status == pool_pb2.SESSION_STATUS_OPEN for s in group)
    assert pool.cursor().tail == 2
    pool.close_session(session_id=group[0].session_id, outcome_rewards={"correct": 1.0})
    pool.close_session(session_id=group[1].session_id, failed=True, failure_reason="tool crashed")
    assert entry_status(pool, 1) == PENDING and fetched(pool, 10) == []
    pool.close_session(session_id=group[2].session_id, outcome_rewards={"correct": 0.0})
    assert entry_status(pool, 1) == COMPLETED
    response = pool.fetch(10, include_calls=True)
    assert [e.position for e in response.entries] == [1] and response.entries[0].group_id == "g"
    sessions = {s.session.session_id: s.session for s in response.entries[0].sessions}
    assert set(sessions) == {s.session_id for s in group}
    assert sessions[group[1].session_id].failure_reason == "tool crashed"
    assert sessions[group[0].session_id].outcome_rewards["correct"] == 1.0
    assert not pool.fetch(10).entries[0].sessions        # headers only without include_calls


def test_group_rules(pool):
    pool.open_session(group_id="g", group_size=2)
    with pytest.raises(InvalidRequestError, match="group_size 2"):
        pool.open_session(group_id="g", group_size=3)
    pool.open_session(group_id="g")                      # 0 = as declared
    with pytest.raises(ConflictError, match="already has"):
        pool.open_session(group_id="g", group_size=2)
    with pytest.raises(InvalidRequestError, match="needs a group_id"):
        pool.open_session(group_size=4)
    with pytest.raises(ConflictError, match="already exists"):
        pool.open_session(session_id=pool.entries(0, 1)[0].members[0])


def test_a_group_whose_sessions_all_failed_is_a_failed_entry_and_the_head_moves_past_it(tmp_path):
    with Pool(tmp_path / "p", min_completed=2) as pool:
        first = [pool.open_session(group_id="a", group_size=2).session_id for _ in range(2)]
        second = [pool.open_session(group_id="b", group_size=2).session_id for _ in range(2)]
        for sid in first:
            pool.close_session(session_id=sid, failed=True)
        assert entry_status(pool, 0) == FAILED and pool.cursor().head == 1
        pool.close_session(session_id=second[0])
        pool.close_session(session_id=second[1], failed=True)     # 1 completed < min_completed=2
        assert entry_status(pool, 1) == FAILED and pool.cursor().head == 2
        assert pool.stats()["failed"] == 2


def test_fetch_never_goes_beyond_the_window(pool):
    ids = singletons(pool, 6)
    for i in (1, 3, 4):
        pool.close_session(session_id=ids[i])
    assert fetched(pool, 1) == []                        # W = 1: strict FIFO, the head (0) is not complete
    assert fetched(pool, 2) == [1]
    assert fetched(pool, 4) == [1, 3]                    # 4 is complete but outside [0, 3]
    assert fetched(pool, 5) == [1, 3, 4]
    assert fetched(pool, 100) == [1, 3, 4]               # W = N: greedy
    assert fetched(pool, 100, max_entries=2) == [1, 3]
    pool.close_session(session_id=ids[0])
    assert fetched(pool, 1) == [0]
    with pytest.raises(InvalidRequestError, match="window"):
        pool.fetch(0)


def test_consume_moves_the_head_past_leading_consumed_or_failed_entries_only(pool):
    ids = singletons(pool, 5)
    for sid in ids[1:]:
        pool.close_session(session_id=sid)
    cursor = pool.consume([2, 3])
    assert (cursor.head, cursor.seq) == (0, 1)           # entry 0 still pending
    assert fetched(pool, 3) == [1]                       # window [0, 2]: 2 consumed, 3 beyond
    cursor = pool.consume([0], failed=True)              # the learner gives up on the stuck head
    assert entry_status(pool, 0) == FAILED and cursor.head == 1
    cursor = pool.consume([1])
    assert cursor.head == 4 and fetched(pool, 1) == [4]  # past 1, 2, 3
    pool.consume([4])
    assert pool.cursor().head == pool.cursor().tail == 5
    stats = pool.stats()
    assert (stats["consumed"], stats["failed"], stats["completed"], stats["queued"]) == (4, 1, 0, 0)


def test_consume_refuses_what_it_cannot_take_and_changes_nothing(pool):
    ids = singletons(pool, 3)
    pool.close_session(session_id=ids[1])
    pool.consume([1])
    before = snapshot(pool)
    cases = [([0], {}, ConflictError, "not complete"), ([1], {}, ConflictError, "already consumed"),
             ([7], {}, NotFoundError, "no queue entry"), ([], {}, InvalidRequestError, "no positions"),
             ([2, 2], {"failed": True}, InvalidRequestError, "more than once"),
             ([2], {"failed": True, "expected_seq": 0}, CursorConflictError, "cursor moved")]
    for positions, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            pool.consume(positions, **kwargs)
    assert snapshot(pool) == before
    assert isinstance(ConflictError("x"), ValueError)
    assert pool.consume([2], failed=True, expected_seq=1).seq == 2


def test_cursor_and_queue_survive_reopening(tmp_path):
    path = tmp_path / "p"
    with Pool(path) as pool:
        ids = singletons(pool, 4)
        for sid in ids:
            pool.close_session(session_id=sid)
        pool.consume([0, 2])
        before = pool.cursor()
    with Pool(path) as pool:
        assert pool.cursor() == before and before.head == 1 and before.seq == 1
        assert fetched(pool, 10) == [1, 3]
        assert pool.open_session().queue_position == 4


def test_a_restarted_learner_rewinds_to_its_checkpoint_and_neither_skips_nor_repeats(tmp_path):
    path = tmp_path / "p"
    trained: list[int] = []
    with Pool(path) as pool:
        for sid in singletons(pool, 8):
            pool.close_session(session_id=sid)
        checkpoint_seq = 0
        for step in range(4):                            # two entries per step, checkpoint after step 1
            batch = fetched(pool, 3, max_entries=2)
            trained.extend(batch)
            cursor = pool.consume(batch, expected_seq=pool.cursor().seq)
            if step == 1:
                checkpoint_seq = cursor.seq                 # saved with the checkpoint, then committed
                pool.commit_cursor(checkpoint_seq)
        assert pool.cursor().head == 8
    kept = trained[:4]                                   # what the checkpoint learned from; steps 2-3 are lost
    with Pool(path) as pool:                             # the learner restarts from its checkpoint
        cursor = pool.rewind(checkpoint_seq)
        assert (cursor.seq, cursor.head) == (checkpoint_seq, 4)
        redo = []
        while batch := fetched(pool, 3, max_entries=2):
            redo.extend(batch)
            pool.consume(batch)
        assert sorted(kept + redo) == list(range(8))     # every entry exactly once for the restored model
        with pytest.raises(ConflictError, match="committed"):
            pool.rewind(checkpoint_seq - 1)
        with pytest.raises(InvalidRequestError):
            pool.commit_cursor(pool.cursor().seq + 1)


def test_rewind_puts_back_failed_pending_entries(pool):
    ids = singletons(pool, 2)
    pool.consume([0], failed=True)
    assert pool.cursor().head == 1
    pool.close_session(session_id=ids[0])               # closes after the learner gave up on it
    cursor = pool.rewind(0)
    assert cursor.head == 0 and entry_status(pool, 0) == COMPLETED and fetched(pool, 1) == [0]
    assert pool.stats()["failed"] == 0


def test_calls_and_process_rewards_round_trip(pool):
    sid = pool.open_session(task_id="t", domain="qa").session_id
    calls = [make_call(sid, i) for i in range(3)]
    assert [pool.append_call(c) for c in calls] == [0, 1, 2]
    auto = make_call(sid, 3)
    auto.index = -1                                      # "the next index"
    assert pool.append_call(auto) == 3
    pool.add_process_reward(sid, 1, 0.25)
    pool.add_process_reward(sid, 1, -1.0)
    got = pool.get_session(sid)
    assert got.session.num_calls == 4 and got.session.domain == "qa"
    assert all(same_call(got.calls[i], calls[i]) for i in (0, 2))
    assert list(got.calls[1].process_rewards) == [0.25, -1.0]
    assert got.calls[3].index == 3 and list(got.calls[3].prompt_ids) == list(auto.prompt_ids)


def test_bad_input_is_a_clear_error_and_leaves_the_pool_unchanged(pool):
    sid = pool.open_session(session_id="live").session_id
    pool.append_call(make_call(sid, 0))
    done = pool.open_session(session_id="done").session_id
    pool.close_session(session_id=done)
    before = snapshot(pool)

    def call(**changes) -> pool_pb2.CallRecord:
        record = make_call(changes.pop("session_id", sid), changes.pop("index", 1))
        for name, value in changes.items():
            record.ClearField(name)
            getattr(record, name).extend(value)
        return record

    cases = [
        (lambda: pool.append_call(call(session_id="nope")), NotFoundError, "unknown session"),
        (lambda: pool.append_call(call(session_id=done, index=0)), ConflictError, "closed"),
        (lambda: pool.append_call(call(index=0)), ConflictError, "already recorded"),
        (lambda: pool.append_call(call(index=5)), ConflictError, "out of order"),
        (lambda: pool.append_call(call(logprobs=[-0.1])), InvalidRequestError, "logprobs for 8"),
        (lambda: pool.append_call(call(weight_versions=[1, 2])), InvalidRequestError, "weight versions for 8"),
        (lambda: pool.append_call(call(prompt_ids=[])), InvalidRequestError, "prompt_ids is empty"),
        (lambda: pool.append_call(call(prompt_ids=[1, -2])), InvalidRequestError, "token ids"),
        (lambda: pool.append_call(call(logprobs=[math.nan] * 8)), InvalidRequestError, "logprobs"),
        (lambda: pool.append_call(call(session_id="")), InvalidRequestError, "session_id is empty"),
        (lambda: pool.open_session(session_id="a\0b"), InvalidRequestError, "NUL"),
        (lambda: pool.open_session(group_id="g" * 300), InvalidRequestError, "at most"),
        (lambda: pool.close_session(session_id="nope"), NotFoundError, "unknown session"),
        (lambda: pool.close_session(session_id=done), ConflictError, "closed"),
        (lambda: pool.close_session(session_id=sid, outcome_rewards={"r": math.inf}), InvalidRequestError, "finite"),
        (lambda: pool.add_process_reward(sid, 9, 1.0), NotFoundError, "no call 9"),
        (lambda: pool.add_process_reward(sid, 0, math.nan), InvalidRequestError, "finite"),
        (lambda: pool.expire_sessions(-1), InvalidRequestError, "idle_s"),
    ]
    for action, error, message in cases:
        with pytest.raises(error, match=message):
            action()
        assert isinstance(error(""), ValueError)
    assert snapshot(pool) == before


def test_expire_closes_idle_sessions_and_groups_that_never_filled(pool):
    idle = pool.open_session(session_id="idle").session_id
    lonely = pool.open_session(session_id="lonely", group_id="g", group_size=3).session_id
    pool.close_session(session_id=lonely)               # the other two sessions of the group never came
    time.sleep(0.2)
    busy = pool.open_session(session_id="busy").session_id
    assert pool.expire_sessions(0.1) == [idle]
    record = pool.get_session(idle).session
    assert record.status == pool_pb2.SESSION_STATUS_FAILED and record.failure_reason == "timeout"
    assert entry_status(pool, 0) == FAILED                # all (one) sessions failed
    assert entry_status(pool, 1) == COMPLETED            # settled with the one session it has
    assert pool.get_session(busy).session.status == pool_pb2.SESSION_STATUS_OPEN
    assert pool.cursor().head == 1 and fetched(pool, 1) == [1]


def test_retention_deletes_only_committed_consumed_records_beyond_the_policy(tmp_path):
    with Pool(tmp_path / "p", keep_consumed=2) as pool:
        ids = singletons(pool, 6)
        for sid in ids:
            pool.append_call(make_call(sid, 0))
            pool.close_session(session_id=sid)
        cursor = pool.consume([0, 1, 2, 3])
        assert pool.stats()["calls_stored"] == 6          # not committed yet: could still be rewound
        pool.commit_cursor(cursor.seq)
        remaining = {e.position for e in pool.entries(0, 10)}
        assert remaining == {2, 3, 4, 5}                 # the last two consumed are kept, unconsumed untouched
        with pytest.raises(NotFoundError):
            pool.get_session(ids[0])
        assert pool.get_session(ids[2]).calls[0].session_id == ids[2]
        stats = pool.stats()
        assert stats["calls_stored"] == stats["sessions_stored"] == 4 and stats["consumed"] == 4


def test_retention_by_age(tmp_path):
    with Pool(tmp_path / "p", keep_consumed_s=0.2) as pool:
        ids = singletons(pool, 3)
        for sid in ids:
            pool.close_session(session_id=sid)
        pool.consume([0], commit=True)
        pool.consume([1], commit=True)
        assert pool.apply_retention() == 0               # younger than 0.2 s
        time.sleep(0.3)
        pool.consume([2])                                # consumed now but not committed: kept
        assert pool.apply_retention() == 2
        assert [e.position for e in pool.entries(0, 10)] == [2]


def test_the_map_grows_past_a_tiny_initial_size(tmp_path):
    with Pool(tmp_path / "p", map_size=64 * 1024) as pool:
        sid = pool.open_session().session_id
        calls = [make_call(sid, i, prompt_len=4000, completion_len=64) for i in range(150)]
        for call in calls:
            pool.append_call(call)
        stats = pool.stats()
        assert stats["map_grows"] >= 3 and stats["map_size"] > 1 << 20
        got = pool.get_session(sid)
        assert len(got.calls) == 150 and all(same_call(a, b) for a, b in zip(got.calls, calls, strict=True))


def test_a_full_pool_refuses_cleanly_and_takes_writes_again_with_a_larger_limit(tmp_path):
    with Pool(tmp_path / "p", map_size=256 * 1024, max_map_size=512 * 1024) as pool:
        sid = pool.open_session().session_id
        index = 0
        with pytest.raises(PoolFullError, match="maximum"):
            while True:
                pool.append_call(make_call(sid, index, prompt_len=4000))
                index += 1
        before = snapshot(pool)
        with pytest.raises(PoolFullError):
            pool.append_call(make_call(sid, index, prompt_len=4000))
        assert snapshot(pool) == before and index > 0
        assert pool.get_session(sid).session.num_calls == index
    with Pool(tmp_path / "p", max_map_size=1 << 30) as pool:
        pool.append_call(make_call(sid, index, prompt_len=4000))
        pool.close_session(session_id=sid)
        assert fetched(pool, 1) == [0] and len(pool.get_session(sid).calls) == index + 1


def test_a_reader_in_the_same_process_shares_the_environment(pool):
    sid = pool.open_session().session_id
    pool.close_session(session_id=sid)
    with PoolReader(pool.path) as reader:
        assert [e.position for e in reader.fetch(4).entries] == [0]
    assert pool.cursor().tail == 1                       # the writer's environment is still open


def test_housekeeping_expires_sessions_and_a_closed_pool_refuses_writes(tmp_path):
    pool = Pool(tmp_path / "p", session_timeout_s=0.1, housekeeping_s=0.05)
    sid = pool.open_session().session_id
    wait_for(lambda: pool.get_session(sid).session.status != pool_pb2.SESSION_STATUS_OPEN, "the session to expire")
    assert pool.get_session(sid).session.failure_reason == "timeout"
    pool.close()
    with pytest.raises(PoolClosedError):
        pool.open_session()
    with pytest.raises(PoolClosedError):
        pool.fetch(1)
    pool.close()                                         # closing twice is harmless


def test_failed_reads_whose_errors_live_on_hold_no_reader_slot(pool):
    """A read that raises (an unknown session) leaves its error's traceback holding the reading frames until the
    garbage collector runs; more of them than LMDB has reader slots must not fill the table (MDB_READERS_FULL)."""
    from forge.pool.store import MAX_READERS

    kept = []
    for i in range(MAX_READERS + 50):
        with pytest.raises(NotFoundError) as raised:
            pool.get_session(f"unknown-{i}")
        kept.append(raised.value)
    pool.open_session(session_id="after")
    assert pool.get_session("after").session.session_id == "after"
    assert pool.store.env.readers().count("\n") <= 2            # the header, and at most the one spare read
