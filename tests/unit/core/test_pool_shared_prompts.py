"""How the pool stores a session's prompts (``forge.pool.shared_prompts``): a call whose prompt begins with the
previous call's prompt and completion stores only its new ids, and every reader still gets whole prompts, equal to
what was appended, on random sessions whose agents extend, repeat or rewrite their history; across a reopened pool, a
process reward and the FIFO's fetch."""

from __future__ import annotations

import random
import threading
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.pool import InvalidRequestError, Pool, PoolReader
from forge.pool.shared_prompts import StoredIds, shared_with_previous
from forge.v1 import pool_pb2

from helpers.pool_util import make_call, same_call, stored_prompts, varied_session_calls


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_the_shared_count_is_what_a_naive_comparison_finds(seed):
    """``shared_with_previous`` on the stored chain equals comparing the prompt with the previous call's whole ids."""
    rng = random.Random(seed)
    calls = varied_session_calls(rng, "s", rng.randrange(1, 8))
    chain, whole_before = [], None
    for call in calls:
        prompt = array("i", call.prompt_ids)
        expected = 0
        if whole_before is not None and whole_before and prompt[:len(whole_before)] == whole_before:
            expected = len(whole_before)
        assert shared_with_previous(prompt, len(chain), chain.__getitem__) == expected
        chain.append(StoredIds(expected, prompt[expected:], array("i", call.completion_ids)))
        whole_before = prompt + array("i", call.completion_ids)


def test_readers_get_whole_prompts_and_the_pool_stores_new_ids(tmp_path):
    rng = random.Random(7)
    sessions = {f"s{k}": varied_session_calls(rng, f"s{k}", 12) for k in range(6)}
    with Pool(tmp_path / "pool") as pool:
        for sid, calls in sessions.items():
            pool.open_session(session_id=sid, group_id="g", group_size=len(sessions))
            for call in calls[:6]:
                pool.append_call(call)
    with Pool(tmp_path / "pool") as pool:                  # reopened: the writer reads the stored chain back
        for sid, calls in sessions.items():
            for call in calls[6:]:
                pool.append_call(call)
            pool.add_process_reward(session_id=sid, call_index=5, reward=0.5)
            calls[5].process_rewards.append(0.5)
            got = pool.get_session(sid).calls
            assert len(got) == len(calls) and all(same_call(g, c) for g, c in zip(got, calls, strict=True))
            stored = stored_prompts(pool, sid)
            for k, ((shared, kept), call) in enumerate(zip(stored, calls, strict=True)):
                before = [*calls[k - 1].prompt_ids, *calls[k - 1].completion_ids] if k else []
                extends = bool(before) and list(call.prompt_ids[:len(before)]) == before
                assert shared == (len(before) if extends else 0) and kept == len(call.prompt_ids) - shared
        for sid in sessions:
            pool.close_session(session_id=sid)
    with PoolReader(tmp_path / "pool") as reader:
        [entry] = reader.fetch(window=1, include_calls=True).entries
        for session in entry.sessions:
            calls = sessions[session.session.session_id]
            assert all(same_call(g, c) for g, c in zip(session.calls, calls, strict=True))


def test_a_long_session_stores_each_calls_new_tokens_once(tmp_path):
    """Twenty calls growing a 2,000-token context: the pool holds each id once, not the context at every call."""
    calls = []
    for index in range(20):
        call = make_call("long", index, prompt_len=100, completion_len=50)
        if calls:
            call.prompt_ids[:0] = [*calls[-1].prompt_ids, *calls[-1].completion_ids]
        calls.append(call)
    with Pool(tmp_path / "pool") as pool:
        pool.open_session(session_id="long")
        for call in calls:
            pool.append_call(call)
        assert sum(kept for _, kept in stored_prompts(pool, "long")) == 20 * 100
        assert [list(c.prompt_ids) for c in pool.get_session("long").calls] == [list(c.prompt_ids) for c in calls]


def test_a_client_may_not_send_the_stored_form(tmp_path):
    with Pool(tmp_path / "pool") as pool:
        pool.open_session(session_id="s")
        call = make_call("s", 0)
        call.prompt_shared = 3
        with pytest.raises(InvalidRequestError, match="prompt_shared"):
            pool.append_call(call)


def test_a_prepared_call_holds_every_field_but_its_prompt():
    """The stored payload is the record without its prompt ids, every other field kept (copied field by field)."""
    from forge.pool.sessions import _without_prompt, prepare_call
    from forge.v1 import common_pb2

    record = make_call("s", 2)
    record.process_rewards.extend([0.25, -1.0])
    record.adapter = "run-a"
    expected = pool_pb2.CallRecord()
    expected.CopyFrom(record)
    expected.ClearField("prompt_ids")
    prepared = prepare_call(record, now=5.0)
    assert prepared.payload == expected.SerializeToString()
    assert list(prepared.prompt) == list(record.prompt_ids) and list(prepared.completion) == list(record.completion_ids)
    record.routed_experts.CopyFrom(common_pb2.ExpertRouting(layers=2, top_k=1, num_experts=4, ids=bytes(range(8))))
    expected.routed_experts.CopyFrom(record.routed_experts)
    assert _without_prompt(record) == expected


def test_a_call_is_stored_as_it_was_when_appended(tmp_path):
    """The pool takes what it stores when a call is submitted: a caller that changes its record before the commit
    (the future not yet done) changes nothing stored, whole prompts and shared ones alike."""
    with Pool(tmp_path / "pool") as pool:
        pool.open_session(session_id="s")
        first = make_call("s", 0)
        second = make_call("s", 1)
        second.prompt_ids[:0] = [*first.prompt_ids, *first.completion_ids]
        expected = [pool_pb2.CallRecord(), pool_pb2.CallRecord()]
        for copy, call in zip(expected, (first, second), strict=True):
            copy.CopyFrom(call)
        gate = threading.Event()
        held = pool.writer.submit(lambda tx, state: gate.wait(60))     # the writer waits until the records change
        futures = [pool.append_call_async(call) for call in (first, second)]
        for call in (first, second):
            call.prompt_ids[0] += 1
            call.completion_ids[0] += 1
        gate.set()
        assert held.result(timeout=60) and [f.result(timeout=60) for f in futures] == [0, 1]
        stored = pool.get_session("s").calls
        assert all(same_call(got, want) for got, want in zip(stored, expected, strict=True))
