"""The torch engine serves Qwen3-MoE exactly: greedy outputs equal transformers' Qwen3MoeForCausalLM, recorded
log-probs equal a full forward pass with and without prefix hits and MTP speculation, and every request's routing
(the experts of each position it fed, prefix hits included) is what a full forward pass routes. (Prefixes fetched
from the L3 cache: integration/test_moe_engine.py.)"""

from __future__ import annotations

import random

import numpy
import pytest
import torch

from forge.model import CausalLM
from forge.model.moe import routing_of
from forge.sampling.params import SamplingParams

from helpers.engines import (
    MOE_CONFIG,
    assert_concurrent_greedy_equals,
    assert_logprobs_equal_a_full_forward_pass,
    engine_for,
    full_forward_logprobs,
    moe_model,
    run,
    transformers_reference,
)
from helpers.l3_engines import BLOCK, l3_engine
from helpers.random_model import random_model, small_config


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return moe_model()


def random_prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100) for _ in range(rng.randrange(1, 40))] for _ in range(count)]


@pytest.mark.parametrize("speculative", [False, True])
def test_greedy_equals_transformers_and_concurrent_requests_stay_isolated(tmp_path, model, speculative):
    reference, prompts = transformers_reference(tmp_path, model), random_prompts(seed=1, count=8)
    engine = engine_for(model, speculative=speculative)
    try:
        assert_concurrent_greedy_equals(engine, reference, prompts, 16)
        if speculative:
            assert engine.stats()["drafts"] > 0
    finally:
        engine.close()


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True, seed=3),
                                    SamplingParams(temperature=1.2, top_k=10, top_p=0.9, max_tokens=24, seed=4,
                                                   ignore_eos=True)])
def test_recorded_logprobs_equal_a_full_forward_pass_with_and_without_prefix_hits(model, speculative, params):
    assert_logprobs_equal_a_full_forward_pass(model, params, speculative=speculative)


@pytest.mark.parametrize("speculative", [False, True])
def test_the_final_chunk_carries_the_routing_of_every_fed_position(model, speculative):
    engine = engine_for(model, speculative=speculative)
    rng = random.Random(3)
    shared = [rng.randrange(100) for _ in range(30)]
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=5)
    try:
        for attempt in range(3):                # later requests reuse the shared prompt's blocks and their routing
            prompt = shared + [rng.randrange(100) for _ in range(attempt * 3 + 1)]
            tokens, _, _, last = run(engine, prompt, params)
            routed = last.routed_experts
            assert routed is not None and routed.num_experts == MOE_CONFIG.num_experts
            everything = prompt + tokens
            assert routed.ids.shape == (len(everything) - 1, len(MOE_CONFIG.sparse_layers), MOE_CONFIG.num_experts_per_tok)
            expected = routing_of(model, everything[:-1])
            assert (numpy.sort(routed.ids, -1) == numpy.sort(expected, -1)).all(), f"request {attempt}"
        assert engine.blocks.hit_tokens >= 2 * 24
    finally:
        engine.close()


@pytest.mark.skipif(not torch._dynamo.is_dynamo_supported(), reason="torch.compile is unsupported here")
def test_graph_mode_decodes_and_routes_as_a_full_forward_pass(tmp_path, model):
    """The compiled decode step of a model with experts: greedy tokens equal transformers', sampled log-probs a full
    forward pass's, and the final chunk's routing (decoded positions included) what that pass routes."""
    reference, prompts = transformers_reference(tmp_path, model), random_prompts(seed=4, count=6)
    engine = engine_for(model, compile_decode=True, speculative=False)
    try:
        assert_concurrent_greedy_equals(engine, reference, prompts, 12)
        params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=9)
        for prompt in prompts[:2]:
            tokens, logprobs, _, last = run(engine, prompt, params)
            expected = full_forward_logprobs(model, prompt, tokens, params)
            torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(expected), atol=2e-5, rtol=0)
            routed, everything = last.routed_experts, prompt + tokens
            assert routed is not None and routed.ids.shape[0] == len(everything) - 1
            assert (numpy.sort(routed.ids, -1) == numpy.sort(routing_of(model, everything[:-1]), -1)).all()
        assert engine.runner.compiled is not None and engine.runner.compiled.warm
    finally:
        engine.close()


def test_a_dense_model_sends_no_routing():
    dense = random_model(small_config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, num_nextn_predict_layers=0, eos_token_id=100), seed=1)
    engine = engine_for(dense)
    try:
        *_, last = run(engine, [1, 2, 3], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        assert last.routed_experts is None and engine.cache.routing is None
    finally:
        engine.close()


def test_a_malformed_routing_block_leaves_its_positions_unknown(model):
    from forge.kv.blocks import KVBlock
    from forge.kvhash import routing_block_hash

    engine = l3_engine(model, None)
    try:
        connector, shape = engine.connector, (BLOCK, len(MOE_CONFIG.sparse_layers), MOE_CONFIG.num_experts_per_tok)
        name = routing_block_hash(bytes(16))

        def block(ids: numpy.ndarray) -> KVBlock:
            return KVBlock.build(name, BLOCK, str(ids.dtype), ids.shape, ids.tobytes())

        good = numpy.arange(numpy.prod(shape), dtype=numpy.uint8).reshape(shape) % MOE_CONFIG.num_experts
        assert (connector._routing_ids(block(good)).numpy() == good).all()
        assert connector._routing_ids(block(good.astype(numpy.int16))) is None          # another dtype
        assert connector._routing_ids(block(good[:, :1].copy())) is None                # another shape
        assert connector._routing_ids(block(good + MOE_CONFIG.num_experts)) is None         # no such expert
        assert connector._routing_ids(None) is None
    finally:
        engine.close()
