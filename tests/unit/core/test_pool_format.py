"""How the pool lays out its calls (``forge.pool.layout``, ``forge.pool.migrate``): records keyed in append order fill
their pages however many sessions append at once; a pool written by an older Forge, whose records were keyed by
session, is moved on its first opening for writing and reads back the same; a read-only opening refuses it clearly."""

from __future__ import annotations

import dataclasses
import json
import random

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.pool import Pool, PoolError, PoolReader, layout
from forge.pool.records import PIECE_BYTES, read_record, record_of

from helpers.pool_util import make_call, same_call, varied_session_calls


def _leaf_fill(pool: Pool, db: str) -> float:
    """The share of the database's leaf pages that its keys, values and node headers take."""
    with pool.store.read() as tx:
        held = sum(len(key) + len(value) + 8 for key, value in tx.cursor(db))
        stat = tx.txn.stat(tx.dbs[db])
    assert stat["overflow_pages"] == 0
    return held / (stat["leaf_pages"] * stat["psize"])


def test_records_of_interleaved_sessions_fill_their_pages(tmp_path):
    """Keyed by session, calls that 64 sessions append in turn land at random in the tree and leave pages about two
    thirds full; keyed in append order they fill them."""
    rng = random.Random(3)
    with Pool(tmp_path / "pool") as pool:
        sessions = [pool.open_session().session_id for _ in range(64)]
        counts = dict.fromkeys(sessions, 0)
        for _ in range(64 * 12):
            session = rng.choice(sessions)
            pool.append_call(make_call(session, counts[session], prompt_len=24, completion_len=24))
            counts[session] += 1
        assert _leaf_fill(pool, "records") > 0.9
        assert _leaf_fill(pool, "calls") < 0.85        # what the records' pages would be, keyed by session
        for session in rng.sample(sessions, 8):
            got = pool.get_session(session).calls
            assert [c.index for c in got] == list(range(counts[session]))


def test_records_of_any_length_fill_their_pages_and_read_back(tmp_path):
    """A record is kept in pieces, none in LMDB's overflow pages (a page or more to a value, mostly empty past 2 KB):
    records from a few bytes to many pieces, around piece boundaries, fill their pages and read back whole; a process
    reward added later is the record's next piece."""
    rng = random.Random(5)
    lengths = [1, PIECE_BYTES // 3, *(k * PIECE_BYTES + d for k in (1, 2, 5) for d in (-1, 0, 1)), 3000, 9000, 30_000]
    with Pool(tmp_path / "pool") as pool:
        sessions = [pool.open_session().session_id for _ in range(8)]
        expected: dict[str, list] = {s: [] for s in sessions}
        for _ in range(6):
            for session in sessions:
                # about 6 bytes an id and its log-prob, version and varint: ids of 1 to 5,000 tokens
                tokens = max(1, rng.choice(lengths) // 6)
                call = make_call(session, len(expected[session]), prompt_len=rng.randrange(1, 64),
                                 completion_len=tokens)
                pool.append_call(call)
                expected[session].append(call)
        pool.add_process_reward(sessions[0], 2, 0.75)
        expected[sessions[0]][2].process_rewards.append(0.75)
        for session, calls in expected.items():
            got = pool.get_session(session).calls
            assert len(got) == len(calls)
            for stored, call in zip(got, calls, strict=True):
                assert list(stored.completion_ids) == list(call.completion_ids)
                assert list(stored.logprobs) == pytest.approx(list(call.logprobs), abs=1e-6)
                assert list(stored.process_rewards) == list(call.process_rewards)
        assert _leaf_fill(pool, "records") > 0.85
        with pool.store.read() as tx:
            pieces = tx.count("records")
        assert pieces > 5 * 48                          # long records were cut


def _write_older_format(path, version: int) -> None:
    """Turn the pool at ``path`` back into the layout of formats 1 and 2: each record under its call's key in
    ``calls``, no ``records`` database."""
    env = lmdb.open(str(path), max_dbs=len(layout.DATABASES) + 1)
    with env.begin(write=True) as txn:
        calls, records = env.open_db(b"calls", txn=txn), env.open_db(b"records", txn=txn)
        meta = env.open_db(b"meta", txn=txn)
        for key, number in list(txn.cursor(db=calls)):
            txn.put(key, read_record(txn, records, number), db=calls)
        txn.drop(records, delete=True)
        state = json.loads(txn.get(layout.STATE_KEY, db=meta))
        del state["records"]
        txn.put(layout.STATE_KEY, json.dumps({**state, "version": version}).encode(), db=meta)
    env.close()


@pytest.mark.parametrize("version", [1, 2])
def test_a_pool_of_an_older_format_is_moved_when_opened_for_writing(tmp_path, version):
    rng = random.Random(version)
    path = tmp_path / "pool"
    sessions = {f"s{k}": varied_session_calls(rng, f"s{k}", rng.randrange(1, 9)) for k in range(12)}
    with Pool(path) as pool:
        for session_id in sessions:
            pool.open_session(session_id=session_id)
        pending = {s: list(calls) for s, calls in sessions.items()}
        while pending:                                   # interleaved, as a gateway appends them
            session_id = rng.choice(sorted(pending))
            pool.append_call(pending[session_id].pop(0))
            if not pending[session_id]:
                del pending[session_id]
        pool.add_process_reward("s0", 0, 0.5)
        before = {s: pool.get_session(s) for s in sessions}
    _write_older_format(path, version)

    with pytest.raises(PoolError, match=f"format {version}, written by an older Forge.*open it once for writing"):
        PoolReader(path)
    with Pool(path) as pool:
        state = pool.state()
        assert state.version == layout.FORMAT_VERSION and state.records == sum(map(len, sessions.values()))
        for session_id, expected in before.items():
            assert pool.get_session(session_id) == expected
        with pool.store.read() as tx:
            numbers = [layout.record_number(n) for s in sessions for _, n in tx.call_numbers(s)]
        assert sorted(numbers) == list(range(state.records))

        pool.add_process_reward("s1", 0, -1.0)          # a moved record takes rewards, a session more calls
        last = before["s2"].calls[-1]
        pool.append_call(make_call("s2", last.index + 1))
        assert list(pool.get_session("s1").calls[0].process_rewards) == [-1.0]
        grown = pool.get_session("s2").calls
        assert len(grown) == len(before["s2"].calls) + 1
        assert same_call(grown[-2], last)
        assert pool.state().records == state.records + 1
    with PoolReader(path) as reader:                   # moved once: a read-only opening takes it now
        assert reader.get_session("s0") == before["s0"]


def test_deleting_sessions_deletes_their_records(tmp_path):
    with Pool(tmp_path / "pool", keep_consumed=0) as pool:
        sessions = [pool.open_session().session_id for _ in range(4)]
        for index in range(3):
            for session in sessions:
                pool.append_call(make_call(session, index))
        for session in sessions:
            pool.close_session(session_id=session)
        pool.consume([0, 1], commit=True)
        with pool.store.read() as tx:
            assert tx.count("records") == tx.count("calls") == 6
            kept = {layout.record_number(n) for s in sessions[2:] for _, n in tx.call_numbers(s)}
            assert {layout.record_number(record_of(key)) for key, _ in tx.cursor("records")} == kept


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**63), st.lists(st.text(max_size=40), max_size=5),
       st.lists(st.lists(st.integers(0, 2**31), min_size=2, max_size=2), max_size=4),
       st.floats(allow_nan=False, allow_infinity=False))
def test_the_small_records_are_their_fields_in_json(number, members, previous, when):
    """What the pool writes for its state, entries and consume logs is every field, in order (as ``asdict`` gives),
    changed fields included, and reads back equal."""
    state = layout.PoolState(created_at=when)
    state.records, state.head = number, number // 3
    entry = layout.EntryState(position=number, members=list(members), updated_at=when)
    entry.members.append("late")
    log = layout.ConsumeLog(seq=number, status=layout.CONSUMED, previous=previous, head_after=number)
    for record in (state, entry, log):
        data = record.to_bytes()
        assert data == json.dumps(dataclasses.asdict(record), separators=(",", ":")).encode()
        assert type(record).from_bytes(data) == record
