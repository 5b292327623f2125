"""Browsing a pool (forge.pool.browse): filters, pages, transcripts, call rows, and the work a page costs."""

from __future__ import annotations

import json

import pytest

from forge.pool import InvalidRequestError, NotFoundError, PoolReader
from forge.pool.browse import SessionFilter, Work, call_rows, list_sessions, split_messages, transcript

from helpers.browse_pool import MARKUP, record_demo, record_many


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tmp_path_factory.mktemp("browse") / "pool"
    roles = record_demo(path)
    with PoolReader(path) as reader:
        yield path, reader, roles


def _ids(page) -> list[str]:
    return [row["session_id"] for row in page.sessions]


def test_lists_newest_entry_first_with_totals(demo):
    _, reader, _ = demo
    page = list_sessions(reader)
    assert _ids(page) == ["open-0", "web-0", "web-1", "math-0", "math-1", "math-2"]
    assert page.total == 6 and not page.has_more
    assert page.sessions[3]["min_version"] == 1 and page.sessions[3]["max_version"] == 2
    second = list_sessions(reader, page=2, page_size=4)
    assert _ids(second) == ["math-1", "math-2"] and second.total == 6
    assert list_sessions(reader, page=3, page_size=4).sessions == []


@pytest.mark.parametrize(("where", "expected"), [
    (SessionFilter(domain="web"), ["web-0", "web-1"]),
    (SessionFilter(status="failed"), ["web-1"]),
    (SessionFilter(status="open"), ["open-0"]),
    (SessionFilter(min_reward=0.5), ["web-0", "math-0", "math-2"]),
    (SessionFilter(min_reward=0.1, max_reward=0.9), ["web-0"]),
    (SessionFilter(min_version=2), ["web-0", "web-1", "math-0", "math-2"]),
    (SessionFilter(max_version=1), ["math-0", "math-1", "math-2"]),
    (SessionFilter(domain="math", min_version=2, max_reward=1.0), ["math-0", "math-2"]),
    (SessionFilter(domain="nothing"), []),
])
def test_filters(demo, where, expected):
    _, reader, _ = demo
    page = list_sessions(reader, where)
    assert _ids(page) == expected and page.total == len(expected)


@pytest.mark.parametrize("bad", [
    {"status": "done"}, {"min_reward": 2.0, "max_reward": 1.0}, {"min_version": 3, "max_version": 1},
    {"min_reward": float("nan")}, {"max_reward": float("inf")},
])
def test_bad_filters_are_refused(bad):
    with pytest.raises(InvalidRequestError):
        SessionFilter(**bad)


@pytest.mark.parametrize(("page", "size"), [(0, 10), (-1, 10), (10**9, 10), (1, 0), (1, 10**6)])
def test_bad_pages_are_refused(demo, page, size):
    with pytest.raises(InvalidRequestError):
        list_sessions(demo[1], page=page, page_size=size)


def test_transcript_shows_additions_rewrites_and_tokens(demo):
    from forge.checkpoints import tiny_tokenizer

    _, reader, roles = demo
    tok = tiny_tokenizer()
    multi = transcript(reader, roles["multi"], tok.decode, lambda t: tok.decode([t]))
    first, second = multi["calls"]
    assert [m["role"] for m in first["added_messages"]] == ["system", "user", "assistant"]
    assert second["shared_tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    assert second["rewrite"] is None and [m["role"] for m in second["added_messages"]] == ["tool", "assistant"]
    assert second["completion_text"] == "It is 42." and second["process_rewards"] == [0.25]
    assert "".join(second["pieces"]) == "It is 42." and len(second["logprobs"]) == len(second["pieces"])
    rewrite = transcript(reader, roles["rewrite"], tok.decode)["calls"][1]
    assert rewrite["rewrite"]["dropped"] > 0 and rewrite["rewrite"]["kept"] == rewrite["shared_tokens"] > 0
    assert transcript(reader, roles["markup"], tok.decode)["calls"][0]["completion_text"] == MARKUP


@pytest.mark.parametrize("session_id", ["nope", "", "x" * 600, "a\0b"])
def test_unknown_sessions_are_not_found(demo, session_id):
    with pytest.raises(NotFoundError):
        transcript(demo[1], session_id)


def test_split_messages():
    assert split_messages("plain") == [{"role": "", "content": "plain"}]
    assert split_messages("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]


def test_a_page_costs_what_it_shows_not_what_the_pool_holds(tmp_path):
    """The first page of a pool 10 times larger decodes exactly as much; a later unfiltered page skips whole
    entries without decoding them; a filter decodes only until the page is full."""
    costs = {}
    for sessions in (80, 800):
        record_many(tmp_path / str(sessions), sessions)
        with PoolReader(tmp_path / str(sessions)) as reader:
            first, later, filtered = Work(), Work(), Work()
            assert len(list_sessions(reader, page_size=20, work=first).sessions) == 20
            assert len(list_sessions(reader, page=3, page_size=20, work=later).sessions) == 20
            page = list_sessions(reader, SessionFilter(domain="a", min_reward=1.0), page_size=5, work=filtered)
            assert len(page.sessions) == 5 and page.has_more
            costs[sessions] = (first, later, filtered)
    assert costs[80] == costs[800]
    first, later, filtered = costs[800]
    assert (first.entries, first.sessions, first.calls) == (6, 21, 20)    # the 21st: is there more?
    assert (later.sessions, later.calls) == (21, 20)
    assert filtered.sessions <= 6 * 4 and filtered.calls == 5


def test_call_rows(demo):
    _, reader, _ = demo
    rows = list(call_rows(reader, SessionFilter(domain="math")))
    assert [(r["session_id"], r["call_index"]) for r in rows] == [
        ("math-0", 0), ("math-0", 1), ("math-1", 0), ("math-2", 0), ("math-2", 1)]
    assert rows[1]["process_rewards"] == [0.25] and rows[0]["reward"] == 1.0
    assert json.loads(rows[0]["outcome_rewards"]) == {"correct": 1.0} and rows[0]["group_id"] == "math"
