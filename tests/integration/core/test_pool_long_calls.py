"""200,000-token calls in the Data Pool, as a long agent trajectory makes them: written the way the gateway writes
(``AsyncPool`` over an in-process ``Pool``, and over a ``PoolClient`` to a ``forge pool serve`` process on loopback),
each record larger than the pool's whole initial map (which grows), and read back by the learner's batch former
(``WindowedFifo``) into training samples whose token ids, log-probs, weight versions and expert routing are the ones
written. Over gRPC, a batch whose records together exceed one message is taken in several fetches, and an entry that
alone exceeds it is refused with a clear error."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from forge.gateway.async_pool import AsyncPool
from forge.learner.rewards import RewardConfig, batch_rewards
from forge.learner.samples import Sample, build_samples
from forge.pool import InvalidRequestError, Pool, PoolClient, WindowConfig, WindowedFifo, serve_pool
from forge.rpc import ServerOptions
from forge.v1 import common_pb2, pool_pb2

from helpers.processes import Service

PROMPT_TOKENS = 200_000
COMPLETION_TOKENS = 64
TOOL_TOKENS = 136                       # a tool result between the two calls
VOCAB = 151_936                         # Qwen3's: most ids take three bytes as varints
LAYERS, TOP_K, EXPERTS = 2, 2, 8        # the routing record of a small model with experts
INITIAL_MAP = 256 * 1024                # smaller than one record: the map must grow for the first call


def long_calls(session_id: str, seed: int = 0) -> list[pool_pb2.CallRecord]:
    """Two calls of one session: a 200,000-token prompt, then that prompt, its completion and a tool result (the next
    turn); 64 sampled tokens each, the second across a weight swap and with the routing of every position it fed."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, VOCAB, PROMPT_TOKENS).tolist()
    first = pool_pb2.CallRecord(
        session_id=session_id, index=0, prompt_ids=prompt,
        completion_ids=rng.integers(0, VOCAB, COMPLETION_TOKENS).tolist(),
        logprobs=(-rng.exponential(0.5, COMPLETION_TOKENS)).tolist(), weight_versions=[7] * COMPLETION_TOKENS,
        actor="actor-0", finish_reason=common_pb2.FINISH_REASON_STOP,
        sampling=common_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=COMPLETION_TOKENS))
    follow = [*prompt, *first.completion_ids, *rng.integers(0, VOCAB, TOOL_TOKENS).tolist()]
    fed = len(follow) + COMPLETION_TOKENS - 1
    routing = rng.integers(0, EXPERTS, (fed, LAYERS, TOP_K), dtype=np.uint8)
    second = pool_pb2.CallRecord(
        session_id=session_id, index=1, prompt_ids=follow,
        completion_ids=rng.integers(0, VOCAB, COMPLETION_TOKENS).tolist(),
        logprobs=(-rng.exponential(0.5, COMPLETION_TOKENS)).tolist(),
        weight_versions=[7] * 40 + [8] * (COMPLETION_TOKENS - 40), actor="actor-1",
        finish_reason=common_pb2.FINISH_REASON_LENGTH,
        sampling=common_pb2.SamplingParams(temperature=0.7, top_p=0.95, max_tokens=COMPLETION_TOKENS),
        routed_experts=common_pb2.ExpertRouting(layers=LAYERS, top_k=TOP_K, num_experts=EXPERTS,
                                                ids=routing.tobytes()))
    return [first, second]


async def write_as_the_gateway(pool: object, session_id: str, calls: list[pool_pb2.CallRecord]) -> None:
    """What the gateway does for a session of these calls: open it, append each call as it ends, close it."""
    gateway = AsyncPool(pool, threads=2)
    try:
        await gateway.open_session(pool_pb2.OpenSessionRequest(session_id=session_id, task_id="long", domain="swe"))
        for call in calls:
            appended = pool_pb2.CallRecord()
            appended.CopyFrom(call)
            appended.index = -1                        # the gateway appends "the next" call
            assert await gateway.append_call(appended) == call.index
        await gateway.close_session(pool_pb2.CloseSessionRequest(session_id=session_id,
                                                                 outcome_rewards={"correct": 1.0}))
    finally:
        gateway.executor.shutdown(wait=True)           # the pool itself stays open: the caller closes it


def learner_samples(pool: object, groups: int = 1) -> list[Sample]:
    """The samples of the learner's next batch of ``groups`` entries, taken as its trainer takes them."""
    fifo = WindowedFifo(pool, WindowConfig(mode="greedy", batch_groups=groups, min_groups=groups, max_wait_s=0))
    batch = fifo.next_batch()
    assert batch is not None and len(batch.entries) == groups
    return build_samples(batch.entries, batch_rewards(batch.entries, RewardConfig()))


def assert_read_back_exactly(samples: list[Sample], calls: list[pool_pb2.CallRecord]) -> None:
    assert [(s.session_id, s.call_index) for s in samples] == [(c.session_id, c.index) for c in calls]
    for sample, call in zip(samples, calls, strict=True):
        assert sample.prompt_len == len(call.prompt_ids)
        assert sample.tokens == [*call.prompt_ids, *call.completion_ids]
        assert sample.old_logprobs == list(call.logprobs)          # the stored float32 values, bit for bit
        assert sample.versions == list(call.weight_versions)
        assert (sample.temperature, sample.top_p) == (call.sampling.temperature, call.sampling.top_p)
    assert samples[0].routing is None
    expected = np.frombuffer(calls[1].routed_experts.ids, dtype=np.uint8).reshape(-1, LAYERS, TOP_K)
    assert samples[1].routing is not None and np.array_equal(samples[1].routing, expected)


def test_200k_token_calls_written_as_the_gateway_writes_are_read_back_exactly_by_the_learner(tmp_path):
    path = tmp_path / "pool"
    calls = long_calls("long")
    assert calls[0].ByteSize() > 2 * INITIAL_MAP and calls[1].ByteSize() > calls[0].ByteSize()
    with Pool(path, map_size=INITIAL_MAP) as pool:
        asyncio.run(write_as_the_gateway(pool, "long", calls))
        stats = pool.stats()
        assert stats["calls"] == 2 and stats["map_grows"] >= 2 and stats["map_size"] > 4 * INITIAL_MAP
    with Pool(path) as learner:                                 # the learner opens the pool's directory afresh
        assert_read_back_exactly(learner_samples(learner), calls)
        assert learner.cursor().head == 1


def test_200k_token_calls_through_a_pool_server_process(tmp_path):
    """Several gateways and the learner share one ``forge pool serve`` (docs/deploy.md): the calls go over gRPC
    both ways, the records past the initial map of the server's pool."""
    server = Service("pool", "forge", ["pool", "serve", "--path", str(tmp_path / "pool"), "--port", "0",
                                       "--map-size", "64KiB"], tmp_path, timeout_s=60)
    try:
        calls = long_calls("remote", seed=1)
        with PoolClient(server.address, timeout_s=120) as gateway_side:
            asyncio.run(write_as_the_gateway(gateway_side, "remote", calls))
        with PoolClient(server.address, timeout_s=120) as learner_side:
            assert_read_back_exactly(learner_samples(learner_side), calls)
            stats = learner_side.stats()
            assert stats["calls"] == 2 and stats["consumed"] == 1 and stats["map_grows"] >= 4
    finally:
        server.stop()


def test_a_batch_of_long_trajectories_larger_than_one_message_is_taken_in_several_fetches(tmp_path):
    """Eight one-call sessions of 200,000 prompt tokens are about 4.6 MB; with a 4 MiB message limit the learner's
    batch of eight takes them in several fetches, each answer within the limit."""
    limit = 4 * 2**20
    with Pool(tmp_path / "pool") as pool:
        server = serve_pool(pool, ServerOptions(max_message_bytes=limit))
        client = PoolClient(server.address, timeout_s=120)
        try:
            written = []
            for group in range(8):
                call = long_calls(f"s{group}", seed=10 + group)[0]
                session = pool.open_session(session_id=call.session_id, group_id=f"g{group}")
                pool.append_call(call)
                pool.close_session(session_id=session.session_id, outcome_rewards={"correct": 1.0})
                written.append(call)
            whole = pool.fetch(8, include_calls=True)
            assert len(whole.entries) == 8 and whole.ByteSize() > limit           # one answer could not carry it
            first = client.fetch(8, include_calls=True)
            assert 1 <= len(first.entries) < 8 and first.ByteSize() <= limit
            assert [e.position for e in first.entries] == list(range(len(first.entries)))
            assert_read_back_exactly_one_call_each(learner_samples(client, groups=8), written)
            assert pool.cursor().head == 8
        finally:
            client.close()
            server.stop(0)


def assert_read_back_exactly_one_call_each(samples: list[Sample], calls: list[pool_pb2.CallRecord]) -> None:
    assert len(samples) == len(calls)
    for sample, call in zip(samples, calls, strict=True):
        assert (sample.session_id, sample.call_index) == (call.session_id, call.index)
        assert sample.tokens == [*call.prompt_ids, *call.completion_ids] and sample.prompt_len == PROMPT_TOKENS
        assert sample.old_logprobs == list(call.logprobs) and sample.versions == list(call.weight_versions)


def test_an_entry_larger_than_one_message_is_refused_as_such(tmp_path):
    """A session whose calls alone exceed the message limit cannot be fetched over gRPC: INVALID_ARGUMENT with the
    reason (not RESOURCE_EXHAUSTED, which a client reads as a full pool), and the server keeps serving."""
    with Pool(tmp_path / "pool") as pool:
        server = serve_pool(pool, ServerOptions(max_message_bytes=256 * 1024))
        client = PoolClient(server.address, timeout_s=60)
        try:
            pool.open_session(session_id="one")
            pool.append_call(long_calls("one")[0])
            pool.close_session(session_id="one")
            with pytest.raises(grpc.RpcError) as err:
                client.stub.Fetch(pool_pb2.FetchRequest(window=1, include_calls=True), timeout=60)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "queue entry 0 with its calls takes" in err.value.details()
            with pytest.raises(InvalidRequestError, match="more than one response may carry"):
                client.fetch(1, include_calls=True)
            assert [e.position for e in client.fetch(1).entries] == [0]          # headers alone still fit
            assert len(pool.fetch(1, include_calls=True).entries) == 1           # in process: no message limit
        finally:
            client.close()
            server.stop(0)
