"""The torch engine with the L3 cache (a real ``forge-cache`` process): logits computed with KV fetched from L3
equal a fresh engine's recomputation; KV of another weight version is never used; blocks fetched under a version
the engine no longer runs are dropped; a request's blocks are hashed once, whoever needs their hashes; and two
``forge-actor`` processes share a prompt's blocks through the cache, named by the same hashes the router computes."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from forge import kvhash
from forge.actors.engine.l3 import KVConnector
from forge.kv.blocks import KVBlock
from forge.kv.client import CacheClient
from forge.kvhash import chain_hashes, kv_salt
from forge.model import CausalLM

from helpers.engines import CONFIG, make_model
from helpers.l3_engines import BLOCK, generate, l3_engine, prompt_of, record_logits, wait_published
from helpers.waiting import wait_for


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return make_model(0)


make_engine = l3_engine


@pytest.mark.parametrize("speculative", [False, True])
def test_logits_with_kv_fetched_from_l3_equal_recomputation(model, cache_server, speculative):
    prompt = prompt_of(1 + speculative)
    publisher = make_engine(model, cache_server.address, speculative)
    try:
        generate(publisher, prompt)
        wait_published(publisher, len(prompt) // BLOCK)
    finally:
        publisher.close()
    fetching, fresh = make_engine(model, cache_server.address, speculative), make_engine(model, None, speculative)
    try:
        got, expected = record_logits(fetching), record_logits(fresh)
        out, ref = generate(fetching, prompt), generate(fresh, prompt)
        stats = fetching.stats()
        assert stats["l3_fetched_blocks"] == (len(prompt) - 1) // BLOCK and stats["prefix_hit_rate"] > 0.9
        assert fresh.stats()["prefix_hit_rate"] == 0
        assert out[0] == ref[0]
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(out[1]), torch.tensor(ref[1]), atol=1e-5, rtol=0)
    finally:
        fetching.close()
        fresh.close()


def test_a_block_of_another_weight_version_is_never_used(model, cache_server):
    prompt = prompt_of(3)
    client = CacheClient([cache_server.address])
    shape = (2, CONFIG.num_hidden_layers, BLOCK, CONFIG.num_key_value_heads, CONFIG.head_dim)
    garbage = torch.full(shape, 3.0).numpy().tobytes()
    for version in (4, 5):                 # garbage KV under the hashes of versions 4 and 5 of this prompt
        hashes = chain_hashes(prompt[:-1], BLOCK, kv_salt("l3-test", version, ""))
        assert client.put([KVBlock.build(h, BLOCK, "float32", shape, garbage) for h in hashes]) == (len(hashes), 0)
    reference = make_engine(model)
    expected = generate(reference, prompt)
    reference.close()

    at_v6 = make_engine(model, cache_server.address, version=6)          # weights of version 6: nothing to fetch
    assert generate(at_v6, prompt) == expected and at_v6.stats()["l3_fetched_blocks"] == 0
    assert at_v6.stats()["l3_lookups"] == 1
    at_v6.close()
    at_v5 = make_engine(model, cache_server.address, version=5)          # the control: it does use v5's blocks
    assert generate(at_v5, prompt)[0] != expected[0] and at_v5.stats()["l3_fetched_blocks"] > 0
    at_v5.close()


class SlowClient:
    """A cache client whose lookups wait until released (a weight swap happens meanwhile)."""

    def __init__(self, inner: CacheClient) -> None:
        self.inner = inner
        self.release = threading.Event()
        self.entered = threading.Event()

    def lookup(self, hashes):
        self.entered.set()
        self.release.wait(30)
        return self.inner.lookup(hashes)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_blocks_fetched_for_a_version_the_engine_no_longer_runs_are_dropped(model, cache_server):
    prompt = prompt_of(4)
    publisher = make_engine(model, cache_server.address)
    generate(publisher, prompt)
    wait_published(publisher, len(prompt) // BLOCK)
    publisher.close()
    engine = make_engine(model)
    client = SlowClient(CacheClient([cache_server.address]))
    KVConnector(engine, client, fetch="always")
    try:
        result: list = []
        thread = threading.Thread(target=lambda: result.append(generate(engine, prompt)))
        thread.start()
        assert client.entered.wait(10)
        engine.load_weights(1, {k: v.clone() for k, v in model.state_dict().items()})
        assert engine.wait_for_version(1)
        client.release.set()
        thread.join(30)
        stats = engine.stats()
        assert result and stats["l3_stale_dropped"] == (len(prompt) - 1) // BLOCK and stats["l3_fetched_blocks"] == 0
    finally:
        engine.close()


def test_a_requests_blocks_are_hashed_once_for_the_prefix_and_l3_lookups_and_their_registration(model, cache_server):
    calls = [0]

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is kvhash.block_hash.__code__:
            calls[0] += 1

    threading.setprofile(profile)                  # every thread started from now on: the engine's among them
    try:
        engine = make_engine(model, cache_server.address)
    finally:
        threading.setprofile(None)
    try:
        prompt = prompt_of(30, 9 * BLOCK + 3)
        out, _ = generate(engine, prompt, tokens=12)
        assert engine.stats()["l3_lookups"] == 1 and engine.blocks.lookups == 1
        assert calls[0] == (len(prompt) + len(out) - 1) // BLOCK       # each block computed, once
    finally:
        engine.close()


def test_two_actor_processes_share_a_prompt_through_the_cache_under_the_routers_hashes(tmp_path, cache_server):
    from forge.gateway.routing.fleet import Layout, prompt_hashes
    from forge.rpc import connect
    from forge.v1 import actor_pb2, actor_pb2_grpc, common_pb2, router_pb2, router_pb2_grpc

    from helpers.gateway_procs import start_actor

    extra = ("--l3-cache", cache_server.address, "--l3-fetch", "always")
    actors = [start_actor(tmp_path, f"l3-actor-{i}", *extra) for i in range(2)]
    try:
        prompt = [random.Random(9).randrange(1000) for _ in range(100)]
        request = actor_pb2.GenerateRequest(prompt_ids=prompt, sampling=common_pb2.SamplingParams(
            temperature=0, max_tokens=8, ignore_eos=True))
        outputs, stats = [], []
        for actor in actors:
            channel = connect(actor.address)
            outputs.append([t for c in actor_pb2_grpc.ActorStub(channel).Generate(request, timeout=60)
                            for t in c.token_ids])
            events = router_pb2_grpc.KVEventSourceStub(channel).PollKVEvents(router_pb2.PollKVEventsRequest(),
                                                                              timeout=10)
            layout = Layout.from_proto(events.layout)
            assert events.snapshot and layout.l3 and layout.variant == "mtp" and layout.block_size == 16
            held = {h for e in events.events for h in e.block_hashes}
            assert set(prompt_hashes(prompt, layout)) <= held           # the router's hashes name the actor's blocks
            stub = actor_pb2_grpc.ActorStub(channel)

            def blocks_moved(stub=stub):
                gauges = stub.Stats(common_pb2.StatsRequest(), timeout=10).gauges
                return gauges if gauges["l3_published_blocks"] + gauges["l3_fetched_blocks"] >= 6 else None

            gauges = wait_for(blocks_moved, "the prompt's blocks to be published or fetched")
            stats.append(gauges)
            channel.close()
        assert outputs[0] == outputs[1] and len(outputs[0]) == 8
        assert stats[0]["l3_published_blocks"] >= 6 and stats[1]["l3_fetched_blocks"] == (len(prompt) - 1) // 16
        assert stats[0]["prefill_tokens_per_s"] > 0
    finally:
        for actor in actors:
            actor.stop()
