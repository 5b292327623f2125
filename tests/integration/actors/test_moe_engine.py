"""The torch engine serving Qwen3-MoE with the L3 cache (real forge-cache processes): a prefix fetched from L3 carries
the routing its KV was computed under, and KV fetched without its routing is used with its positions unknown."""

from __future__ import annotations

import random

import numpy
import pytest
import torch

from forge.kv.client import CacheClient
from forge.kvhash import chain_hashes
from forge.model import CausalLM
from forge.model.moe import routing_of
from forge.sampling.params import SamplingParams

from helpers.engines import moe_model, run
from helpers.l3_engines import BLOCK, l3_engine, wait_published
from helpers.processes import start_cache


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return moe_model()


def published(engine, prompt: list[int]) -> list[int]:
    """Serve ``prompt`` on ``engine`` and wait until its full blocks (and their routing) are in L3."""
    run(engine, prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    wait_published(engine, len(prompt) // BLOCK, timeout_s=300)
    return chain_hashes(prompt, BLOCK, engine.salt())


def assert_routes_as_the_model(routed, model, everything: list[int], unknown: int = 0) -> None:
    """``routed`` covers every fed position of ``everything``: the first ``unknown`` unknown (-1), the rest as a
    full forward pass routes them."""
    assert routed is not None and routed.ids.shape[0] == len(everything) - 1
    assert (routed.ids[:unknown] == -1).all() and (routed.ids[unknown:] >= 0).all()
    expected = routing_of(model, everything[:-1])
    assert (numpy.sort(routed.ids[unknown:], -1) == numpy.sort(expected[unknown:], -1)).all()


@pytest.mark.parametrize("speculative", [False, True])
def test_a_prefix_fetched_from_l3_carries_the_routing_its_kv_was_computed_under(model, cache_server, speculative):
    rng = random.Random(11 + speculative)
    prompt = [rng.randrange(100) for _ in range(45)]
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=2)
    model_id = f"moe-l3-{speculative}"
    publisher = l3_engine(model, cache_server.address, speculative, model_id=model_id)
    try:
        published(publisher, prompt)
        assert publisher.stats()["l3_published_routing"] == publisher.stats()["l3_published_blocks"]
    finally:
        publisher.close()
    fetching, fresh = (l3_engine(model, cache_server.address, speculative, model_id=model_id),
                       l3_engine(model, None, speculative, model_id=model_id))
    try:
        tokens, logprobs, _, last = run(fetching, prompt, params)
        want_tokens, want_logprobs, _, _ = run(fresh, prompt, params)
        stats = fetching.stats()
        blocks = (len(prompt) - 1) // BLOCK
        assert stats["l3_fetched_blocks"] == stats["l3_fetched_routing"] == blocks
        assert tokens == want_tokens
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(want_logprobs), atol=1e-5, rtol=0)
        assert_routes_as_the_model(last.routed_experts, model, prompt + tokens)
    finally:
        fetching.close()
        fresh.close()


def test_kv_fetched_without_its_routing_is_used_and_its_positions_are_unknown(model, cache_server, tmp_path):
    """A cache holding a prefix's KV blocks but not their routing blocks (evicted apart, or put by an older actor):
    the KV is fetched and used as ever, and those positions' routing is sent as unknown."""
    rng = random.Random(21)
    prompt = [rng.randrange(100) for _ in range(45)]
    bare = start_cache(tmp_path, "kv-only")
    publisher = l3_engine(model, cache_server.address, model_id="moe-l3-bare")
    try:
        hashes = published(publisher, prompt)
        source, target = CacheClient([cache_server.address]), CacheClient([bare.address])
        try:
            target.put(source.get_prefix(hashes))
        finally:
            source.close()
            target.close()
        fetching = l3_engine(model, bare.address, model_id="moe-l3-bare")
        try:
            tokens, _, _, last = run(fetching, prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
            stats = fetching.stats()
            blocks = (len(prompt) - 1) // BLOCK
            assert stats["l3_fetched_blocks"] == blocks and stats["l3_fetched_routing"] == 0
            assert_routes_as_the_model(last.routed_experts, model, prompt + tokens, unknown=blocks * BLOCK)
        finally:
            fetching.close()
    finally:
        publisher.close()
        bare.stop()
