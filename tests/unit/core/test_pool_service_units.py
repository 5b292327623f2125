"""The Pool gRPC service in process: a client round trip over loopback, and pool errors as status codes with
messages (and back into the same exceptions on the client). (A standalone server process:
integration/test_pool_service.py.)"""

from __future__ import annotations

import grpc
import pytest

from forge.pool import (
    ConflictError,
    CursorConflictError,
    InvalidRequestError,
    NotFoundError,
    Pool,
    PoolClient,
    PoolFullError,
    serve_pool,
)
from forge.v1 import common_pb2, pool_pb2, pool_pb2_grpc

from helpers.pool_util import make_call, same_call


@pytest.fixture
def served(tmp_path):
    pool = Pool(tmp_path / "pool", map_size=256 * 1024, max_map_size=1 << 20)
    server = serve_pool(pool)
    client = PoolClient(server.address, timeout_s=30)
    yield pool, server, client
    client.close()
    server.stop(0)
    pool.close()


def test_client_round_trip(served):
    pool, server, client = served
    assert server.address.startswith("127.0.0.1:")
    a = client.open_session(task_id="t", domain="qa", group_id="g", group_size=2, metadata={"agent": "white"})
    b = client.open_session(pool_pb2.OpenSessionRequest(task_id="t", group_id="g"))
    assert a.queue_position == b.queue_position == 0 and a.metadata["agent"] == "white"
    calls = [make_call(a.session_id, i) for i in range(3)]
    assert [client.append_call(c) for c in calls] == [0, 1, 2]
    client.add_process_reward(a.session_id, 2, 0.5)
    client.close_session(session_id=a.session_id, outcome_rewards={"correct": 1.0}, metrics={"turns": 3})
    assert client.fetch(1).entries == []
    closed = client.close_session(session_id=b.session_id, failed=True, failure_reason="timeout")
    assert closed.status == pool_pb2.SESSION_STATUS_FAILED
    response = client.fetch(4, include_calls=True)
    assert (response.head, response.tail, response.seq) == (0, 1, 0)
    entry = response.entries[0]
    assert entry.status == pool_pb2.ENTRY_STATUS_COMPLETED and len(entry.sessions) == 2
    got = next(s for s in entry.sessions if s.session.session_id == a.session_id)
    assert got.session.outcome_rewards["correct"] == 1.0 and got.session.metrics["turns"] == 3
    assert same_call(got.calls[0], calls[0]) and list(got.calls[2].process_rewards) == [0.5]
    assert same_call(client.get_session(a.session_id).calls[1], calls[1])
    cursor = client.consume([0], expected_seq=response.seq)
    assert (cursor.head, cursor.seq) == (1, 1)
    assert client.cursor() == pool.cursor()
    assert client.rewind(0).head == 0
    assert client.consume([0], commit=True).committed_seq == 1
    assert client.commit_cursor(1).committed_head == 1
    idle = client.open_session().session_id
    assert client.expire_sessions(0.0) == [idle]
    report = client.stats_report()
    assert report.service == "pool" and report.instance == server.address and report.version
    assert report.gauges["calls"] == 3 and report.gauges["head"] == report.gauges["tail"] == 2
    assert report.host.cpu_count >= 1 and "commit_latency_ms_p50" in report.gauges


def test_errors_are_status_codes_with_messages_and_the_same_exceptions_on_the_client(served):
    pool, _server, client = served
    sid = client.open_session().session_id
    client.append_call(make_call(sid, 0))
    stub = pool_pb2_grpc.PoolStub(client.channel)
    bad = make_call(sid, 1)
    del bad.logprobs[1:]
    cases = [
        (stub.AppendCall, make_call("nope", 0), grpc.StatusCode.NOT_FOUND, "unknown session"),
        (stub.AppendCall, bad, grpc.StatusCode.INVALID_ARGUMENT, "1 logprobs for 8"),
        (stub.AppendCall, make_call(sid, 0), grpc.StatusCode.FAILED_PRECONDITION, "already recorded"),
        (stub.CloseSession, pool_pb2.CloseSessionRequest(session_id="nope"), grpc.StatusCode.NOT_FOUND, "unknown"),
        (stub.Fetch, pool_pb2.FetchRequest(window=0), grpc.StatusCode.INVALID_ARGUMENT, "window"),
        (stub.Consume, pool_pb2.ConsumeRequest(positions=[0], expected_seq=5), grpc.StatusCode.ABORTED, "moved"),
        (stub.Consume, pool_pb2.ConsumeRequest(positions=[0]), grpc.StatusCode.FAILED_PRECONDITION, "not complete"),
        (stub.GetSession, pool_pb2.GetSessionRequest(session_id="nope"), grpc.StatusCode.NOT_FOUND, "unknown"),
        (stub.RewindCursor, pool_pb2.RewindCursorRequest(seq=3), grpc.StatusCode.INVALID_ARGUMENT, "rewind"),
    ]
    for method, request, code, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            method(request, timeout=30)
        assert err.value.code() == code and message in err.value.details(), (code, err.value.details())
    with pytest.raises(NotFoundError, match="unknown session"):
        client.append_call(make_call("nope", 0))
    with pytest.raises(InvalidRequestError, match="logprobs"):
        client.append_call(bad)
    with pytest.raises(ConflictError, match="already recorded"):
        client.append_call(make_call(sid, 0))
    with pytest.raises(CursorConflictError):
        client.consume([0], failed=True, expected_seq=9)
    with pytest.raises(PoolFullError, match="full"):      # the map may not grow past 1 MiB
        for index in range(1, 10_000):
            client.append_call(make_call(sid, index, prompt_len=4000))
    assert pool.get_session(sid).session.num_calls == index
    assert stub.Stats(common_pb2.StatsRequest(), timeout=30).gauges["calls"] == index


def test_the_writes_as_futures_give_what_the_calls_give(served):
    """A gateway awaits its writes as futures that hold no thread: they answer what the blocking calls answer, the
    pool's exceptions included, and a service that is gone fails them with the transport's error."""
    pool, server, client = served
    opened = client.open_session_async(pool_pb2.OpenSessionRequest(task_id="t")).result(timeout=30)
    sid = opened.session_id
    calls = [make_call(sid, i) for i in range(3)]
    for call in calls:
        call.index = -1                                 # the next index: they may reach the writer in any order
    futures = [client.append_call_async(call) for call in calls]
    assert sorted(f.result(timeout=30) for f in futures) == [0, 1, 2]
    with pytest.raises(NotFoundError, match="unknown session"):
        client.append_call_async(make_call("nope", 0)).result(timeout=30)
    with pytest.raises(ConflictError, match="already recorded"):
        client.append_call_async(make_call(sid, 0)).result(timeout=30)
    closed = client.close_session_async(pool_pb2.CloseSessionRequest(session_id=sid)).result(timeout=30)
    assert closed.num_calls == 3 and pool.get_session(sid).session.status == pool_pb2.SESSION_STATUS_COMPLETED
    server.stop(0)
    with pytest.raises(grpc.RpcError) as err:
        client.open_session_async(pool_pb2.OpenSessionRequest()).result(timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
